#include "worker/examples.h"

#include <cmath>

namespace onlineps::worker {

using nlohmann::json;

namespace {

constexpr const char* kExampleFields[] = {"text", "features", "label"};

Status Invalid(std::string message) { return InvalidArgument(std::move(message)); }

bool HasExampleField(const json& request) {
  for (const char* f : kExampleFields) {
    if (request.contains(f)) return true;
  }
  return false;
}

Status CheckFeatures(const json& f, const std::string& where, const RequestLimits& limits) {
  // No values is no input: a model would run (and a learn move its output layer) on
  // nothing.
  if (f.is_binary()) {  // the worker's msgpack wire: little-endian float32
    const size_t bytes = f.get_binary().size();
    if (bytes % sizeof(float) != 0) {
      return Invalid(where + " binary is " + std::to_string(bytes) +
                     " bytes, not a whole number of float32 values");
    }
    if (bytes == 0) return Invalid(where + " holds no values");
    return CheckFeatureCount(bytes / sizeof(float), where, limits);
  }
  if (!f.is_array()) return Invalid(where + " must be an array of numbers");
  if (f.empty()) return Invalid(where + " holds no values");
  ONLINEPS_RETURN_IF_ERROR(CheckFeatureCount(f.size(), where, limits));
  if (std::string m = NonFiniteFeature(f, where); !m.empty()) return Invalid(m);
  return Status::Ok();
}

}  // namespace

std::string NonFiniteFeature(const json& f, const std::string& where) {
  for (size_t i = 0; i < f.size(); ++i) {
    if (!f[i].is_number() || !std::isfinite(static_cast<float>(f[i].get<double>()))) {
      return where + "[" + std::to_string(i) + "] is not a finite number (within float32's range)";
    }
  }
  return "";
}

std::optional<int64_t> LabelIndex(const json& v) {
  if (v.is_number_unsigned() || v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) return std::nullopt;
    return i >= 0 ? std::optional<int64_t>(i) : std::nullopt;
  }
  // JSON Schema's integer: 1.0 is one (Python clients send it).
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= 0 && d <= 9007199254740992.0 && d == std::floor(d)) return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

namespace {

// One example. `where` names it in messages ("examples[3]"); for the top-level example
// rule.top_level, and `top` is set: then fields other than the example's are not its.
Status CheckExample(const json& e, const std::string& where, bool top, const ExampleRule& rule,
                    size_t* words) {
  auto field = [&](const std::string& f) { return where.empty() ? f : where + "." + f; };
  const std::string self = where.empty() ? "the call" : where;
  if (!e.is_object()) return Invalid(self + " must be an object");
  if (!top) {
    for (const auto& [k, v] : e.items()) {
      if (k != "text" && k != "features" && !(rule.labelled && k == "label")) {
        return Invalid(self + " has an unknown field '" + k + "'");
      }
    }
  } else if (!rule.labelled && e.contains("label")) {
    return Invalid(self + " has an unknown field 'label'");
  }
  const bool text = e.contains("text"), features = e.contains("features");
  if (text == features) return Invalid(self + " needs exactly one of 'text' or 'features'");
  if (text) {
    if (!e["text"].is_string()) return Invalid(field("text") + " must be a string");
    const std::string& s = e["text"].get_ref<const std::string&>();
    ONLINEPS_RETURN_IF_ERROR(CheckTextBytes(s.size(), field("text"), rule.limits));
    if (words) *words += CountWords(s);
  } else {
    ONLINEPS_RETURN_IF_ERROR(CheckFeatures(e["features"], field("features"), rule.limits));
  }
  if (rule.labelled) {
    if (!e.contains("label")) return Invalid(self + " needs a 'label'");
    const json& l = e["label"];
    if (!l.is_string() && !LabelIndex(l)) {
      return Invalid(field("label") + " must be a label name or a non-negative index");
    }
  }
  return Status::Ok();
}

json TextProperty(const char* description) {
  return {{"type", "string"}, {"description", description}};
}

json FeaturesProperty() {
  return {{"type", "array"},
          {"items", {{"type", "number"}}},
          {"minItems", 1},
          {"description", "Dense input features (the mlp model)"}};
}

json LabelProperty(const char* description) {
  return {{"type", {"string", "integer"}}, {"minimum", 0}, {"description", description}};
}

json Required(const char* name) { return {{"required", {name}}}; }

// Exactly one of text and features, and a label when labelled.
json OneExample(bool labelled) {
  json s = {{"oneOf", {Required("text"), Required("features")}}};
  if (labelled) s["required"] = {"label"};
  return s;
}

}  // namespace

Status CheckExamples(const json& request, const ExampleRule& rule, size_t* words) {
  if (!request.is_object()) return Invalid("the request must be an object");
  const auto it = request.find("examples");
  if (it == request.end()) {
    if (!request.contains("text") && !request.contains("features")) {
      return Invalid(std::string("give 'text', 'features' or 'examples'") +
                     (rule.labelled ? " with a 'label'" : ""));
    }
    return CheckExample(request, rule.top_level, /*top=*/true, rule, words);
  }
  if (HasExampleField(request)) {
    return Invalid("give either 'examples' or one example (text/features), not both");
  }
  if (!it->is_array() || it->empty()) return Invalid("'examples' must be a non-empty array");
  if (Status st = CheckBatchSize(it->size(), rule.limits, rule.batch_flag); !st.ok()) {
    return Status(st.code(), "'examples': " + st.message());
  }
  for (size_t i = 0; i < it->size(); ++i) {
    ONLINEPS_RETURN_IF_ERROR(CheckExample((*it)[i], "examples[" + std::to_string(i) + "]",
                                          /*top=*/false, rule, words));
  }
  return Status::Ok();
}

std::vector<json*> ExamplesIn(json& request) {
  std::vector<json*> out;
  const auto it = request.find("examples");
  if (it == request.end()) {
    out.push_back(&request);
    return out;
  }
  for (json& e : *it) out.push_back(&e);
  return out;
}

json ExampleArray(const json& request) {
  if (const auto it = request.find("examples"); it != request.end()) return *it;
  json one = json::object();
  for (const char* f : kExampleFields) {
    if (request.contains(f)) one[f] = request[f];
  }
  return json::array({std::move(one)});
}

json ExampleSchema(bool labelled) {
  json p = {{"text", TextProperty("Input text (the text model)")},
            {"features", FeaturesProperty()}};
  if (labelled) p["label"] = LabelProperty("A label name of the model, or its index");
  json s = {{"type", "object"}, {"properties", p}, {"additionalProperties", false}};
  s.update(OneExample(labelled));
  return s;
}

json RequestProperties(bool labelled) {
  json p = {{"text", TextProperty(labelled ? "One example's text (with label)" : "One input text")},
            {"features", FeaturesProperty()},
            {"examples", {{"type", "array"}, {"minItems", 1}, {"items", ExampleSchema(labelled)}}}};
  if (labelled) p["label"] = LabelProperty("One example's label");
  return p;
}

json RequestSchemaRule(bool labelled) {
  json examples_only = {
      {"required", {"examples"}},
      {"not", {{"anyOf", {Required("text"), Required("features"), Required("label")}}}}};
  json one = OneExample(labelled);
  one["not"] = Required("examples");
  return {{"oneOf", {std::move(examples_only), std::move(one)}}};
}

}  // namespace onlineps::worker
