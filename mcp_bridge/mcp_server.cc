#include "mcp_bridge/mcp_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/await.h"
#include "common/mutex.h"
#include "mcp_bridge/tool_call_adapter.h"

namespace onlineps::bridge {

using nlohmann::json;

namespace {

constexpr size_t kMaxCapabilitiesBytes = 16 * 1024;
constexpr int64_t kListTtlMs = 3600 * 1000;
constexpr char kServerTitle[] = "onlineps MCP bridge";
constexpr char kInstructions[] =
    "onlineps serves a model that keeps learning. Call infer for predictions, learn with "
    "labelled examples to teach it, and the context tools to give your session extra input "
    "that never enters the shared model. model_info describes the model.";

Reply Error(int http, const json& id, int code, const std::string& message,
            const json& data = nullptr) {
  Reply r;
  r.http_status = http;
  r.body = JsonRpcError(id, code, message, data);
  return r;
}

Reply Result(const json& id, json result) {
  Reply r;
  r.body = {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
  return r;
}

// A result serialized by its handler, spliced into the answer as it is.
Reply ResultText(const json& id, const std::string& result) {
  Reply r;
  r.body_text = R"({"id":)";
  r.body_text += id.dump(-1, ' ', false, json::error_handler_t::replace);
  r.body_text += R"(,"jsonrpc":"2.0","result":)";
  r.body_text += result;
  r.body_text += '}';
  return r;
}

Reply Accepted() {
  Reply r;
  r.http_status = 202;
  return r;
}

bool ValidLogLevel(const std::string& l) {
  static const char* kLevels[] = {"debug", "info",     "notice", "warning",
                                  "error", "critical", "alert",  "emergency"};
  return std::find(std::begin(kLevels), std::end(kLevels), l) != std::end(kLevels);
}

const json& ParamsOf(const json& m) {
  static const json empty = json::object();
  auto it = m.find("params");
  return it != m.end() && it->is_object() ? *it : empty;
}

json MetaOf(const json& params) {
  auto it = params.find("_meta");
  return it != params.end() && it->is_object() ? *it : json::object();
}

bool Serves(Revisions r, bool stateless) {
  return r == Revisions::kBoth || (r == Revisions::kStateless) == stateless;
}

}  // namespace

std::string Reply::Text() const {
  if (!body_text.empty()) return body_text;
  if (body.is_null()) return "";
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool Reply::cancelled() const {
  return body.is_object() && body.contains("error") && body["error"].is_object() &&
         body["error"].value("code", 0) == kRequestCancelled;
}

json Reply::Document() const {
  if (!body_text.empty()) return json::parse(body_text);
  return body;
}

Outcome Outcome::Ok(json result) {
  Outcome o;
  o.result = std::move(result);
  return o;
}

Outcome Outcome::Error(int code, std::string message, json data, int http_status) {
  Outcome o;
  o.error_code = code;
  o.error_message = std::move(message);
  o.error_data = std::move(data);
  o.http_status = http_status;
  return o;
}

McpServer::McpServer(McpServerOptions options, Tools* tools, Recorder* recorder,
                     std::function<void(const std::string&)> end_session)
    : options_(std::move(options)),
      end_session_(std::move(end_session)),
      sessions_(options_.max_sessions, options_.max_sessions_per_client, options_.session_idle) {
  using std::placeholders::_1;
  using std::placeholders::_2;
  RegisterMethod("ping", Revisions::kStateful, std::bind(&McpServer::Ping, this, _1, _2));
  RegisterMethod("logging/setLevel", Revisions::kStateful,
                 std::bind(&McpServer::SetLogLevel, this, _1, _2));
  RegisterMethod("server/discover", Revisions::kStateless,
                 std::bind(&McpServer::Discover, this, _1, _2));
  RegisterMethod("tools/list", Revisions::kBoth, std::bind(&McpServer::ListTools, this, _1, _2));
  methods_["tools/call"] =
      Method{Revisions::kBoth, nullptr,
             [this](const json& params, const CallContext& ctx, Respond respond) {
               CallTool(params, ctx, std::move(respond));
             }};
  if (tools) {
    adapter_ = std::make_unique<ToolCallAdapter>(
        ToolCallAdapterOptions{options_.rate_limit, options_.rate_burst, options_.max_sessions},
        tools, recorder);
    for (ToolDefinition& t : adapter_->Definitions()) RegisterTool(std::move(t));
  }
}

McpServer::~McpServer() = default;

void McpServer::RegisterTool(ToolDefinition tool) {
  tool_index_[tool.declaration["name"].get<std::string>()] = tools_.size();
  tools_.push_back(std::move(tool));
}

void McpServer::RegisterMethod(const std::string& method, Revisions revisions, Handler handler) {
  methods_[method] = Method{revisions, std::move(handler), nullptr};
}

void McpServer::AddCapabilities(const json& capabilities) {
  extra_capabilities_.update(capabilities);
}

void McpServer::SetResponseHandler(std::function<void(const json&, const std::string&)> h) {
  response_handler_ = std::move(h);
}

size_t McpServer::Persist(StateDir* dir) { return sessions_.Persist(dir); }

void McpServer::SetCallObserver(std::function<void(const TraceRecord&)> observer) {
  if (adapter_) adapter_->SetObserver(std::move(observer));
}

json McpServer::ServerInfo() const {
  return {{"name", options_.name}, {"version", options_.version}, {"title", kServerTitle}};
}

// Revision 2026-07-28 has no logging capability and no resources/subscribe
// (subscriptions/listen replaces it).
json McpServer::Capabilities(bool stateless) const {
  json caps = {{"tools", {{"listChanged", false}}}, {"logging", json::object()}};
  caps.update(extra_capabilities_);
  if (stateless) {
    caps.erase("logging");
    if (caps.contains("resources")) caps["resources"].erase("subscribe");
  }
  return caps;
}

void McpServer::EndKeys(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) EndKey(key);
}

void McpServer::EndKey(const std::string& key) {
  if (!end_session_) return;
  // After the session's call still running (a set_context whose context would land after
  // the end dropped it, or an infer sending the context to its worker): the end wins.
  if (adapter_) return adapter_->AfterCalls(key, [&] { end_session_(key); });
  end_session_(key);
}

Reply McpServer::Handle(const Request& req) {
  return Await<Reply>([&](ReplyDone done) { HandleAsync(req, std::move(done)); });
}

void McpServer::HandleAsync(Request req, ReplyDone done) {
  auto r = std::make_shared<const Request>(std::move(req));
  // Exactly once, whichever thread finishes, even when a continuation throws after it.
  auto answered = std::make_shared<std::atomic<bool>>(false);
  ReplyDone once = [answered, done = std::move(done)](Reply reply) {
    if (!answered->exchange(true)) done(std::move(reply));
  };
  // The barrier for everything below: no exception reaches a transport's thread.
  try {
    HandleMessage(r, once);
  } catch (const std::exception& e) {
    spdlog::error("mcp: internal error handling a message: {}", e.what());
    const json id = r->message.is_object() ? r->message.value("id", json()) : json();
    once(Error(500, id.is_string() || id.is_number_integer() ? id : json(), kInternalError,
               std::string("internal error: ") + e.what()));
  } catch (...) {
    once(Error(500, nullptr, kInternalError, "internal error"));
  }
}

bool McpServer::Blocks(const json& m) const {
  if (m.is_array()) {
    return std::any_of(m.begin(), m.end(), [this](const json& e) { return Blocks(e); });
  }
  if (!m.is_object()) return false;  // refused at once
  auto method = m.find("method");
  if (method == m.end()) return m.contains("id");               // a response: the handler's
  if (!method->is_string() || !m.contains("id")) return false;  // refused, or a notification
  const std::string& name = method->get_ref<const std::string&>();
  if (name == "ping" || name == "tools/list" || name == "server/discover") return false;
  if (name != "tools/call") return true;  // initialize ends expired sessions, ...
  const json& params = ParamsOf(m);
  auto tool = params.find("name");
  if (tool == params.end() || !tool->is_string()) return false;
  auto t = tool_index_.find(tool->get<std::string>());
  return t != tool_index_.end() && tools_[t->second].blocks;
}

bool McpServer::Ordered(const json& m) const {
  if (!m.is_object()) return true;
  auto method = m.find("method");
  if (method == m.end() || *method != "tools/call") return true;
  const json& params = ParamsOf(m);
  auto tool = params.find("name");
  if (tool == params.end() || !tool->is_string()) return true;
  auto t = tool_index_.find(tool->get<std::string>());
  return t == tool_index_.end() || tools_[t->second].ordered;
}

void McpServer::HandleMessage(const RequestPtr& r, const ReplyDone& done) {
  const Request& req = *r;
  const json& m = req.message;
  if (m.is_array()) return Batch(r, done);
  if (!m.is_object())
    return done(Error(400, nullptr, kInvalidRequest, "a message must be a JSON object"));
  json id = m.contains("id") ? m["id"] : json();
  if (m.contains("id") && !id.is_string() && !id.is_number_integer()) {
    return done(Error(400, nullptr, kInvalidRequest, "id must be a string or an integer"));
  }
  if (m.value("jsonrpc", json()) != "2.0") {
    return done(Error(400, id, kInvalidRequest, "jsonrpc must be \"2.0\""));
  }
  if (!m.contains("method")) {
    if (m.contains("id") && (m.contains("result") || m.contains("error"))) {
      // A client's answer to a server request belongs to its session like any message
      // over HTTP: 400 without the header, 404 for a session unknown or ended.
      if (req.http && !req.stateless) {
        if (req.session_id.empty()) {
          return done(
              Error(400, nullptr, kServerError, "Bad Request: Mcp-Session-Id header is required"));
        }
        if (!sessions_.Has(req.session_id, req.principal)) {
          return done(
              Error(404, nullptr, kSessionNotFound, "Session not found: initialize a new session"));
        }
      }
      if (response_handler_) response_handler_(m, req.session_id);
      return done(Accepted());
    }
    return done(Error(400, id, kInvalidRequest, "a request needs a method"));
  }
  if (!m["method"].is_string())
    return done(Error(400, id, kInvalidRequest, "method must be a string"));
  if (m.contains("params") && !m["params"].is_object()) {
    return done(Error(400, id, kInvalidParams, "params must be an object"));
  }
  if (req.stateless) return Stateless(r, done);
  if (m["method"] == "initialize") return done(m.contains("id") ? Initialize(req) : Accepted());
  Stateful(r, done);
}

void McpServer::Batch(const RequestPtr& r, const ReplyDone& done) {
  const Request& req = *r;
  const json& batch = req.message;
  if (req.stateless || req.session_id.empty()) {
    return done(Error(400, nullptr, kInvalidRequest,
                      std::string("JSON-RPC batches are served only on a session of revision ") +
                          kBatchVersion +
                          " (MCP 2025-06-18 removed them): send one message "
                          "per request"));
  }
  std::optional<SessionView> session = sessions_.Use(req.session_id, req.principal);
  if (!session) {
    return done(
        Error(404, nullptr, kSessionNotFound, "Session not found: initialize a new session"));
  }
  if (session->version != kBatchVersion) {
    return done(Error(400, nullptr, kInvalidRequest,
                      "JSON-RPC batches are not part of revision " + session->version +
                          " (MCP 2025-06-18 removed them): send one message per request"));
  }
  if (batch.empty() || batch.size() > kMaxBatchMessages) {
    return done(Error(400, nullptr, kInvalidRequest,
                      "a batch holds " + std::to_string(batch.size()) +
                          " messages; it must hold 1 to " + std::to_string(kMaxBatchMessages)));
  }
  // Every answer in the order of the messages, sent once the last is in.
  struct Answers {
    Mutex mu;
    std::vector<std::string> texts GUARDED_BY(mu);
    size_t left GUARDED_BY(mu);
  };
  auto answers = std::make_shared<Answers>();
  {
    MutexLock lock(&answers->mu);
    answers->texts.resize(batch.size());
    answers->left = batch.size();
  }
  auto finish = [answers, done]() {
    std::string text;
    {
      MutexLock lock(&answers->mu);
      for (const std::string& t : answers->texts) {
        if (t.empty()) continue;
        text += text.empty() ? "[" : ",";
        text += t;
      }
    }
    // Only notifications and responses (or requests cancelled): nothing to answer.
    if (text.empty()) return done(Accepted());
    Reply reply;
    reply.body_text = text + "]";
    done(std::move(reply));
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    auto one = std::make_shared<Request>();
    one->message = batch[i];
    one->principal = req.principal;
    one->client_address = req.client_address;
    one->session_id = req.session_id;
    one->header_version = req.header_version;
    one->http = req.http;
    one->notify = req.notify;
    auto answered = std::make_shared<std::atomic<bool>>(false);
    ReplyDone element_done = [answers, answered, finish, i](Reply reply) {
      if (answered->exchange(true)) return;
      bool last;
      {
        MutexLock lock(&answers->mu);
        // A cancelled request gets no answer (as one sent alone).
        if (!reply.cancelled()) answers->texts[i] = reply.Text();
        last = --answers->left == 0;
      }
      if (last) finish();
    };
    const json& m = one->message;
    try {
      if (m.is_array()) {
        element_done(Error(400, nullptr, kInvalidRequest, "a batch must not hold a batch"));
      } else if (m.is_object() && m.value("method", json()) == "initialize") {
        element_done(Error(400, m.value("id", json()), kInvalidRequest,
                           "initialize must not be part of a JSON-RPC batch"));
      } else {
        HandleMessage(one, element_done);
      }
    } catch (const std::exception& e) {
      spdlog::error("mcp: internal error handling a message of a batch: {}", e.what());
      element_done(Error(500, nullptr, kInternalError, std::string("internal error: ") + e.what()));
    }
  }
}

void McpServer::Stateful(const RequestPtr& r, const ReplyDone& done) {
  const Request& req = *r;
  const json& m = req.message;
  const json id = m.contains("id") ? m["id"] : json();
  if (req.session_id.empty()) {
    return done(Error(400, id, kServerError,
                      "Bad Request: Mcp-Session-Id header is required (send initialize first)"));
  }
  std::optional<SessionView> session = sessions_.Use(req.session_id, req.principal);
  if (!session) {
    return done(Error(404, id, kSessionNotFound, "Session not found: initialize a new session"));
  }
  if (!req.header_version.empty() && !IsLegacyVersion(req.header_version)) {
    return done(Error(400, id, kServerError,
                      "Bad Request: unsupported MCP-Protocol-Version: " + req.header_version +
                          " (this session speaks " + session->version + ")"));
  }
  if (!m.contains("id")) {
    Notification(req);
    return done(Accepted());
  }
  CallContext ctx;
  ctx.request = &req;
  ctx.session_key = SessionTable::KeyOf(req.principal, req.session_id);
  ctx.client_capabilities = session->client_capabilities;
  ctx.session = std::move(*session);
  Dispatch(r, std::move(ctx), done);
}

Reply McpServer::Initialize(const Request& req) {
  const json& id = req.message["id"];
  const json& params = ParamsOf(req.message);
  if (!params.contains("protocolVersion") || !params["protocolVersion"].is_string()) {
    return Error(400, id, kInvalidParams, "initialize needs params.protocolVersion (a string)");
  }
  const std::string requested = params["protocolVersion"];
  const std::string version = IsLegacyVersion(requested) ? requested : kLatestLegacyVersion;
  json capabilities = params.value("capabilities", json::object());
  if (!capabilities.is_object()) {
    return Error(400, id, kInvalidParams, "params.capabilities must be an object");
  }
  if (size_t n = capabilities.dump().size(); n > kMaxCapabilitiesBytes) {
    return Error(400, id, kInvalidParams,
                 "params.capabilities is " + std::to_string(n) + " bytes; at most " +
                     std::to_string(kMaxCapabilitiesBytes) + " are kept per session");
  }
  std::vector<std::string> expired;
  StatusOr<std::string> sid =
      sessions_.Create(req.principal, SessionTable::ClientOf(req.principal, req.client_address),
                       version, std::move(capabilities), &expired);
  // Ending a session talks to its worker: never under the table's lock.
  EndKeys(expired);
  if (!expired.empty()) spdlog::info("mcp: {} sessions ended", expired.size());
  if (!sid.ok()) return Error(503, id, kServerError, sid.status().message());
  spdlog::debug("mcp: session {} initialized ({} requested, {} negotiated)", sid->substr(0, 8),
                requested, version);
  Reply r = Result(id, {{"protocolVersion", version},
                        {"capabilities", Capabilities(false)},
                        {"serverInfo", ServerInfo()},
                        {"instructions", kInstructions}});
  r.new_session_id = *sid;
  return r;
}

void McpServer::Notification(const Request& req) {
  // initialized, progress, ...: nothing to do.
  if (req.message["method"] != "notifications/cancelled") return;
  const json& params = ParamsOf(req.message);
  if (params.contains("requestId")) sessions_.Cancel(req.session_id, params["requestId"].dump());
}

void McpServer::Stateless(const RequestPtr& r, const ReplyDone& done) {
  const Request& req = *r;
  const json& m = req.message;
  if (!m.contains("id")) return done(Accepted());
  const json& id = m["id"];
  const json meta = ParamsOf(m).value("_meta", json::object());
  if (!meta.is_object() || !meta.contains(kMetaProtocolVersion) ||
      !meta[kMetaProtocolVersion].is_string()) {
    return done(Error(400, id, kInvalidParams,
                      std::string("params._meta[\"") + kMetaProtocolVersion +
                          "\"] is required in revision " + kModernVersion));
  }
  const std::string v = meta[kMetaProtocolVersion];
  if (v != kModernVersion) {
    return done(Error(400, id, kUnsupportedVersion, "Unsupported protocol version: " + v,
                      {{"supported", SupportedVersions()}, {"requested", v}}));
  }
  if (!meta.contains(kMetaClientCapabilities) || !meta[kMetaClientCapabilities].is_object()) {
    return done(
        Error(400, id, kInvalidParams,
              std::string("params._meta[\"") + kMetaClientCapabilities + "\"] is required"));
  }
  CallContext ctx;
  ctx.request = &req;
  ctx.client_capabilities = meta[kMetaClientCapabilities];
  Dispatch(r, std::move(ctx), done);
}

// The one method table of both eras; what differs by era is in the handlers and here:
// a missing method is a 404 in 2026-07-28, whose results carry resultType and serverInfo.
void McpServer::Dispatch(const RequestPtr& r, CallContext ctx, const ReplyDone& done) {
  const Request& req = *r;
  const json& id = req.message["id"];
  const std::string method = req.message["method"];
  const json& params = ParamsOf(req.message);
  auto it = methods_.find(method);
  if (it == methods_.end() || !Serves(it->second.revisions, req.stateless)) {
    return done(
        Error(req.stateless ? 404 : 200, id, kMethodNotFound, "Method not found: " + method));
  }
  ctx.progress_token = MetaOf(params).value("progressToken", json());
  // Holds the request (and so ctx.request) until the handler responds.
  Respond respond = [this, r, done](Outcome o) {
    const json& id = r->message["id"];
    if (o.error_code != 0) {
      return done(Error(o.http_status, id, o.error_code, o.error_message, o.error_data));
    }
    if (!o.result_text.empty() && !r->stateless) return done(ResultText(id, o.result_text));
    if (!o.result_text.empty()) o.result = json::parse(o.result_text);
    if (r->stateless && o.result.is_object()) {
      o.result["resultType"] = "complete";
      if (!o.result.contains("_meta")) o.result["_meta"] = {{kMetaServerInfo, ServerInfo()}};
    }
    done(Result(id, std::move(o.result)));
  };
  if (it->second.async) return it->second.async(params, ctx, std::move(respond));
  respond(it->second.handler(params, ctx));
}

Outcome McpServer::Ping(const json&, const CallContext&) { return Outcome::Ok(json::object()); }

Outcome McpServer::ListTools(const json& params, const CallContext& ctx) {
  const bool stateless = ctx.request->stateless;
  if (params.contains("cursor")) {
    return Outcome::Error(kInvalidParams, "invalid cursor", nullptr, stateless ? 400 : 200);
  }
  json list = json::array();
  for (const ToolDefinition& t : tools_) list.push_back(t.declaration);
  json result = {{"tools", std::move(list)}};
  if (stateless) {
    result["ttlMs"] = kListTtlMs;
    result["cacheScope"] = "public";
  }
  return Outcome::Ok(std::move(result));
}

void McpServer::CallTool(const json& params, const CallContext& ctx, Respond respond) {
  const Request& req = *ctx.request;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  const std::string rid = req.message["id"].dump();
  if (!req.stateless) {
    auto begun = sessions_.BeginCall(req.session_id, rid);
    if (!begun.ok()) {
      switch (begun.status().code()) {
        case StatusCode::kNotFound:
          return respond(Outcome::Error(kSessionNotFound, "Session not found", nullptr, 404));
        case StatusCode::kAlreadyExists:
          return respond(Outcome::Error(kInvalidRequest, begun.status().message(), nullptr, 400));
        default:
          return respond(Outcome::Error(kServerError, begun.status().message(), nullptr, 429));
      }
    }
    cancelled = *begun;
  } else if (req.cancelled) {
    cancelled = req.cancelled;
  }
  Respond end = [this, &req, rid, cancelled, respond = std::move(respond)](Outcome o) {
    if (!req.stateless) sessions_.EndCall(req.session_id, rid);
    // A cancelled request gets no response: the transports drop this error (stdio writes
    // nothing, HTTP answers an empty event stream).
    if (cancelled->load()) return respond(Outcome::Error(kRequestCancelled, "request cancelled"));
    respond(std::move(o));
  };
  if (!params.contains("name") || !params["name"].is_string()) {
    return end(Outcome::Error(kInvalidParams, "tools/call needs params.name (a string)"));
  }
  auto t = tool_index_.find(params["name"].get<std::string>());
  if (t == tool_index_.end()) {
    return end(
        Outcome::Error(kInvalidParams, "Unknown tool: " + params["name"].get<std::string>()));
  }
  if (params.contains("arguments") && !params["arguments"].is_object()) {
    return end(Outcome::Error(kInvalidParams, "params.arguments must be an object"));
  }
  CallContext call = ctx;
  call.cancelled = cancelled.get();
  const ToolDefinition& tool = tools_[t->second];
  const json arguments = params.value("arguments", json::object());
  if (tool.async_handler) return tool.async_handler(arguments, call, std::move(end));
  end(tool.handler(arguments, call));
}

Outcome McpServer::SetLogLevel(const json& params, const CallContext& ctx) {
  const std::string level = params.value("level", json("")).is_string()
                                ? params.value("level", std::string())
                                : std::string();
  if (!ValidLogLevel(level)) {
    return Outcome::Error(kInvalidParams,
                          "params.level must be one of debug, info, notice, warning, error, "
                          "critical, alert, emergency");
  }
  if (Status saved = sessions_.SetLogLevel(ctx.request->session_id, level); !saved.ok()) {
    spdlog::warn("mcp: the log level set holds until a restart only: {}", saved.ToString());
  }
  return Outcome::Ok(json::object());
}

Outcome McpServer::Discover(const json&, const CallContext&) {
  return Outcome::Ok({{"supportedVersions", SupportedVersions()},
                      {"capabilities", Capabilities(true)},
                      {"serverInfo", ServerInfo()},
                      {"instructions", kInstructions},
                      {"ttlMs", kListTtlMs},
                      {"cacheScope", "public"}});
}

bool McpServer::EndSession(const std::string& session_id, const std::string& principal) {
  if (!sessions_.End(session_id, principal)) return false;
  EndKey(SessionTable::KeyOf(principal, session_id));
  return true;
}

bool McpServer::WantsStream(const json& m) const {
  if (!m.is_object() || m.value("method", json()) != "tools/call") return false;
  const json& params = ParamsOf(m);
  auto name = params.find("name");
  if (name == params.end() || !name->is_string()) return false;
  auto t = tool_index_.find(name->get<std::string>());
  if (t == tool_index_.end()) return false;
  const ToolDefinition& tool = tools_[t->second];
  return tool.streams && tool.streams(params);
}

size_t McpServer::ExpireIdle() {
  std::vector<std::string> expired = sessions_.ExpireIdle();
  EndKeys(expired);
  return expired.size();
}

bool McpServer::HasSession(const std::string& session_id, const std::string& principal) const {
  return sessions_.Has(session_id, principal);
}

size_t McpServer::sessions() const { return sessions_.size(); }

}  // namespace onlineps::bridge
