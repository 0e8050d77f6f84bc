// The tools/list entries: names, descriptions, input and output schemas.
#include "mcp_bridge/tool_schemas.h"

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

json FeaturesProperty() {
  return {{"type", "array"},
          {"items", {{"type", "number"}}},
          {"description", "Dense input features (the mlp model)"}};
}

json ExampleSchema(bool labelled) {
  json p = {{"text", {{"type", "string"}, {"description", "Input text (the text model)"}}},
            {"features", FeaturesProperty()}};
  if (labelled) {
    p["label"] = {{"type", {"string", "integer"}},
                  {"description", "A label name of the model, or its index"}};
  }
  json s = {{"type", "object"}, {"properties", p}, {"additionalProperties", false}};
  if (labelled) s["required"] = {"label"};
  return s;
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
      {{"properties",
        {{"session", SessionProperty()},
         {"text", {{"type", "string"}, {"description", "One input text"}}},
         {"features", FeaturesProperty()},
         {"examples", {{"type", "array"}, {"minItems", 1}, {"items", ExampleSchema(false)}}}}}},
      {{"type", "object"},
       {"properties",
        {{"label", {{"type", "string"}}},
         {"scores", {{"type", "object"}, {"additionalProperties", {{"type", "number"}}}}},
         {"predictions", {{"type", "array"}, {"items", prediction}}},
         {"model_version", {{"type", "integer"}}},
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
      {{"properties",
        {{"session", SessionProperty()},
         {"examples", {{"type", "array"}, {"minItems", 1}, {"items", ExampleSchema(true)}}},
         {"text", {{"type", "string"}, {"description", "One example's text (with label)"}}},
         {"features", FeaturesProperty()},
         {"label", {{"type", {"string", "integer"}}, {"description", "One example's label"}}}}}},
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

json ToolList() {
  json tools = json::array();
  tools.push_back(InferTool());
  tools.push_back(LearnTool());
  tools.push_back(ContextTool(
      "set_context", "Set context",
      "Replaces the session's context: text items and/or features that become extra input "
      "to this session's infer and learn calls. Context never enters the shared model.",
      {{"items", {{"type", "array"}, {"items", {{"type", "string"}}}}},
       {"text", {{"type", "string"}, {"description", "One more item, after items"}}},
       {"features", FeaturesProperty()}},
      {}, false));
  tools.push_back(ContextTool("append_context", "Append context",
                              "Adds one text item to the session's context (a rolling window: "
                              "the oldest items are dropped past the limits).",
                              {{"text", {{"type", "string"}}}}, {"text"}, false));
  tools.push_back(ContextTool("clear_context", "Clear context", "Removes the session's context.",
                              json::object(), {}, false));
  tools.push_back(ContextTool("get_context", "Get context", "Returns the session's context.",
                              json::object(), {}, true));
  tools.push_back(
      Tool("model_info", "Model info",
           "Describes the served model: labels, parameter tables, the newest model version seen, "
           "staleness statistics of learn calls, and the workers with their session counts.",
           json::object(),
           {{"type", "object"},
            {"properties",
             {{"labels", {{"type", "array"}, {"items", {{"type", "string"}}}}},
              {"tables", {{"type", "array"}}},
              {"model_version", {{"type", "integer"}}},
              {"staleness", {{"type", "object"}}},
              {"workers", {{"type", "array"}}},
              {"sessions", {{"type", "integer"}}}}},
            {"required", {"labels", "tables", "model_version", "staleness", "workers"}}},
           true));
  return tools;
}

}  // namespace onlineps::bridge
