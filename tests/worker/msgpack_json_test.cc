// MsgpackToJson against nlohmann::json::from_msgpack (strict), the decoder it replaces:
// the same value for every valid body, random ones included; refused where that one
// refuses; clear errors for what a peer could send wrong.
#include "worker/msgpack_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/subprocess.h"

namespace onlineps::worker {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// The same JSON types throughout (signed or unsigned integers included), not only equal
// values.
bool SameTypes(const json& a, const json& b) {
  if (a.type() != b.type() || a.size() != b.size()) return false;
  if (a.is_array()) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!SameTypes(a[i], b[i])) return false;
    }
  }
  if (a.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (!b.contains(it.key()) || !SameTypes(it.value(), b[it.key()])) return false;
    }
  }
  return true;
}

json Reference(const std::vector<uint8_t>& b) {
  return json::from_msgpack(b.begin(), b.end(), /*strict=*/true, /*allow_exceptions=*/false);
}

json Random(std::mt19937_64& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  switch (pick(depth > 3 ? 7 : 9)) {
    case 0:
      return nullptr;
    case 1:
      return pick(2) == 1;
    case 2:
      return static_cast<int64_t>(rng()) >> pick(64);  // signed, any width
    case 3:
      return static_cast<uint64_t>(rng() >> pick(64));  // unsigned
    case 4:
      return std::ldexp(static_cast<double>(rng() % 100000) - 50000, pick(40) - 20);
    case 5: {
      std::string s(pick(3) == 0 ? 300 : pick(40), 'x');
      for (char& c : s) c = static_cast<char>('a' + pick(26));
      return s;
    }
    case 6: {
      // Features as float32 bytes, of the sizes of bin8, bin16 and bin32.
      const size_t n = std::vector<size_t>{0, 12, 3136, 70000}[pick(4)];
      std::vector<uint8_t> bytes(n);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      return json::binary(std::move(bytes));
    }
    case 7: {
      json a = json::array();
      for (int i = pick(pick(5) == 0 ? 20 : 4); i > 0; --i) a.push_back(Random(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int i = pick(6); i > 0; --i) o["k" + std::to_string(pick(50))] = Random(rng, depth + 1);
      return o;
    }
  }
}

TEST(MsgpackJsonTest, SameValueAsFromMsgpackForRandomBodies) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const json v = Random(rng, 0);
    const std::vector<uint8_t> b = json::to_msgpack(v);
    auto got = MsgpackToJson(b.data(), b.size());
    ASSERT_TRUE(got.ok()) << got.status().ToString() << " for " << v.dump();
    EXPECT_EQ(*got, Reference(b)) << v.dump();
    EXPECT_TRUE(SameTypes(*got, Reference(b))) << v.dump();
    EXPECT_EQ(*got, v) << v.dump();
  }
}

TEST(MsgpackJsonTest, ForeignEncodingsDecodeAsFromMsgpackDoes) {
  const std::vector<std::vector<uint8_t>> bodies = {
      {0xd0, 0x05},                                            // int8 holding a positive value
      {0xd1, 0xff, 0x00},                                      // int16 -256
      {0xcc, 0xff},                                            // uint8 255
      {0xca, 0x3f, 0xc0, 0x00, 0x00},                          // float32 1.5
      {0xcb, 0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18},  // float64 pi
      {0xd9, 0x02, 'h', 'i'},                                  // str8
      {0xc4, 0x03, 1, 2, 3},                                   // bin8
      {0xd4, 0x07, 0xaa},                                      // fixext1, type 7
      {0x82, 0xa1, 'a', 0x01, 0xa1, 'a', 0x02},                // a repeated key: the last wins
      {0xdc, 0x00, 0x02, 0xc0, 0xc3},                          // array16 [nil, true]
  };
  for (const auto& b : bodies) {
    auto got = MsgpackToJson(b.data(), b.size());
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const json want = Reference(b);
    ASSERT_FALSE(want.is_discarded());
    EXPECT_EQ(*got, want) << want.dump();
    EXPECT_TRUE(SameTypes(*got, want)) << want.dump();
    if (want.is_binary()) {
      EXPECT_EQ(got->get_binary().has_subtype(), want.get_binary().has_subtype());
      EXPECT_EQ(got->get_binary().subtype(), want.get_binary().subtype());
    }
  }
}

TEST(MsgpackJsonTest, BadBytesAreMalformedNamingTheProblem) {
  struct Case {
    std::vector<uint8_t> bytes;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{}, "0 bytes"},
      {{0x01, 0x02}, "1 bytes after"},                        // two values
      {{0x92, 0x01}, "not valid msgpack"},                    // an array cut short
      {{0xc4, 0x10, 1, 2}, "not valid msgpack"},              // a bin cut short
      {{0xc1}, "byte 0xc1 at offset 0"},                      // a byte msgpack never uses
      {{0x81, 0x01, 0x02}, "is not a string"},                // {1: 2}
      {{0xdd, 0xff, 0xff, 0xff, 0xff}, "not valid msgpack"},  // claims 4 G elements
  };
  for (const Case& c : cases) {
    auto got = MsgpackToJson(c.bytes.data(), c.bytes.size());
    ASSERT_FALSE(got.ok()) << c.says;
    EXPECT_EQ(got.status().code(), StatusCode::kMalformed);
    EXPECT_THAT(got.status().message(), HasSubstr(c.says));
    if (!c.bytes.empty()) {
      EXPECT_TRUE(Reference(c.bytes).is_discarded()) << c.says;
    }
  }
  // Nesting past the bound is refused, not recursed into.
  std::vector<uint8_t> deep(100, 0x91);
  deep.push_back(0xc0);
  auto got = MsgpackToJson(deep.data(), deep.size(), 64);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kMalformed);
}

TEST(MsgpackJsonTest, MutatedBodiesDecodeOnlyWhereFromMsgpackDoesAndToTheSameValue) {
  std::mt19937_64 rng(11);
  int both = 0;
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> b = json::to_msgpack(Random(rng, 0));
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      b[rng() % b.size()] = static_cast<uint8_t>(rng());
    }
    const json want = Reference(b);
    auto got = MsgpackToJson(b.data(), b.size());
    ASSERT_EQ(got.ok(), !want.is_discarded()) << (got.ok() ? "" : got.status().ToString());
    if (got.ok()) {
      EXPECT_EQ(*got, want);
      EXPECT_TRUE(SameTypes(*got, want));
      ++both;
    }
  }
  EXPECT_GT(both, 100);  // mutations that kept a valid body were compared too
}

TEST(MsgpackJsonTest, CountsTheBytesCannotBackAllocateNothingAhead) {
  // 64 nested arrays, each claiming as many elements as bytes are left after it, then a
  // byte msgpack never uses: each count passes the "a byte per element" check, and an
  // array allocated for its count up front held 64 x 16 bytes per body byte (a 16 MiB
  // request: 16 GiB) before the bad byte was read.
  const size_t size = 512 << 10;
  std::vector<uint8_t> b;
  for (int level = 0; level < 64; ++level) {
    const uint32_t n = static_cast<uint32_t>(size - b.size() - 5);
    b.insert(b.end(), {0xdd, static_cast<uint8_t>(n >> 24), static_cast<uint8_t>(n >> 16),
                       static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)});
  }
  b.resize(size, 0xc1);
  const int64_t before = testing::PeakRss(/*reset=*/true);
  auto got = MsgpackToJson(b.data(), b.size(), 64);
  const int64_t peak = testing::PeakRss(/*reset=*/false);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("0xc1"));
  if (before < 0 || peak < 0) GTEST_SKIP() << "no VmHWM";
  EXPECT_LT(peak - before, int64_t{32} << 20) << "peak above the RSS before the decode";
}

}  // namespace
}  // namespace onlineps::worker
