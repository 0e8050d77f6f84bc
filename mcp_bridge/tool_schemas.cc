// The tools/list entries: names, descriptions, input and output schemas.
#include "mcp_bridge/tool_schemas.h"

#include "worker/examples.h"

namespace onlineps::bridge {

using nlohmann::json;

namespace {

json SessionProperty() {
  return {{"type", "string"},
          {"description",
           "Session handle: context and routing key (letters, digits, . _ : @ -; at most 128). "
           "Optional on a stateful MCP session, whose own id is used when it is absent."},
          {"x-mcp-header", "Session"}};
}

json ContextOutput() {
  return {{"type", "object"},
          {"properties",
           {{"found", {{"type", "boolean"}}},
            {"items", {{"type", "array"}, {"items", {{"type", "string"}}}}},
            {"features", {{"type", "array"}, {"items", {{"type", "number"}}}}},
            {"dropped_items", {{"type", "integer"}}}}},
          {"required", {"found", "items", "features"}}};
}

json FeaturesProperty() { return worker::RequestProperties(/*labelled=*/false)["features"]; }

json Tool(const std::string& name, const std::string& title, const std::string& description,
          json input, json output, bool read_only) {
  input["type"] = "object";
  input["additionalProperties"] = false;
  return {{"name", name},
          {"title", title},
          {"description", description},
          {"inputSchema", input},
          {"outputSchema", output},
          {"annotations", {{"readOnlyHint", read_only}, {"openWorldHint", false}}}};
}

// The input of infer and learn: the session, and the examples by the rule of
// worker/examples.h.
json ExamplesInput(bool labelled) {
  json input = {{"properties", worker::RequestProperties(labelled)}};
  input["properties"]["session"] = SessionProperty();
  input.update(worker::RequestSchemaRule(labelled));
  return input;
}

}  // namespace

json InferTool() {
  json prediction = {
      {"type", "object"},
      {"properties",
       {{"label", {{"type", "string"}}},
        {"index", {{"type", "integer"}}},
        {"scores", {{"type", "object"}, {"additionalProperties", {{"type", "number"}}}}}}},
      {"required", {"label", "index", "scores"}}};
  return Tool(
      "infer", "Predict",
      "Runs the served model on one input (text or features) or a batch (examples) and "
      "returns the predicted label with a score per label. The session's context, if any, "
      "is extra input.",
      ExamplesInput(/*labelled=*/false),
      {{"type", "object"},
       {"properties",
        {{"label", {{"type", "string"}}},
         {"scores", {{"type", "object"}, {"additionalProperties", {{"type", "number"}}}}},
         {"predictions", {{"type", "array"}, {"items", prediction}}},
         {"model_version", {{"type", "integer"}}},
         {"table_versions",
          {{"type", "object"},
           {"description",
            "Per parameter table, per shard: the version of the copy this answer "
            "read (0: no row of that shard read)"},
           {"additionalProperties", {{"type", "array"}, {"items", {{"type", "integer"}}}}}}},
         {"params_age_ms", {{"type", "number"}}},
         {"worker", {{"type", "string"}}}}},
       {"required", {"label", "scores", "predictions", "model_version"}}},
      true);
}

json LearnTool() {
  return Tool(
      "learn", "Teach",
      "Teaches the model with labelled examples: the worker computes gradients and pushes "
      "them to the parameter servers. Returns the model version after the update, the "
      "staleness the servers measured, and whether it was applied, queued or accumulated.",
      ExamplesInput(/*labelled=*/true),
      {{"type", "object"},
       {"properties",
        {{"examples", {{"type", "integer"}}},
         {"applied_examples", {{"type", "integer"}}},
         {"loss", {{"type", "number"}}},
         {"outcome", {{"type", "string"}, {"enum", {"applied", "queued", "accumulated", "mixed"}}}},
         {"model_version", {{"type", "integer"}}},
         {"staleness", {{"type", "integer"}}},
         {"chunks", {{"type", "integer"}}},
         {"worker", {{"type", "string"}}}}},
       {"required", {"examples", "loss", "outcome", "model_version", "staleness"}}},
      false);
}

namespace {

json ContextTool(const std::string& name, const std::string& title, const std::string& d,
                 json props, std::vector<std::string> required, bool read_only) {
  props["session"] = SessionProperty();
  json input = {{"properties", props}};
  if (!required.empty()) input["required"] = required;
  json output = name == "clear_context" ? json{{"type", "object"},
                                               {"properties", {{"cleared", {{"type", "boolean"}}}}},
                                               {"required", {"cleared"}}}
                                        : ContextOutput();
  return Tool(name, title, d, input, output, read_only);
}

}  // namespace

json SetContextTool() {
  return ContextTool(
      "set_context", "Set context",
      "Replaces the session's context: text items and/or features that become extra input "
      "to this session's infer and learn calls. Context never enters the shared model.",
      {{"items", {{"type", "array"}, {"items", {{"type", "string"}}}}},
       {"text", {{"type", "string"}, {"description", "One more item, after items"}}},
       {"features", FeaturesProperty()}},
      {}, false);
}

json AppendContextTool() {
  return ContextTool("append_context", "Append context",
                     "Adds one text item to the session's context (a rolling window: "
                     "the oldest items are dropped past the limits).",
                     {{"text", {{"type", "string"}}}}, {"text"}, false);
}

json ClearContextTool() {
  return ContextTool("clear_context", "Clear context", "Removes the session's context.",
                     json::object(), {}, false);
}

json GetContextTool() {
  return ContextTool("get_context", "Get context", "Returns the session's context.", json::object(),
                     {}, true);
}

json ModelInfoTool() {
  return Tool("model_info", "Model info",
              "Describes the served model: labels, parameter tables, the newest model version "
              "seen, staleness statistics of learn calls, the workers with their session "
              "counts, and under `model` every parameter (trainable table or frozen), the "
              "frozen base's hash and the bytes a learn pushes.",
              json::object(),
              {{"type", "object"},
               {"properties",
                {{"labels", {{"type", "array"}, {"items", {{"type", "string"}}}}},
                 {"tables", {{"type", "array"}}},
                 {"model_version", {{"type", "integer"}}},
                 {"staleness", {{"type", "object"}}},
                 {"workers", {{"type", "array"}}},
                 {"sessions", {{"type", "integer"}}},
                 {"model", {{"type", "object"}}}}},
               {"required", {"labels", "tables", "model_version", "staleness", "workers"}}},
              true);
}

}  // namespace onlineps::bridge
