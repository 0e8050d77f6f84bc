#include "common/wire.h"

#include <gtest/gtest.h>

#include <limits>
#include <msgpack.hpp>

#include "common/partition.h"
#include "tests/subprocess.h"

namespace onlineps {
namespace {

TEST(WireTest, RequestRoundTripsEveryField) {
  Header h;
  h.op = Op::kPushSparse;
  h.request_id = 4000000000u;
  h.sender = 0xdeadbeefcafef00dULL;
  h.seq = 77;
  h.table = "emb";
  h.shape = {3, 48};
  h.base_version = 12;
  h.flags = kFlagDelta;
  h.spec = {{"optimizer", "adam"}, {"dim", "16"}};
  std::string bytes = EncodeHeader(h);
  auto d = DecodeHeader(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->op, Op::kPushSparse);
  EXPECT_EQ(d->request_id, 4000000000u);
  EXPECT_EQ(d->sender, h.sender);
  EXPECT_EQ(d->seq, 77u);
  EXPECT_EQ(d->table, "emb");
  EXPECT_EQ(d->shape, (std::vector<uint64_t>{3, 48}));
  EXPECT_EQ(d->base_version, 12u);
  EXPECT_EQ(d->flags, kFlagDelta);
  EXPECT_EQ(d->spec, h.spec);
}

TEST(WireTest, ReplyRoundTripsStatusVersionTau) {
  Header req;
  req.op = Op::kPushDense;
  req.request_id = 9;
  req.table = "w";
  Header r = MakeReply(req, Status(StatusCode::kStale, "tau 9 > bound 4"));
  r.version = 100;
  r.tau = 9;
  std::string bytes = EncodeHeader(r);
  auto d = DecodeHeader(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->op, Op::kReply);
  EXPECT_EQ(d->request_id, 9u);
  EXPECT_EQ(d->version, 100u);
  EXPECT_EQ(d->tau, 9u);
  Status st = ReplyStatus(*d);
  EXPECT_EQ(st.code(), StatusCode::kStale);
  EXPECT_EQ(st.message(), "tau 9 > bound 4");
}

TEST(WireTest, PrimaryHintRoundTripsAndIsOptional) {
  Header req;
  req.op = Op::kPushSparse;
  Header r = MakeReply(req, NotPrimary("not primary; primary is replica 0 (tcp://a:1)"));
  std::string without = EncodeHeader(r);
  auto plain = DecodeHeader(without.data(), without.size());
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->primary.has_value());  // what an older shard's reply decodes to
  r.primary = 0;                             // replica 0 is a real index, not "absent"
  std::string with = EncodeHeader(r);
  EXPECT_GT(with.size(), without.size());
  auto hinted = DecodeHeader(with.data(), with.size());
  ASSERT_TRUE(hinted.ok()) << hinted.status().ToString();
  ASSERT_TRUE(hinted->primary.has_value());
  EXPECT_EQ(*hinted->primary, 0u);
  EXPECT_EQ(hinted->code, StatusCode::kNotPrimary);
}

TEST(WireTest, GarbageIsMalformedNotACrash) {
  const char junk[] = "\xc1\xff\x00garbage";
  auto d = DecodeHeader(junk, sizeof(junk));
  EXPECT_EQ(d.status().code(), StatusCode::kMalformed);
  auto e = DecodeHeader("", 0);
  EXPECT_EQ(e.status().code(), StatusCode::kMalformed);
}

std::string PackMap(const std::map<std::string, msgpack::type::variant>& m) {
  msgpack::sbuffer b;
  msgpack::pack(b, m);
  return std::string(b.data(), b.size());
}

TEST(WireTest, WrongVersionIsRefusedWithBothVersionsNamed) {
  std::string b = PackMap({{"v", uint64_t{99}}, {"op", uint64_t{0}}});
  auto d = DecodeHeader(b.data(), b.size());
  EXPECT_EQ(d.status().code(), StatusCode::kUnsupportedVersion);
  EXPECT_NE(d.status().message().find("99"), std::string::npos);
}

TEST(WireTest, SpecU64TakesOnlyUnsignedDecimalsInRange) {
  EXPECT_EQ(ParseSpecU64("0"), 0u);
  EXPECT_EQ(ParseSpecU64("18446744073709551615"), std::numeric_limits<uint64_t>::max());
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "0x10", "one", "18446744073709551616",
                          "99999999999999999999999"}) {
    EXPECT_FALSE(ParseSpecU64(bad).has_value()) << bad;
  }
}

TEST(WireTest, UnknownOpAndWrongTypesAreNamed) {
  std::string b = PackMap({{"v", uint64_t{1}}, {"op", uint64_t{200}}});
  EXPECT_EQ(DecodeHeader(b.data(), b.size()).status().code(), StatusCode::kUnknownOp);
  std::string c = PackMap({{"v", uint64_t{1}}, {"op", uint64_t{2}}, {"tbl", uint64_t{5}}});
  auto d = DecodeHeader(c.data(), c.size());
  EXPECT_EQ(d.status().code(), StatusCode::kMalformed);
  EXPECT_NE(d.status().message().find("'tbl'"), std::string::npos);
  std::string e = PackMap({{"op", uint64_t{2}}});
  EXPECT_EQ(DecodeHeader(e.data(), e.size()).status().code(), StatusCode::kMalformed);
}

TEST(PartitionTest, KeySpaceEdgesLandOnExactlyOneValidShard) {
  for (uint32_t n : {1u, 2u, 3u, 7u, 64u, 1000u}) {
    for (uint64_t k : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 63, (uint64_t{1} << 63) - 1,
                       UINT64_MAX - 1, UINT64_MAX}) {
      uint32_t s = ShardOfKey(k, n);
      EXPECT_LT(s, n) << "key " << k;
      EXPECT_EQ(s, ShardOfKey(k, n)) << "not deterministic for key " << k;
    }
  }
}

TEST(PartitionTest, SequentialKeysSpreadEvenly) {
  const uint32_t n = 8;
  std::vector<int> count(n, 0);
  const int keys = 80000;
  for (int k = 0; k < keys; ++k) count[ShardOfKey(k, n)]++;
  // Also the top of the key space, where range partitioning loses keys.
  for (int k = 0; k < keys; ++k) count[ShardOfKey(UINT64_MAX - k, n)]++;
  for (int c : count) {
    EXPECT_GT(c, 2 * keys / n * 0.95);
    EXPECT_LT(c, 2 * keys / n * 1.05);
  }
}

TEST(PartitionTest, DenseSlicesCoverTensorExactlyOnceAndUseEveryShard) {
  for (uint64_t total : {1ull, 5ull, 1000ull, 1048576ull + 3}) {
    for (uint32_t n : {1u, 2u, 3u, 5u}) {
      DenseLayout layout("w", total, n, 1024);
      uint64_t next = 0, sum = 0;
      for (const auto& s : layout.slices()) {
        EXPECT_EQ(s.offset, next);
        EXPECT_GT(s.length, 0u);
        EXPECT_LT(s.shard, n);
        next += s.length;
      }
      EXPECT_EQ(next, total);
      for (uint32_t i = 0; i < n; ++i) {
        sum += layout.ElemsOf(i);
        if (total >= n) {
          EXPECT_GT(layout.ElemsOf(i), 0u) << "shard " << i << " unused";
        }
      }
      EXPECT_EQ(sum, total);
    }
  }
}

TEST(WireTest, SplitFrameGroupsSharesFramesInTheCountedGroups) {
  Frames f;
  for (const char* x : {"hdr", "a1", "a2", "b1", "c1", "c2", "c3"})
    f.push_back(Frame::FromString(x));
  auto groups = SplitFrameGroups({2, 1, 3}, f);
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  ASSERT_EQ(groups->size(), 3u);
  EXPECT_EQ((*groups)[0].size(), 2u);
  EXPECT_EQ((*groups)[1].size(), 1u);
  EXPECT_EQ((*groups)[2].size(), 3u);
  EXPECT_EQ((*groups)[1][0].data(), f[3].data()) << "the frames are shared, not copied";
  EXPECT_EQ((*groups)[2][2].data(), f[6].data());
  auto zero = SplitFrameGroups({2, 0, 4}, f);
  EXPECT_EQ(zero.status().code(), StatusCode::kMalformed);
  EXPECT_NE(zero.status().message().find("group of 0"), std::string::npos);
  auto short_by_one = SplitFrameGroups({2, 1, 4}, f);
  EXPECT_EQ(short_by_one.status().code(), StatusCode::kMalformed);
  EXPECT_NE(
      short_by_one.status().message().find("counts 7 frames after the header, the message has 6"),
      std::string::npos)
      << short_by_one.status().ToString();
  EXPECT_FALSE(SplitFrameGroups({1}, Frames{}).ok());
  // Counts whose sum wraps past 2^64 to the frame count (a hostile or broken peer): they
  // once passed, and the split built a group from a reversed range (length_error).
  auto wrapped = SplitFrameGroups({~uint64_t{0}, 7}, f);
  EXPECT_EQ(wrapped.status().code(), StatusCode::kMalformed) << wrapped.status().ToString();
}

// A deeply nested value under an unknown key is skipped, not a crash.
TEST(WireTest, ADeeplyNestedUnknownFieldIsHandled) {
  std::string b = "\x83\xa1v\x01\xa2op\x00\xa1x";
  b = std::string("\x83\xa1v\x01\xa2op", 7) + std::string(1, '\0') + "\xa1x";
  b += std::string(1000000, '\x91');
  b += std::string(1, '\0');
  auto h = DecodeHeader(b.data(), b.size());
  EXPECT_TRUE(h.ok() || h.status().code() == StatusCode::kMalformed);
}

// Arrays nested under an unknown key, each claiming as many elements as bytes are left
// after it: msgpack allocates a count's elements as it reads the count, so every level
// held 24 bytes per frame byte (a 1 MiB frame: +827 MiB; 4 MiB: 3 GiB, then bad_alloc),
// before the bad byte at the end was read. Any peer can send it to any shard or worker.
TEST(WireTest, ANestOfArraysClaimingTheFrameIsRefusedBeforeItIsAllocated) {
  const size_t size = 512 << 10;
  std::string b = std::string("\x83\xa1v\x01\xa2op", 7) + std::string(1, '\0') + "\xa1x";
  while (b.size() + 5 < size) {
    const uint32_t n = static_cast<uint32_t>(size - b.size() - 5);
    for (const uint8_t c :
         {uint8_t{0xdd}, static_cast<uint8_t>(n >> 24), static_cast<uint8_t>(n >> 16),
          static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)}) {
      b += static_cast<char>(c);
    }
  }
  b.resize(size, '\xc1');
  const int64_t before = testing::PeakRss(/*reset=*/true);
  auto h = DecodeHeader(b.data(), b.size());
  const int64_t peak = testing::PeakRss(/*reset=*/false);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kMalformed) << h.status().ToString();
  // Refused by the depth or by the claims, whichever the scan meets first.
  EXPECT_TRUE(h.status().message().find("nests deeper") != std::string::npos ||
              h.status().message().find("claim more elements") != std::string::npos)
      << h.status().ToString();
  if (before < 0 || peak < 0) GTEST_SKIP() << "no VmHWM";
  EXPECT_LT(peak - before, int64_t{32} << 20) << "peak above the RSS before the decode";
}

// The same within the depth limit: 12 arrays, each claiming the bytes left after it, sum
// to 12 x the frame's size in elements, which msgpack would allocate (24 bytes each).
TEST(WireTest, ArraysClaimingMoreElementsThanTheFrameHoldsAreRefusedBeforeAllocation) {
  const size_t size = 512 << 10;
  std::string b = std::string("\x83\xa1v\x01\xa2op", 7) + std::string(1, '\0') + "\xa1x";
  for (int level = 0; level < 12; ++level) {
    const uint32_t n = static_cast<uint32_t>(size - b.size() - 5);
    for (const uint8_t c :
         {uint8_t{0xdd}, static_cast<uint8_t>(n >> 24), static_cast<uint8_t>(n >> 16),
          static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)}) {
      b += static_cast<char>(c);
    }
  }
  b.resize(size, '\xc0');  // nils: valid elements, far fewer than claimed
  const int64_t before = testing::PeakRss(/*reset=*/true);
  auto h = DecodeHeader(b.data(), b.size());
  const int64_t peak = testing::PeakRss(/*reset=*/false);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kMalformed) << h.status().ToString();
  EXPECT_NE(h.status().message().find("claim more elements"), std::string::npos)
      << h.status().ToString();
  if (before < 0 || peak < 0) GTEST_SKIP() << "no VmHWM";
  EXPECT_LT(peak - before, int64_t{32} << 20) << "peak above the RSS before the decode";
}

}  // namespace
}  // namespace onlineps
