// Each fixture as its conformance scenario describes it (test_simple_text,
// test://static-text, test_simple_prompt, ...). Everything here but the pending client
// requests is immutable, so the handlers are thread-safe.
#include "testing/mcp_fixtures/conformance_fixtures.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "testing/mcp_fixtures/client_requests.h"

namespace onlineps::testing {
namespace {

using bridge::CallContext;
using bridge::kInvalidParams;
using bridge::Outcome;
using bridge::Revisions;
using nlohmann::json;

// What a fixture tool sees of its call.
struct FixtureContext {
  // Sends a notification on this request's stream (null when it has none).
  std::function<void(const json&)> notify;
  json progress_token;       // null when the request asked for no progress
  std::string log_level;     // the session's logging/setLevel level; "" when unset
  json client_capabilities;  // from initialize (legacy) or _meta (stateless)
  // Sends a request to the client on this request's stream and waits for its response.
  std::function<StatusOr<json>(const std::string& method, const json& params)> ask_client;
};

using FixtureReply = Outcome;

// A 1x1 red RGBA PNG.
constexpr char kPngBase64[] =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJg"
    "gg==";
// A WAV file: 8 samples of 16-bit mono PCM at 8 kHz.
constexpr char kWavBase64[] =
    "UklGRjQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YRAAAAAAAOgD0AfoAwAAGPww+Bj8";
constexpr char kLogger[] = "onlineps-fixtures";
constexpr auto kStepPause = std::chrono::milliseconds(50);
// Caching hints (2026-07-28) on list and read results: the fixture data never changes.
constexpr int64_t kTtlMs = 3600 * 1000;

void Pause() { std::this_thread::sleep_for(kStepPause); }

json Text(const std::string& text) { return {{"type", "text"}, {"text", text}}; }
json Image() { return {{"type", "image"}, {"data", kPngBase64}, {"mimeType", "image/png"}}; }
json Ok(json content) { return {{"content", std::move(content)}}; }
json ToolError(const std::string& message) {
  return {{"content", {Text(message)}}, {"isError", true}};
}
json Cacheable(json result) {
  result["ttlMs"] = kTtlMs;
  result["cacheScope"] = "public";
  return result;
}

FixtureReply Reply(json result) { return Outcome::Ok(std::move(result)); }
FixtureReply InvalidParams(const std::string& message, json data = nullptr) {
  return Outcome::Error(kInvalidParams, message, std::move(data));
}

json ObjectSchema(json properties = json::object(), json required = json::array()) {
  json s = {{"type", "object"}, {"properties", std::move(properties)}};
  if (!required.empty()) s["required"] = std::move(required);
  return s;
}

// Whether a message at `level` passes the session's logging/setLevel threshold. No
// threshold set: nothing is sent.
bool LogLevelAllows(const std::string& threshold, const std::string& level) {
  static const std::vector<std::string> kOrder = {"debug", "info",     "notice", "warning",
                                                  "error", "critical", "alert",  "emergency"};
  auto rank = [](const std::string& l) {
    for (size_t i = 0; i < kOrder.size(); ++i) {
      if (kOrder[i] == l) return static_cast<int>(i);
    }
    return -1;
  };
  return rank(threshold) >= 0 && rank(level) >= rank(threshold);
}

std::string StringArg(const json& args, const char* name) {
  auto it = args.find(name);
  return it != args.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// ---- tools ----------------------------------------------------------------------------

// Sends `method` to the client when it declared `capability`; the client's result or why
// not.
StatusOr<json> AskClient(const FixtureContext& ctx, const std::string& capability,
                         const std::string& method, const json& params) {
  if (!ctx.client_capabilities.is_object() || !ctx.client_capabilities.contains(capability)) {
    return FailedPrecondition("the client did not declare the '" + capability + "' capability");
  }
  if (!ctx.ask_client) return Unavailable("no way to reach the client");
  return ctx.ask_client(method, params);
}

// Asks for an elicitation and reports "<prefix>action=..., content={...}".
json Elicit(const FixtureContext& ctx, const std::string& message, json schema,
            const std::string& prefix) {
  StatusOr<json> r = AskClient(ctx, "elicitation", "elicitation/create",
                               {{"message", message}, {"requestedSchema", std::move(schema)}});
  if (!r.ok()) return ToolError("elicitation failed: " + r.status().message());
  const std::string action = r->value("action", std::string("?"));
  return Ok({Text(prefix + "action=" + action +
                  ", content=" + r->value("content", json::object()).dump())});
}

json SimpleText(const json&, const FixtureContext&) {
  return Ok({Text("This is a simple text response for testing.")});
}

json ImageContent(const json&, const FixtureContext&) { return Ok({Image()}); }

json AudioContent(const json&, const FixtureContext&) {
  return Ok({{{"type", "audio"}, {"data", kWavBase64}, {"mimeType", "audio/wav"}}});
}

json EmbeddedResource(const json&, const FixtureContext&) {
  return Ok({{{"type", "resource"},
              {"resource",
               {{"uri", "test://embedded-resource"},
                {"mimeType", "text/plain"},
                {"text", "This is an embedded resource content."}}}}});
}

json MultipleContentTypes(const json&, const FixtureContext&) {
  return Ok({Text("Multiple content types test:"),
             Image(),
             {{"type", "resource"},
              {"resource",
               {{"uri", "test://mixed-content-resource"},
                {"mimeType", "application/json"},
                {"text", json({{"test", "data"}, {"value", 123}}).dump()}}}}});
}

// Three info messages, ~50 ms apart, each sent only when the session's level allows.
json WithLogging(const json&, const FixtureContext& ctx) {
  const char* steps[] = {"Tool execution started", "Tool processing data",
                         "Tool execution completed"};
  int sent = 0;
  for (int i = 0; i < 3; ++i) {
    if (i > 0) Pause();
    if (ctx.notify && LogLevelAllows(ctx.log_level, "info")) {
      ctx.notify({{"jsonrpc", "2.0"},
                  {"method", "notifications/message"},
                  {"params", {{"level", "info"}, {"logger", kLogger}, {"data", steps[i]}}}});
      ++sent;
    }
  }
  return Ok({Text("Tool with logging executed successfully (" + std::to_string(sent) +
                  " log messages sent)")});
}

json ErrorHandling(const json&, const FixtureContext&) {
  return ToolError("This tool intentionally returns an error for testing");
}

// Progress 0/100, 50/100, 100/100, ~50 ms apart, when the request gave a progressToken.
json WithProgress(const json&, const FixtureContext& ctx) {
  const bool report =
      ctx.notify && (ctx.progress_token.is_string() || ctx.progress_token.is_number_integer());
  for (int p = 0; p <= 100; p += 50) {
    if (p > 0) Pause();
    if (report) {
      ctx.notify(
          {{"jsonrpc", "2.0"},
           {"method", "notifications/progress"},
           {"params", {{"progressToken", ctx.progress_token}, {"progress", p}, {"total", 100}}}});
    }
  }
  return Ok({Text("Tool with progress executed successfully")});
}

// The text of a CreateMessageResult (content is one block or, since 2025-11-25, a list).
std::string SampledText(const json& result) {
  json content = result.value("content", json());
  if (content.is_array() && !content.empty()) content = content[0];
  if (content.is_object() && content.value("type", json()) == "text") {
    return content.value("text", std::string());
  }
  return content.dump();
}

json Sampling(const json& args, const FixtureContext& ctx) {
  const std::string prompt = StringArg(args, "prompt");
  if (prompt.empty()) return ToolError("arguments.prompt (a string) is required");
  StatusOr<json> r = AskClient(
      ctx, "sampling", "sampling/createMessage",
      {{"messages", {{{"role", "user"}, {"content", Text(prompt)}}}}, {"maxTokens", 100}});
  if (!r.ok()) return ToolError("sampling failed: " + r.status().message());
  return Ok({Text("LLM response: " + SampledText(*r))});
}

json Elicitation(const json& args, const FixtureContext& ctx) {
  const std::string message = StringArg(args, "message");
  if (message.empty()) return ToolError("arguments.message (a string) is required");
  json schema =
      ObjectSchema({{"username", {{"type", "string"}, {"description", "User's response"}}},
                    {"email", {{"type", "string"}, {"description", "User's email address"}}}},
                   {"username", "email"});
  return Elicit(ctx, message, std::move(schema), "User response: ");
}

// SEP-1034: a default for every primitive type.
json ElicitationDefaults(const json&, const FixtureContext& ctx) {
  json schema = ObjectSchema({
      {"name", {{"type", "string"}, {"description", "User name"}, {"default", "John Doe"}}},
      {"age", {{"type", "integer"}, {"description", "User age"}, {"default", 30}}},
      {"score", {{"type", "number"}, {"description", "User score"}, {"default", 95.5}}},
      {"status",
       {{"type", "string"},
        {"description", "User status"},
        {"enum", {"active", "inactive", "pending"}},
        {"default", "active"}}},
      {"verified",
       {{"type", "boolean"}, {"description", "Verification status"}, {"default", true}}},
  });
  return Elicit(ctx, "Please review and update the form fields with defaults", std::move(schema),
                "Elicitation completed: ");
}

json Titled(const char* prefix, const char* const (&titles)[3]) {
  json out = json::array();
  for (int i = 0; i < 3; ++i) {
    out.push_back({{"const", std::string(prefix) + std::to_string(i + 1)}, {"title", titles[i]}});
  }
  return out;
}

// SEP-1330: the five enum shapes.
json ElicitationEnums(const json&, const FixtureContext& ctx) {
  static const char* const kOptions[] = {"First Option", "Second Option", "Third Option"};
  static const char* const kChoices[] = {"First Choice", "Second Choice", "Third Choice"};
  const json untitled = {"option1", "option2", "option3"};
  json schema = ObjectSchema({
      {"untitledSingle", {{"type", "string"}, {"description", "Pick one"}, {"enum", untitled}}},
      {"titledSingle",
       {{"type", "string"}, {"description", "Pick one"}, {"oneOf", Titled("value", kOptions)}}},
      {"legacyEnum",
       {{"type", "string"},
        {"description", "Pick one (deprecated enumNames)"},
        {"enum", {"opt1", "opt2", "opt3"}},
        {"enumNames", {"Option One", "Option Two", "Option Three"}}}},
      {"untitledMulti",
       {{"type", "array"},
        {"description", "Pick any"},
        {"items", {{"type", "string"}, {"enum", untitled}}}}},
      {"titledMulti",
       {{"type", "array"},
        {"description", "Pick any"},
        {"items", {{"anyOf", Titled("value", kChoices)}}}}},
  });
  return Elicit(ctx, "Please choose from the enum fields", std::move(schema),
                "Elicitation completed: ");
}

// SEP-2575: asks through ctx.ask_client, which reaches the client only on a 2025 session
// stream; a 2026-07-28 response stream must carry notifications only.
json StreamingElicitation(const json&, const FixtureContext& ctx) {
  return Elicit(ctx, "Please confirm", ObjectSchema({{"ok", {{"type", "boolean"}}}}, {"ok"}),
                "Elicitation completed: ");
}

json JsonSchema2020(const json& args, const FixtureContext&) {
  return Ok({Text("Received: " + args.dump())});
}

json NoArgs() { return ObjectSchema(); }
json PromptArg() {
  return ObjectSchema(
      {{"prompt", {{"type", "string"}, {"description", "The prompt to send to the LLM"}}}},
      {"prompt"});
}
json MessageArg() {
  return ObjectSchema(
      {{"message", {{"type", "string"}, {"description", "The message to show the user"}}}},
      {"message"});
}
// Exactly the schema of the json-schema-2020-12 scenario.
json Schema2020() {
  return {
      {"$schema", "https://json-schema.org/draft/2020-12/schema"},
      {"type", "object"},
      {"$defs",
       {{"address",
         {{"$anchor", "addressDef"},
          {"type", "object"},
          {"properties", {{"street", {{"type", "string"}}}, {"city", {{"type", "string"}}}}}}}}},
      {"properties",
       {{"name", {{"type", "string"}}},
        {"address", {{"$ref", "#/$defs/address"}}},
        {"contactMethod", {{"type", "string"}, {"enum", {"phone", "email"}}}},
        {"phone", {{"type", "string"}}},
        {"email", {{"type", "string"}}}}},
      {"allOf", {{{"anyOf", {{{"required", {"phone"}}}, {{"required", {"email"}}}}}}}},
      {"if",
       {{"properties", {{"contactMethod", {{"const", "phone"}}}}},
        {"required", {"contactMethod"}}}},
      {"then", {{"required", {"phone"}}}},
      {"else", {{"required", {"email"}}}},
      {"additionalProperties", false},
  };
}

struct FixtureTool {
  const char* name;
  const char* description;
  json (*input_schema)();
  bool streams;  // sends notifications or asks the client
  json (*call)(const json& arguments, const FixtureContext& ctx);
};

const std::vector<FixtureTool>& ToolTable() {
  static const std::vector<FixtureTool> kTools = {
      {"test_simple_text", "Conformance fixture: returns simple text", NoArgs, false, SimpleText},
      {"test_image_content", "Conformance fixture: returns a PNG image", NoArgs, false,
       ImageContent},
      {"test_audio_content", "Conformance fixture: returns WAV audio", NoArgs, false, AudioContent},
      {"test_embedded_resource", "Conformance fixture: returns an embedded resource", NoArgs, false,
       EmbeddedResource},
      {"test_multiple_content_types", "Conformance fixture: returns text, image and resource",
       NoArgs, false, MultipleContentTypes},
      {"test_tool_with_logging", "Conformance fixture: sends three info log messages", NoArgs, true,
       WithLogging},
      {"test_logging_tool",
       "Conformance fixture (SEP-2575): logs only at the level the request allows", NoArgs, true,
       WithLogging},
      {"test_error_handling", "Conformance fixture: always fails with isError", NoArgs, false,
       ErrorHandling},
      {"test_tool_with_progress", "Conformance fixture: reports progress 0, 50, 100 of 100", NoArgs,
       true, WithProgress},
      {"test_sampling", "Conformance fixture: asks the client for sampling/createMessage",
       PromptArg, true, Sampling},
      {"test_elicitation", "Conformance fixture: asks the client for elicitation/create",
       MessageArg, true, Elicitation},
      {"test_elicitation_sep1034_defaults",
       "Conformance fixture: elicitation with defaults for every primitive type (SEP-1034)", NoArgs,
       true, ElicitationDefaults},
      {"test_elicitation_sep1330_enums",
       "Conformance fixture: elicitation with the five enum schema shapes (SEP-1330)", NoArgs, true,
       ElicitationEnums},
      {"test_streaming_elicitation",
       "Conformance fixture (SEP-2575): asks for elicitation, which a 2026-07-28 response "
       "stream never carries",
       NoArgs, true, StreamingElicitation},
      {"json_schema_2020_12_tool", "Tool with JSON Schema 2020-12 features", Schema2020, false,
       JsonSchema2020},
  };
  return kTools;
}

// ---- resources ------------------------------------------------------------------------

struct FixtureResource {
  const char* uri;
  const char* name;
  const char* description;
  const char* mime_type;
  const char* text;  // null: blob
  const char* blob;
};

constexpr FixtureResource kResources[] = {
    {"test://static-text", "static-text", "A static text resource", "text/plain",
     "This is the content of the static text resource.", nullptr},
    {"test://static-binary", "static-binary", "A static binary resource (1x1 PNG)", "image/png",
     nullptr, kPngBase64},
    {"test://watched-resource", "watched-resource", "A resource to subscribe to", "text/plain",
     "Watched resource content", nullptr},
};
constexpr char kTemplatePrefix[] = "test://template/";
constexpr char kTemplateSuffix[] = "/data";

json ResourceContents(const FixtureResource& r) {
  json c = {{"uri", r.uri}, {"mimeType", r.mime_type}};
  if (r.text) {
    c["text"] = r.text;
  } else {
    c["blob"] = r.blob;
  }
  return c;
}

// "test://template/{id}/data" -> id; "" when `uri` does not match.
std::string TemplateId(const std::string& uri) {
  const std::string prefix = kTemplatePrefix, suffix = kTemplateSuffix;
  if (uri.size() <= prefix.size() + suffix.size() || uri.rfind(prefix, 0) != 0 ||
      uri.compare(uri.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return "";
  }
  const std::string id = uri.substr(prefix.size(), uri.size() - prefix.size() - suffix.size());
  return id.find('/') == std::string::npos ? id : "";
}

FixtureReply ListResources(const json&) {
  json list = json::array();
  for (const FixtureResource& r : kResources) {
    list.push_back({{"uri", r.uri},
                    {"name", r.name},
                    {"description", r.description},
                    {"mimeType", r.mime_type}});
  }
  return Reply(Cacheable({{"resources", list}}));
}

FixtureReply ListTemplates(const json&) {
  return Reply(
      Cacheable({{"resourceTemplates",
                  {{{"uriTemplate", std::string(kTemplatePrefix) + "{id}" + kTemplateSuffix},
                    {"name", "template-data"},
                    {"description", "Data for an id, substituted into the text"},
                    {"mimeType", "application/json"}}}}}));
}

FixtureReply ReadResource(const json& params) {
  const std::string uri = StringArg(params, "uri");
  if (uri.empty()) return InvalidParams("resources/read needs params.uri (a string)");
  for (const FixtureResource& r : kResources) {
    if (uri == r.uri) return Reply(Cacheable({{"contents", {ResourceContents(r)}}}));
  }
  if (const std::string id = TemplateId(uri); !id.empty()) {
    const json data = {{"id", id}, {"templateTest", true}, {"data", "Data for ID: " + id}};
    return Reply(Cacheable(
        {{"contents", {{{"uri", uri}, {"mimeType", "application/json"}, {"text", data.dump()}}}}}));
  }
  return InvalidParams("Resource not found: " + uri, {{"uri", uri}});  // SEP-2164
}

// The fixtures never change, so a subscription never fires; it is only acknowledged.
FixtureReply Subscription(const json& params) {
  if (StringArg(params, "uri").empty()) return InvalidParams("params.uri (a string) is required");
  return Reply(json::object());
}

// ---- prompts --------------------------------------------------------------------------

json UserMessage(json content) { return {{"role", "user"}, {"content", std::move(content)}}; }

json SimplePrompt(const json&) {
  return {UserMessage(Text("This is a simple prompt for testing."))};
}

json PromptWithArguments(const json& args) {
  return {UserMessage(Text("Prompt with arguments: arg1='" + StringArg(args, "arg1") + "', arg2='" +
                           StringArg(args, "arg2") + "'"))};
}

json PromptWithEmbeddedResource(const json& args) {
  return {UserMessage({{"type", "resource"},
                       {"resource",
                        {{"uri", StringArg(args, "resourceUri")},
                         {"mimeType", "text/plain"},
                         {"text", "Embedded resource content for testing."}}}}),
          UserMessage(Text("Please process the embedded resource above."))};
}

json PromptWithImage(const json&) {
  return {UserMessage(Image()), UserMessage(Text("Please analyze the image above."))};
}

struct PromptArgument {
  const char* name;
  const char* description;
  std::vector<std::string> completions;  // completion/complete candidates
};

struct FixturePrompt {
  const char* name;
  const char* description;
  std::vector<PromptArgument> arguments;  // all required
  json (*messages)(const json& arguments);
};

const std::vector<FixturePrompt>& PromptTable() {
  static const std::vector<FixturePrompt> kPrompts = {
      {"test_simple_prompt", "Conformance fixture: a prompt without arguments", {}, SimplePrompt},
      {"test_prompt_with_arguments",
       "Conformance fixture: a prompt with two arguments",
       {{"arg1", "First test argument", {"paris", "park", "party"}},
        {"arg2", "Second test argument", {"world", "wide", "web"}}},
       PromptWithArguments},
      {"test_prompt_with_embedded_resource",
       "Conformance fixture: a prompt embedding a resource",
       {{"resourceUri", "URI of the resource to embed", {"test://static-text"}}},
       PromptWithEmbeddedResource},
      {"test_prompt_with_image",
       "Conformance fixture: a prompt with an image",
       {},
       PromptWithImage},
  };
  return kPrompts;
}

const FixturePrompt* FindPrompt(const std::string& name) {
  for (const FixturePrompt& p : PromptTable()) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

FixtureReply ListPrompts(const json&) {
  json list = json::array();
  for (const FixturePrompt& p : PromptTable()) {
    json args = json::array();
    for (const PromptArgument& a : p.arguments) {
      args.push_back({{"name", a.name}, {"description", a.description}, {"required", true}});
    }
    json entry = {{"name", p.name}, {"description", p.description}};
    if (!args.empty()) entry["arguments"] = args;
    list.push_back(entry);
  }
  return Reply(Cacheable({{"prompts", list}}));
}

FixtureReply GetPrompt(const json& params) {
  const std::string name = StringArg(params, "name");
  const FixturePrompt* p = FindPrompt(name);
  if (!p) return InvalidParams("Unknown prompt: " + name);
  const json args = params.value("arguments", json::object());
  if (!args.is_object()) return InvalidParams("params.arguments must be an object");
  for (const PromptArgument& a : p->arguments) {
    if (StringArg(args, a.name).empty()) {
      return InvalidParams("prompt " + name + " needs the argument " + a.name + " (a string)");
    }
  }
  return Reply({{"description", p->description}, {"messages", p->messages(args)}});
}

// ---- completion -----------------------------------------------------------------------

json Completions(const std::vector<std::string>& candidates, const std::string& prefix) {
  json values = json::array();
  for (const std::string& c : candidates) {
    if (c.rfind(prefix, 0) == 0) values.push_back(c);
  }
  const size_t total = values.size();
  return {{"completion", {{"values", values}, {"total", total}, {"hasMore", false}}}};
}

FixtureReply Complete(const json& params) {
  const json ref = params.value("ref", json::object());
  const json argument = params.value("argument", json::object());
  if (!ref.is_object() || !argument.is_object()) {
    return InvalidParams("completion/complete needs params.ref and params.argument (objects)");
  }
  const std::string type = StringArg(ref, "type"), arg = StringArg(argument, "name");
  const std::string value = StringArg(argument, "value");
  if (type == "ref/prompt") {
    const FixturePrompt* p = FindPrompt(StringArg(ref, "name"));
    if (!p) return InvalidParams("Unknown prompt: " + StringArg(ref, "name"));
    for (const PromptArgument& a : p->arguments) {
      if (arg == a.name) return Reply(Completions(a.completions, value));
    }
    return Reply(Completions({}, value));
  }
  if (type == "ref/resource") {
    const std::string uri = StringArg(ref, "uri");
    if (uri != std::string(kTemplatePrefix) + "{id}" + kTemplateSuffix) {
      return InvalidParams("Unknown resource template: " + uri);
    }
    return Reply(Completions(
        arg == "id" ? std::vector<std::string>{"1", "2", "3", "123"} : std::vector<std::string>{},
        value));
  }
  return InvalidParams("params.ref.type must be ref/prompt or ref/resource");
}

// ---- the Fixtures -----------------------------------------------------------------------

struct FixtureMethod {
  const char* method;
  FixtureReply (*handle)(const json& params);
  Revisions revisions;
};

// resources/subscribe is not part of 2026-07-28 (subscriptions/listen replaces it).
constexpr FixtureMethod kMethods[] = {
    {"resources/list", ListResources, Revisions::kBoth},
    {"resources/templates/list", ListTemplates, Revisions::kBoth},
    {"resources/read", ReadResource, Revisions::kBoth},
    {"resources/subscribe", Subscription, Revisions::kStateful},
    {"resources/unsubscribe", Subscription, Revisions::kStateful},
    {"prompts/list", ListPrompts, Revisions::kBoth},
    {"prompts/get", GetPrompt, Revisions::kBoth},
    {"completion/complete", Complete, Revisions::kBoth},
};

json Capabilities() {
  return {{"resources", {{"subscribe", true}, {"listChanged", false}}},
          {"prompts", {{"listChanged", false}}},
          {"completions", json::object()}};
}

Outcome CallFixture(const FixtureTool& t, const json& args, const CallContext& ctx,
                    ClientRequests* asks) {
  FixtureContext f;
  f.notify = ctx.request->notify;
  f.progress_token = ctx.progress_token;
  f.log_level = ctx.session.log_level;
  f.client_capabilities = ctx.client_capabilities;
  const bridge::Request* req = ctx.request;
  f.ask_client = [req, asks](const std::string& method, const json& params) {
    return asks->Ask(*req, method, params);
  };
  try {
    return Outcome::Ok(t.call(args, f));
  } catch (const std::exception& e) {
    return Outcome::Ok(
        {{"content", {{{"type", "text"}, {"text", std::string("fixture: ") + e.what()}}}},
         {"isError", true}});
  }
}

}  // namespace

ConformanceFixtures::ConformanceFixtures() : asks_(std::make_unique<ClientRequests>()) {}

ConformanceFixtures::~ConformanceFixtures() = default;

std::unique_ptr<ConformanceFixtures> ConformanceFixtures::Install(bridge::McpServer* server) {
  std::unique_ptr<ConformanceFixtures> f(new ConformanceFixtures());
  ClientRequests* asks = f->asks_.get();
  for (const FixtureTool& t : ToolTable()) {
    bridge::ToolDefinition d;
    d.declaration = {
        {"name", t.name}, {"description", t.description}, {"inputSchema", t.input_schema()}};
    d.handler = [&t, asks](const json& args, const CallContext& ctx) {
      return CallFixture(t, args, ctx, asks);
    };
    const bool streams = t.streams;
    d.streams = [streams](const json&) { return streams; };
    server->RegisterTool(std::move(d));
  }
  for (const FixtureMethod& m : kMethods) {
    auto handle = m.handle;
    server->RegisterMethod(m.method, m.revisions, [handle](const json& params, const CallContext&) {
      return handle(params);
    });
  }
  server->AddCapabilities(Capabilities());
  server->SetResponseHandler([asks](const json& response, const std::string& session_id) {
    asks->Deliver(response, session_id);
  });
  return f;
}

}  // namespace onlineps::testing
