// Per-request limits of the worker RPC (worker/request_limits.h): each is refused with
// TOO_LARGE naming the limit and its flag, before the request's texts are copied or
// tokenized, and a request at every limit at once is accepted. Torch-free.
#include "worker/request_limits.h"

#include <gtest/gtest.h>

#include <random>

#include "worker/body_scan.h"
#include "worker/model.h"
#include "worker/worker_rpc.h"

namespace onlineps::worker {
namespace {

using nlohmann::json;

const std::vector<std::string> kLabels = {"negative", "positive"};

RequestLimits Small() {
  RequestLimits l;
  l.max_request_bytes = 1 << 20;
  l.max_batch = 4;
  l.max_text_bytes = 64;
  l.max_tokens = 20;
  l.max_features = 8;
  return l;
}

void ExpectTooLarge(const Status& st, const std::string& flag, const std::string& field = "") {
  EXPECT_EQ(st.code(), StatusCode::kTooLarge) << st.ToString();
  EXPECT_NE(st.message().find("(" + flag + ")"), std::string::npos) << st.ToString();
  if (!field.empty()) {
    EXPECT_NE(st.message().find(field), std::string::npos) << st.ToString();
  }
}

TEST(RequestLimitsTest, CountWordsCountsTheModelsWords) {
  std::mt19937_64 rng(7);
  const std::string alphabet = "ab Z9 ,.\t\n-_\xc3\xa9\xff\x01";
  std::vector<std::string> texts = {"",         " ",          "a",      "a b",
                                    "  a  b  ", "don't stop", "x1y2 z", "caf\xc3\xa9 au lait",
                                    "\xff\xfe", "a\0b"};
  for (int i = 0; i < 200; ++i) {
    std::string t(rng() % 40, ' ');
    for (char& c : t) c = alphabet[rng() % alphabet.size()];
    texts.push_back(t);
  }
  for (const std::string& t : texts) {
    EXPECT_EQ(CountWords(t), TextFeatureKeys(t, /*bigrams=*/false).size()) << t;
  }
}

TEST(RequestLimitsTest, EachLimitIsRefusedNamingItsFlag) {
  const RequestLimits l = Small();
  ExpectTooLarge(CheckRequestBytes((1 << 20) + 1, l), "--max-request-bytes", "1048577 bytes");
  ExpectTooLarge(CheckBatchSize(5, l), "--max-batch", "5 examples");
  ExpectTooLarge(CheckBatchSize(5, l, "--max-examples"), "--max-examples");
  ExpectTooLarge(CheckTextBytes(65, "examples[2].text", l), "--max-text-bytes",
                 "examples[2].text is 65 bytes");
  ExpectTooLarge(CheckFeatureCount(9, "examples[0].features", l), "--max-features",
                 "examples[0].features has 9 values");
  ExpectTooLarge(CheckTokens(21, l), "--max-tokens", "have 21 words");
  EXPECT_TRUE(CheckRequestBytes(1 << 20, l).ok());
  EXPECT_TRUE(CheckBatchSize(4, l).ok());
  EXPECT_TRUE(CheckTextBytes(64, "t", l).ok());
  EXPECT_TRUE(CheckFeatureCount(8, "f", l).ok());
  EXPECT_TRUE(CheckTokens(20, l).ok());
}

TEST(RequestLimitsTest, ExamplesOfRefusesOverLimitRequestsAndKeepsTheirTexts) {
  const RequestLimits l = Small();
  const std::string long_text(65, 'a');  // one word, 65 bytes
  struct Case {
    json body;
    std::string flag, field;
  };
  const std::vector<Case> cases = {
      {{{"examples", json::array({{{"text", "a"}},
                                  {{"text", "b"}},
                                  {{"text", "c"}},
                                  {{"text", "d"}},
                                  {{"text", "e"}}})}},
       "--max-batch",
       "5 examples"},
      {{{"examples", json::array({{{"text", "ok"}}, {{"text", long_text}}})}},
       "--max-text-bytes",
       "examples[1].text is 65 bytes"},
      {{{"text", long_text}}, "--max-text-bytes", "request.text"},
      // 11 + 10 words: each text is short enough, together they are too many.
      {{{"examples",
         json::array({{{"text", "a b c d e f g h i j k"}}, {{"text", "a b c d e f g h i j"}}})}},
       "--max-tokens",
       "21 words"},
      {{{"examples", json::array({{{"features", std::vector<float>(9, 1.0f)}}})}},
       "--max-features",
       "examples[0].features has 9 values"},
      {{{"features", json::binary(std::vector<uint8_t>(9 * sizeof(float)))}},
       "--max-features",
       "has 9 values"},
  };
  for (const Case& c : cases) {
    json body = c.body;
    auto r = ExamplesOf(body, kLabels, /*need_labels=*/false, l);
    ASSERT_FALSE(r.ok()) << c.body.dump();
    ExpectTooLarge(r.status(), c.flag, c.field);
    EXPECT_EQ(body, c.body) << "a refused request is left as it was";
  }
}

TEST(RequestLimitsTest, ARequestAtEveryLimitAtOnceIsAccepted) {
  const RequestLimits l = Small();
  // 4 examples (the batch limit): two texts of 64 bytes and 10 words each (20 words in
  // all), and two of 8 features. An example has text or features, never both
  // (worker/examples.h).
  const std::string text = "aaaaa bbbbb ccccc ddddd eeeee fffff ggggg hhhhh iiiii jjjjjjjjjj";
  ASSERT_EQ(text.size(), 64u);
  ASSERT_EQ(CountWords(text), 10u);
  json examples = json::array();
  for (int i = 0; i < 2; ++i) examples.push_back({{"text", text}, {"label", 1}});
  for (int i = 0; i < 2; ++i) {
    examples.push_back({{"features", std::vector<float>(8, 0.5f)}, {"label", 1}});
  }
  json body = {{"examples", examples}};
  auto r = ExamplesOf(body, kLabels, /*need_labels=*/true, l);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[1].text, text);
  EXPECT_EQ((*r)[3].features.size(), 8u);
  EXPECT_EQ((*r)[3].label, 1);
}

// A body's DOM can be many times its size: 1-byte empty maps each become a heap-allocated
// map. DecodeBody counts values first and refuses before building the DOM.
TEST(RequestLimitsTest, DecodeBodyRefusesMoreValuesThanTheLimitsAllow) {
  const RequestLimits l = Small();  // others: 16 x 4 + 256 = 320; numbers: 5 x 9 = 45
  auto body_with = [](uint8_t element, size_t n) {
    std::string b =
        "\x81\xa8"
        "examples";       // {"examples": [n x element]}
    b.push_back('\xdd');  // array 32
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>((n >> s) & 0xff));
    b.append(n, static_cast<char>(element));
    return b;
  };
  for (const auto& [element, n, flag] : std::vector<std::tuple<uint8_t, size_t, std::string>>{
           {0x80, 1000000, "--max-batch"},  // empty maps
           {0xa0, 1000000, "--max-batch"},  // empty strings
           {0x01, 1000000, "--max-features"}}) {
    const std::string b = body_with(element, n);
    auto r = DecodeBody(b.data(), b.size(), l);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kTooLarge) << r.status().ToString();
    EXPECT_NE(r.status().message().find(flag), std::string::npos) << r.status().ToString();
  }
  // At the counts: decoded (the map, its key and the array are 3 of the 320).
  const std::string ok = body_with(0x80, 317);
  auto r = DecodeBody(ok.data(), ok.size(), l);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["examples"].size(), 317u);
  const std::string map_more = body_with(0x80, 318);
  EXPECT_EQ(DecodeBody(map_more.data(), map_more.size(), l).status().code(), StatusCode::kTooLarge);
  const std::string numbers = body_with(0x01, 45);
  EXPECT_TRUE(DecodeBody(numbers.data(), numbers.size(), l).ok());
  const std::string one_more = body_with(0x01, 46);
  EXPECT_EQ(DecodeBody(one_more.data(), one_more.size(), l).status().code(), StatusCode::kTooLarge);
}

// A string longer than --max-text-bytes anywhere in a body is refused with its place
// named, before anything is decoded (an 8 MiB text is not copied even once).
TEST(RequestLimitsTest, ScanBodyNamesTheLongStringsPlace) {
  const RequestLimits l = Small();
  const std::string long_text(65, 'a');
  struct Case {
    json body;
    std::string where;
  };
  const std::vector<Case> cases = {
      {{{"examples", json::array({{{"text", "ok"}}, {{"label", 1}, {"text", long_text}}})}},
       "examples[1].text is 65 bytes"},
      {{{"session", "s"}, {"items", {"a", "b", long_text}}}, "items[2] is 65 bytes"},
      {{{"text", long_text}}, "text is 65 bytes"},
      {{{long_text, 1}}, "a key of body is 65 bytes"},
      {{{"examples", {{{long_text, 1}}}}}, "a key of examples[0] is 65 bytes"},
  };
  for (const Case& c : cases) {
    const std::vector<uint8_t> b = json::to_msgpack(c.body);
    const Status st = ScanBody(b.data(), b.size(), l);
    ExpectTooLarge(st, "--max-text-bytes", c.where);
    ExpectTooLarge(DecodeBody(b.data(), b.size(), l).status(), "--max-text-bytes", c.where);
  }
}

// What ScanBody counts, counted on the decoded value.
void CountValues(const json& j, uint64_t* numbers, uint64_t* others) {
  if (j.is_number()) {
    ++*numbers;
    return;
  }
  ++*others;
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      ++*others;
      CountValues(v, numbers, others);
    }
  } else if (j.is_array()) {
    for (const json& v : j) CountValues(v, numbers, others);
  }
}

json RandomValue(std::mt19937_64& rng, int depth) {
  switch (rng() % (depth > 4 ? 5 : 8)) {
    case 0:
      return static_cast<int64_t>(rng() % 300) - 100;
    case 1:
      return static_cast<double>(rng() % 1000) / 7;
    case 2:
      return std::string(rng() % 40, 'x');
    case 3:
      return rng() % 2 == 0;
    case 4:
      return json::binary(std::vector<uint8_t>(rng() % 9, 1));
    case 5:
    case 6: {
      json a = json::array();
      for (size_t n = rng() % 20; n > 0; --n) a.push_back(RandomValue(rng, depth + 1));
      return a;
    }
    default: {
      json m = json::object();
      for (size_t n = rng() % 6; n > 0; --n)
        m["k" + std::to_string(rng() % 300)] = RandomValue(rng, depth + 1);
      return m;
    }
  }
}

// ScanBody counts exactly what decoding builds: a body is refused iff it has more
// numbers or other values than the limits allow, whatever its msgpack encodings.
TEST(RequestLimitsTest, ScanBodyCountsExactlyWhatTheDecoderBuilds) {
  std::mt19937_64 rng(18);
  int tight = 0;
  for (int round = 0; round < 300; ++round) {
    json body = json::object();
    for (size_t n = rng() % 8; n > 0; --n) body["f" + std::to_string(n)] = RandomValue(rng, 1);
    uint64_t numbers = 0, others = 0;
    CountValues(body, &numbers, &others);
    const std::vector<uint8_t> b = json::to_msgpack(body);
    // Limits just at and just below the counts, through max_batch and max_features.
    RequestLimits at;
    at.max_text_bytes = 1 << 20;
    at.max_batch = others > 256 ? (others - 256 + 15) / 16 : 0;
    at.max_features = numbers / (at.max_batch + 1) + 1;
    ASSERT_GE(at.MaxBodyOtherValues(), others);
    ASSERT_GE(at.MaxBodyNumbers(), numbers);
    EXPECT_TRUE(ScanBody(b.data(), b.size(), at).ok()) << body.dump();
    // One fewer than the counts allow, where the limits' granularity can say so.
    if (others > 256 + 16) {
      RequestLimits fewer = at;
      fewer.max_batch = (others - 257) / 16;  // 16 x max_batch + 256 < others
      fewer.max_features = 1 << 20;
      EXPECT_EQ(ScanBody(b.data(), b.size(), fewer).code(), StatusCode::kTooLarge);
      ++tight;
    }
    // Truncated bodies are left to the decoder, never read past their end.
    for (size_t cut : {b.size() / 2, b.size() - 1}) {
      EXPECT_TRUE(ScanBody(b.data(), cut, at).ok());
    }
  }
  EXPECT_GT(tight, 20);
}

}  // namespace
}  // namespace onlineps::worker
