// worker/examples.h: the one example rule of the bridge and the worker. The parser
// (CheckExamples) and the JSON Schema the bridge advertises must accept and refuse the
// same requests: every request of a generated space is checked against both, with a
// small validator of the JSON Schema keywords the schema uses (one it does not know
// fails the test, so the schema cannot grow past what is checked here).
#include "worker/examples.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace onlineps::worker {
namespace {

using nlohmann::json;

bool HasType(const json& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  // 2020-12: a number with a zero fractional part is an integer (1.0 is).
  if (t == "integer") {
    return v.is_number_integer() ||
           (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
  }
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  ADD_FAILURE() << "unknown type " << t;
  return false;
}

// JSON Schema 2020-12, the keywords the example schema uses.
bool Valid(const json& schema, const json& v) {
  for (const auto& [k, s] : schema.items()) {
    if (k == "description" || k == "x-mcp-header") continue;
    if (k == "type") {
      bool any = false;
      for (const json& t : s.is_array() ? s : json::array({s})) any = any || HasType(v, t);
      if (!any) return false;
    } else if (k == "properties") {
      if (!v.is_object()) continue;
      for (const auto& [name, sub] : s.items()) {
        if (v.contains(name) && !Valid(sub, v[name])) return false;
      }
    } else if (k == "additionalProperties") {
      if (!v.is_object()) continue;
      const json props = schema.value("properties", json::object());
      for (const auto& [name, value] : v.items()) {
        if (props.contains(name)) continue;
        if (s.is_boolean() ? !s.get<bool>() : !Valid(s, value)) return false;
      }
    } else if (k == "required") {
      if (!v.is_object()) continue;
      for (const json& name : s) {
        if (!v.contains(name.get<std::string>())) return false;
      }
    } else if (k == "items") {
      if (!v.is_array()) continue;
      for (const json& e : v) {
        if (!Valid(s, e)) return false;
      }
    } else if (k == "minItems") {
      if (v.is_array() && v.size() < s.get<size_t>()) return false;
    } else if (k == "minimum") {
      if (v.is_number() && v.get<double>() < s.get<double>()) return false;
    } else if (k == "oneOf") {
      int n = 0;
      for (const json& sub : s) n += Valid(sub, v) ? 1 : 0;
      if (n != 1) return false;
    } else if (k == "anyOf") {
      bool any = false;
      for (const json& sub : s) any = any || Valid(sub, v);
      if (!any) return false;
    } else if (k == "not") {
      if (Valid(s, v)) return false;
    } else {
      ADD_FAILURE() << "the schema uses '" << k << "', which this test does not check";
      return false;
    }
  }
  return true;
}

// A request schema as the bridge builds it (mcp_bridge/tool_schemas.cc).
json RequestSchema(bool labelled) {
  json s = {{"type", "object"},
            {"properties", RequestProperties(labelled)},
            {"additionalProperties", false}};
  s.update(RequestSchemaRule(labelled));
  return s;
}

// The parser, with the caller's check of top-level fields (the bridge's, from the
// schema's properties).
bool Parses(const json& request, bool labelled, std::string* why) {
  const json props = RequestProperties(labelled);
  for (const auto& [k, v] : request.items()) {
    if (!props.contains(k)) {
      *why = "unknown argument " + k;
      return false;
    }
  }
  ExampleRule rule;
  rule.labelled = labelled;
  Status st = CheckExamples(request, rule);
  *why = st.ToString();
  return st.ok();
}

// Values of each example field: valid ones first, then wrong types.
const std::vector<json>& Texts() {
  static const std::vector<json> v = {"some words", "", 5, json::array({"a"}), nullptr};
  return v;
}
const std::vector<json>& Features() {
  static const std::vector<json> v = {json::array({1.5, -2, 0}), json::array(),
                                      json::array({1, "x"}), "1,2", json::object()};
  return v;
}
const std::vector<json>& Labels() {
  static const std::vector<json> v = {"positive", 0, 3, -1, 1.5, 2.0, -2.0, true, json::array()};
  return v;
}

// Every object with a subset of {text, features, label, extra}, each field taking each of
// its values (`deep`: all of them; else the first two only).
std::vector<json> Objects(bool deep) {
  std::vector<json> out;
  auto pick = [&](const std::vector<json>& all) {
    std::vector<json> v(all.begin(), all.begin() + (deep ? all.size() : 2));
    v.insert(v.begin(), json());  // absent
    return v;
  };
  for (const json& t : pick(Texts())) {
    for (const json& f : pick(Features())) {
      for (const json& l : pick(Labels())) {
        for (bool extra : {false, true}) {
          json y = json::object();
          if (t != json()) y["text"] = t;
          if (f != json()) y["features"] = f;
          if (l != json()) y["label"] = l;
          if (extra) y["extra"] = 1;
          out.push_back(std::move(y));
        }
      }
    }
  }
  return out;
}

void ExpectAgreement(const json& request, bool labelled, size_t* accepted, size_t* refused) {
  std::string why;
  const bool parses = Parses(request, labelled, &why);
  const bool valid = Valid(RequestSchema(labelled), request);
  EXPECT_EQ(parses, valid) << (labelled ? "learn " : "infer ") << request.dump() << ": parser "
                           << why;
  ++(parses ? *accepted : *refused);
}

TEST(ExamplesTest, SchemaAndParserAgreeOnOneExampleAtTopLevel) {
  for (bool labelled : {false, true}) {
    size_t accepted = 0, refused = 0;
    for (const json& request : Objects(/*deep=*/true)) {
      ExpectAgreement(request, labelled, &accepted, &refused);
    }
    EXPECT_GT(accepted, 2u);  // the space holds both kinds
    EXPECT_GT(refused, 100u);
  }
}

TEST(ExamplesTest, SchemaAndParserAgreeOnExampleArrays) {
  std::vector<json> items = Objects(/*deep=*/true);
  items.push_back(5);
  items.push_back("text");
  for (bool labelled : {false, true}) {
    size_t accepted = 0, refused = 0;
    ExpectAgreement({{"examples", json::array()}}, labelled, &accepted, &refused);
    ExpectAgreement({{"examples", "x"}}, labelled, &accepted, &refused);
    for (const json& item : items) {
      ExpectAgreement({{"examples", {item}}}, labelled, &accepted, &refused);
      // One valid example beside it decides nothing: the array is as good as its worst.
      ExpectAgreement({{"examples", {{{"text", "ok"}, {"label", 1}}, item}}}, labelled, &accepted,
                      &refused);
    }
    // "examples" beside top-level example fields, in every combination.
    for (const json& top : Objects(/*deep=*/false)) {
      json request = top;
      request["examples"] = {{{"text", "ok"}, {"label", 1}}};
      ExpectAgreement(request, labelled, &accepted, &refused);
    }
    EXPECT_GT(accepted, 2u);
    EXPECT_GT(refused, 100u);
  }
}

TEST(ExamplesTest, ErrorsNameTheField) {
  ExampleRule infer;
  infer.top_level = "";
  ExampleRule learn = infer;
  learn.labelled = true;
  struct Case {
    json request;
    const ExampleRule* rule;
    std::string says;
  } cases[] = {
      {{{"text", "a"}, {"features", {1}}}, &infer, "needs exactly one of 'text' or 'features'"},
      {{{"examples", {{{"text", "a"}, {"x", 1}}}}}, &infer, "examples[0] has an unknown field 'x'"},
      {{{"examples", {{{"text", "a"}, {"label", 1}}}}}, &infer, "unknown field 'label'"},
      {{{"examples", {{{"text", "a"}}, {{"text", 3}}}}},
       &infer,
       "examples[1].text must be a string"},
      {{{"features", {1, "x"}}}, &infer, "features[1] is not a finite number"},
      // No values is no input: the text model would learn from nothing.
      {{{"features", json::array()}}, &infer, "features holds no values"},
      {{{"examples", {{{"features", json::array()}, {"label", 0}}}}},
       &learn,
       "examples[0].features holds no values"},
      {{{"features", {1.0, std::nan("")}}}, &infer, "features[1] is not a finite number"},
      // Finite as a double, Inf as the float32 the model reads.
      {{{"features", {3.5e38, 1.0}}}, &infer, "features[0] is not a finite number"},
      {{{"features", {1.0, -1e39}}}, &infer, "features[1] is not a finite number"},
      {{{"examples", {{{"features", {1}}}}}}, &learn, "examples[0] needs a 'label'"},
      {{{"text", "a"}, {"label", -1}},
       &learn,
       "label must be a label name or a non-negative index"},
      {{{"text", "a"}, {"examples", {{{"text", "b"}}}}}, &infer, "not both"},
      {json::object(), &learn, "give 'text', 'features' or 'examples' with a 'label'"},
  };
  for (const Case& c : cases) {
    Status st = CheckExamples(c.request, *c.rule);
    ASSERT_FALSE(st.ok()) << c.request.dump();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.ToString();
  }
}

TEST(ExamplesTest, LimitsAreTooLargeNamingTheFlag) {
  ExampleRule rule;
  rule.limits.max_batch = 2;
  rule.limits.max_text_bytes = 4;
  rule.limits.max_features = 2;
  rule.batch_flag = "--max-examples";
  Status batch =
      CheckExamples({{"examples", {{{"text", "a"}}, {{"text", "b"}}, {{"text", "c"}}}}}, rule);
  EXPECT_EQ(batch.code(), StatusCode::kTooLarge);
  EXPECT_NE(batch.message().find("--max-examples"), std::string::npos) << batch.ToString();
  Status text = CheckExamples({{"text", "abcde"}}, rule);
  EXPECT_EQ(text.code(), StatusCode::kTooLarge);
  EXPECT_NE(text.message().find("request.text"), std::string::npos) << text.ToString();
  Status features =
      CheckExamples({{"features", json::binary({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})}}, rule);
  EXPECT_EQ(features.code(), StatusCode::kTooLarge) << features.ToString();
  size_t words = 0;
  EXPECT_TRUE(
      CheckExamples({{"examples", {{{"text", "a b"}}, {{"text", "c"}}}}}, rule, &words).ok());
  EXPECT_EQ(words, 3u);
}

TEST(ExamplesTest, ExampleArrayKeepsOnlyExampleFields) {
  EXPECT_EQ(ExampleArray({{"session", "s"}, {"text", "a"}, {"label", 1}}),
            json::array({{{"text", "a"}, {"label", 1}}}));
  const json batch = {{"session", "s"}, {"examples", {{{"text", "a"}}}}};
  EXPECT_EQ(ExampleArray(batch), batch["examples"]);
}

}  // namespace
}  // namespace onlineps::worker
