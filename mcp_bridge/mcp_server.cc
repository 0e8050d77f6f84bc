#include "mcp_bridge/mcp_server.h"

#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace onlineps::bridge {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kSweepEvery = std::chrono::seconds(10);
constexpr char kKind[] = "sessions";
constexpr size_t kMaxCapabilitiesBytes = 16 * 1024;
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

Reply Accepted() {
  Reply r;
  r.http_status = 202;
  return r;
}

json Capabilities() { return {{"tools", {{"listChanged", false}}}, {"logging", json::object()}}; }

json ServerInfo(const McpServerOptions& o) {
  return {{"name", o.name}, {"version", o.version}, {"title", kServerTitle}};
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

std::string SessionPrefix(const std::string& principal) {
  return principal.empty() ? std::string() : principal + "/";
}

// The shape of the ids NewSessionId makes: a restored record answers no other.
bool IsSessionId(const std::string& id) {
  return id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

json SupportedVersions() { return {kModernVersion, "2025-11-25", "2025-06-18", "2025-03-26"}; }

bool IsLegacyVersion(const std::string& v) {
  return v == "2025-11-25" || v == "2025-06-18" || v == "2025-03-26";
}

json JsonRpcError(const json& id, int code, const std::string& message, const json& data) {
  json e = {{"code", code}, {"message", message}};
  if (!data.is_null()) e["data"] = data;
  json m = {{"jsonrpc", "2.0"}, {"error", e}};
  if (!id.is_null()) m["id"] = id;
  return m;
}

McpServer::McpServer(McpServerOptions options, Tools* tools, Recorder* recorder,
                     std::function<void(const std::string&)> end_session)
    : options_(std::move(options)),
      tools_(tools),
      recorder_(recorder),
      end_session_(std::move(end_session)),
      last_sweep_(Clock::now()) {}

std::string McpServer::NewSessionId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string id;
  for (unsigned char b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

std::vector<std::string> McpServer::Sweep() {
  last_sweep_ = Clock::now();
  std::vector<std::string> ended;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (last_sweep_ - it->second.used > options_.session_idle) {
      ended.push_back(SessionPrefix(it->second.principal) + "m:" + it->first);
      if (dir_) dir_->Remove(kKind, StateDir::HashOf(it->first));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  // Unused since the restart, so no worker has their contexts; the bridge's copies expire
  // by --context-ttl-s (their keys, which hold the ids, are not known here).
  for (auto it = restored_.begin(); it != restored_.end();) {
    if (last_sweep_ - it->second.used > options_.session_idle) {
      if (dir_) dir_->Remove(kKind, it->first);
      it = restored_.erase(it);
    } else {
      ++it;
    }
  }
  return ended;
}

McpServer::Session* McpServer::Find(const std::string& session_id) {
  if (auto it = sessions_.find(session_id); it != sessions_.end()) return &it->second;
  if (restored_.empty() || !IsSessionId(session_id)) return nullptr;
  auto it = restored_.find(StateDir::HashOf(session_id));
  if (it == restored_.end()) return nullptr;
  // Its first use since the restart: from now on it is known by its id.
  Session& s = sessions_[session_id] = std::move(it->second);
  restored_.erase(it);
  return &s;
}

size_t McpServer::CountLocked() const { return sessions_.size() + restored_.size(); }

Reply McpServer::Handle(const Request& req) {
  // The barrier for everything below: no exception reaches a transport's thread.
  try {
    return HandleMessage(req);
  } catch (const std::exception& e) {
    spdlog::error("mcp: internal error handling a message: {}", e.what());
    const json id = req.message.is_object() ? req.message.value("id", json()) : json();
    return Error(500, id.is_string() || id.is_number_integer() ? id : json(), kInternalError,
                 std::string("internal error: ") + e.what());
  } catch (...) {
    return Error(500, nullptr, kInternalError, "internal error");
  }
}

Reply McpServer::HandleMessage(const Request& req) {
  const json& m = req.message;
  if (m.is_array()) {
    return Error(400, nullptr, kInvalidRequest,
                 "JSON-RPC batches are not supported (removed in MCP 2025-06-18): send one message "
                 "per request");
  }
  if (!m.is_object())
    return Error(400, nullptr, kInvalidRequest, "a message must be a JSON object");
  json id = m.contains("id") ? m["id"] : json();
  if (m.contains("id") && !id.is_string() && !id.is_number_integer()) {
    return Error(400, nullptr, kInvalidRequest, "id must be a string or an integer");
  }
  if (m.value("jsonrpc", json()) != "2.0") {
    return Error(400, id, kInvalidRequest, "jsonrpc must be \"2.0\"");
  }
  if (!m.contains("method")) {
    if (m.contains("id") && (m.contains("result") || m.contains("error"))) {
      DeliverResponse(m, req.session_id);
      return Accepted();
    }
    return Error(400, id, kInvalidRequest, "a request needs a method");
  }
  if (!m["method"].is_string()) return Error(400, id, kInvalidRequest, "method must be a string");
  if (m.contains("params") && !m["params"].is_object()) {
    return Error(400, id, kInvalidParams, "params must be an object");
  }
  if (req.stateless) return Stateless(req);
  const std::string method = m["method"];
  if (method == "initialize") return m.contains("id") ? Initialize(req) : Accepted();

  if (req.session_id.empty()) {
    return Error(400, id, kServerError,
                 "Bad Request: Mcp-Session-Id header is required (send initialize first)");
  }
  std::string version;
  bool touch = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Session* s = Find(req.session_id);
    const auto now = Clock::now();
    if (!s || s->principal != req.principal || now - s->used > options_.session_idle) {
      return Error(404, id, kSessionNotFound, "Session not found: initialize a new session");
    }
    s->used = now;
    version = s->version;
    // The file's time is the session's last use: move it now and then.
    touch = dir_ && now - s->touched > options_.session_idle / 8;
    if (touch) s->touched = now;
  }
  if (touch) dir_->Touch(kKind, StateDir::HashOf(req.session_id));
  if (!req.header_version.empty() && !IsLegacyVersion(req.header_version)) {
    return Error(400, id, kServerError,
                 "Bad Request: unsupported MCP-Protocol-Version: " + req.header_version +
                     " (this session speaks " + version + ")");
  }
  if (!m.contains("id")) {
    Notification(req, nullptr);
    return Accepted();
  }
  return Dispatch(req, nullptr);
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
  std::string sid;
  std::vector<std::string> expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (CountLocked() >= options_.max_sessions || Clock::now() - last_sweep_ > kSweepEvery) {
      expired = Sweep();
    }
  }
  // Ending a session talks to its worker: never under mu_.
  for (const std::string& key : expired) {
    if (end_session_) end_session_(key);
  }
  if (!expired.empty()) spdlog::info("mcp: {} idle sessions expired", expired.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (CountLocked() >= options_.max_sessions) {
      return Error(503, id, kServerError,
                   "the bridge holds " + std::to_string(CountLocked()) +
                       " sessions, its limit (--max-sessions); try again later");
    }
    sid = NewSessionId();  // never a client-chosen id (session fixation)
    Session& s = sessions_[sid];
    s.client_capabilities = std::move(capabilities);
    s.principal = req.principal;
    s.version = version;
    s.used = s.touched = Clock::now();
  }
  if (Status saved = Save(sid); !saved.ok()) {
    spdlog::error("mcp: {}", saved.ToString());
    std::lock_guard<std::mutex> lock(mu_);
    sessions_.erase(sid);
    return Error(
        503, id, kServerError,
        "the bridge could not save the new session (" + saved.ToString() + "); try again later");
  }
  spdlog::debug("mcp: session {} initialized ({} requested, {} negotiated)", sid.substr(0, 8),
                requested, version);
  json caps = Capabilities();
  if (fixtures_) caps.update(fixtures_->Capabilities());
  Reply r = Result(id, {{"protocolVersion", version},
                        {"capabilities", caps},
                        {"serverInfo", ServerInfo(options_)},
                        {"instructions", kInstructions}});
  r.new_session_id = sid;
  return r;
}

void McpServer::Notification(const Request& req, Session*) {
  const std::string method = req.message["method"];
  if (method != "notifications/cancelled") return;  // initialized, progress, ...: nothing to do
  const json& params = ParamsOf(req.message);
  if (!params.contains("requestId")) return;
  const std::string rid = params["requestId"].dump();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(req.session_id);
  if (it == sessions_.end()) return;
  if (auto c = it->second.inflight.find(rid); c != it->second.inflight.end()) {
    c->second->store(true);
    spdlog::debug("mcp: request {} cancelled", rid);
  }
}

Reply McpServer::Dispatch(const Request& req, Session*) {
  const json& m = req.message;
  const json& id = m["id"];
  const std::string method = m["method"];
  const json& params = ParamsOf(m);
  if (method == "ping") return Result(id, json::object());
  if (method == "tools/list") {
    if (params.contains("cursor")) return Error(200, id, kInvalidParams, "invalid cursor");
    json tools = tools_->List();
    if (fixtures_) {
      for (const json& t : fixtures_->Tools()) tools.push_back(t);
    }
    return Result(id, {{"tools", tools}});
  }
  if (method == "logging/setLevel") {
    const std::string level = params.value("level", json("")).is_string()
                                  ? params.value("level", std::string())
                                  : std::string();
    if (!ValidLogLevel(level)) {
      return Error(200, id, kInvalidParams,
                   "params.level must be one of debug, info, notice, warning, error, critical, "
                   "alert, emergency");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = sessions_.find(req.session_id); it != sessions_.end())
        it->second.log_level = level;
    }
    if (Status saved = Save(req.session_id); !saved.ok()) {
      spdlog::warn("mcp: the log level set holds until a restart only: {}", saved.ToString());
    }
    return Result(id, json::object());
  }
  if (method == "tools/call") {
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    const std::string rid = id.dump();
    std::string version;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sessions_.find(req.session_id);
      if (it == sessions_.end()) return Error(404, id, kSessionNotFound, "Session not found");
      if (it->second.inflight.size() >= 1024) {
        return Error(429, id, kServerError, "too many requests in flight on this session");
      }
      it->second.inflight[rid] = cancelled;
      version = it->second.version;
    }
    Reply r =
        CallTool(req, SessionPrefix(req.principal) + "m:" + req.session_id, version, cancelled);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = sessions_.find(req.session_id); it != sessions_.end())
      it->second.inflight.erase(rid);
    return r;
  }
  if (fixtures_) {
    if (std::optional<FixtureReply> f = fixtures_->Handle(method, params)) {
      if (f->error_code != 0) return Error(200, id, f->error_code, f->error_message, f->error_data);
      return Result(id, f->result);
    }
  }
  return Error(200, id, kMethodNotFound, "Method not found: " + method);
}

McpServer::GateTicket::GateTicket(McpServer* server, const std::string& key)
    : server_(server), key_(key) {
  std::unique_lock<std::mutex> lock(server_->gate_mu_);
  Gate& g = server_->gates_[key_];
  ++g.users;
  const uint64_t ticket = g.next++;
  server_->gate_cv_.wait(lock, [&] { return g.serving == ticket; });
}

McpServer::GateTicket::~GateTicket() {
  {
    std::lock_guard<std::mutex> lock(server_->gate_mu_);
    Gate& g = server_->gates_[key_];
    ++g.serving;
    if (--g.users == 0) server_->gates_.erase(key_);
  }
  server_->gate_cv_.notify_all();
}

bool McpServer::Allow(const std::string& key) {
  if (options_.rate_limit <= 0) return true;
  std::lock_guard<std::mutex> lock(rate_mu_);
  const auto now = Clock::now();
  if (buckets_.size() > 2 * options_.max_sessions) {
    // Bounded: drop the buckets that have refilled anyway (idle callers), not everyone's.
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      const double idle_s = std::chrono::duration<double>(now - it->second.at).count();
      if (it->second.tokens + idle_s * options_.rate_limit >= options_.rate_burst) {
        it = buckets_.erase(it);
      } else {
        ++it;
      }
    }
  }
  auto [it, fresh] = buckets_.try_emplace(key, Bucket{options_.rate_burst, now});
  Bucket& b = it->second;
  const double dt = std::chrono::duration<double>(now - b.at).count();
  b.tokens = std::min(options_.rate_burst, b.tokens + dt * options_.rate_limit);
  b.at = now;
  if (b.tokens < 1) return false;
  b.tokens -= 1;
  return true;
}

Reply McpServer::CallTool(const Request& req, const std::string& legacy_key,
                          const std::string& version,
                          std::shared_ptr<std::atomic<bool>> cancelled) {
  const auto start = Clock::now();
  auto admitted = start, released = start;  // the span the call held its session
  const json& id = req.message["id"];
  const json& params = ParamsOf(req.message);
  if (!params.contains("name") || !params["name"].is_string()) {
    return Error(200, id, kInvalidParams, "tools/call needs params.name (a string)");
  }
  const std::string name = params["name"];
  if (fixtures_ && fixtures_->HasTool(name)) {
    return CallFixture(req, name, params.value("arguments", json::object()));
  }
  if (!tools_->Has(name)) return Error(200, id, kInvalidParams, "Unknown tool: " + name);
  ToolCall call;
  call.name = name;
  call.arguments = params.contains("arguments") ? params["arguments"] : json::object();
  if (!call.arguments.is_object()) {
    return Error(200, id, kInvalidParams, "params.arguments must be an object");
  }
  ToolResult result;
  bool bad_session = false;
  if (auto s = call.arguments.find("session"); s != call.arguments.end()) {
    std::string problem = s->is_string() ? CheckSessionName(*s) : "session must be a string";
    if (!problem.empty()) {
      result.is_error = bad_session = true;
      result.error = problem;
    } else {
      call.session = SessionPrefix(req.principal) + "s:" + s->get<std::string>();
    }
  } else if (!req.stateless) {
    call.session = legacy_key;
  }
  // Stateless handles are chosen by the client: a new one per call must not dodge the
  // limit, so stateless calls are limited per identity.
  const std::string rate_key =
      req.stateless ? "identity|" + req.principal : "session|" + req.session_id;
  if (!Allow(rate_key)) {
    return Error(429, id, kServerError,
                 "rate limit: more than " + std::to_string(options_.rate_limit) +
                     " calls/s on this session (--rate-limit); slow down and retry");
  }
  const json token = params.contains("_meta") && params["_meta"].is_object()
                         ? params["_meta"].value("progressToken", json())
                         : json();
  if (req.notify && (token.is_string() || token.is_number_integer())) {
    call.progress = [&req, token](double p, double total, const std::string& msg) {
      req.notify(
          {{"jsonrpc", "2.0"},
           {"method", "notifications/progress"},
           {"params",
            {{"progressToken", token}, {"progress", p}, {"total", total}, {"message", msg}}}});
    };
  }
  call.cancelled = cancelled.get();
  if (!bad_session) {
    // Calls of one session run one at a time, in the order they arrived. Calls without a
    // session share nothing, so they take no gate.
    std::optional<GateTicket> turn;
    if (!call.session.empty()) turn.emplace(this, call.session);
    admitted = Clock::now();
    try {
      result = tools_->Call(call);
    } catch (const std::exception& e) {  // nothing may escape into the transport's threads
      result = ToolResult();
      result.is_error = true;
      result.error = std::string("internal error: ") + e.what();
    } catch (...) {
      result = ToolResult();
      result.is_error = true;
      result.error = "internal error";
    }
    released = Clock::now();
  }
  json out;
  if (result.is_error) {
    out = {{"content", {{{"type", "text"}, {"text", result.error}}}}, {"isError", true}};
  } else {
    out = {{"content",
            {{{"type", "text"},
              {"text", result.structured.dump(-1, ' ', false, json::error_handler_t::replace)}}}},
           {"structuredContent", result.structured},
           {"isError", false}};
  }
  if (req.stateless) {
    out["resultType"] = "complete";
    out["_meta"] = {{"io.modelcontextprotocol/serverInfo", ServerInfo(options_)}};
  }
  const auto end = Clock::now();
  const int64_t latency =
      std::chrono::duration_cast<std::chrono::microseconds>(end - start).count();
  if (recorder_ || observer_) {
    TraceRecord rec;
    rec.session = call.session;
    rec.tool = name;
    rec.arguments = call.arguments;
    rec.is_error = result.is_error;
    rec.summary = result.is_error ? result.error : result.summary;
    rec.worker = result.worker;
    rec.version = result.version;
    rec.tau = result.tau;
    rec.latency_us = latency;
    rec.end_steady_us =
        std::chrono::duration_cast<std::chrono::microseconds>(end.time_since_epoch()).count();
    rec.wait_us = std::chrono::duration_cast<std::chrono::microseconds>(admitted - start).count();
    rec.run_us = std::chrono::duration_cast<std::chrono::microseconds>(released - admitted).count();
    if (recorder_) recorder_->Record(rec);
    if (observer_) observer_(rec);
  }
  (void)version;
  Reply r = Result(id, std::move(out));
  if (cancelled->load()) {
    r.body = JsonRpcError(id, -32800, "request cancelled");
    r.http_status = 200;
  }
  return r;
}

// Revision 2026-07-28 has no resources/subscribe (subscriptions/listen replaces it).
json McpServer::ModernCapabilities() const {
  json caps = {{"tools", {{"listChanged", false}}}};
  if (fixtures_) {
    caps.update(fixtures_->Capabilities());
    caps.erase("logging");
    if (caps.contains("resources")) caps["resources"].erase("subscribe");
  }
  return caps;
}

Reply McpServer::Stateless(const Request& req) {
  const json& m = req.message;
  const json id = m.contains("id") ? m["id"] : json();
  const std::string method = m["method"];
  if (!m.contains("id")) return Accepted();
  const json& params = ParamsOf(m);
  const json meta = params.value("_meta", json::object());
  const std::string kVersionKey = "io.modelcontextprotocol/protocolVersion";
  if (!meta.is_object() || !meta.contains(kVersionKey) || !meta[kVersionKey].is_string()) {
    return Error(400, id, kInvalidParams,
                 "params._meta[\"" + kVersionKey + "\"] is required in revision " + kModernVersion);
  }
  const std::string v = meta[kVersionKey];
  if (v != kModernVersion) {
    return Error(400, id, kUnsupportedVersion, "Unsupported protocol version: " + v,
                 {{"supported", SupportedVersions()}, {"requested", v}});
  }
  if (!meta.contains("io.modelcontextprotocol/clientCapabilities") ||
      !meta["io.modelcontextprotocol/clientCapabilities"].is_object()) {
    return Error(400, id, kInvalidParams,
                 "params._meta[\"io.modelcontextprotocol/clientCapabilities\"] is required");
  }
  const json server_meta = {{"io.modelcontextprotocol/serverInfo", ServerInfo(options_)}};
  if (method == "server/discover") {
    return Result(id, {{"supportedVersions", SupportedVersions()},
                       {"capabilities", ModernCapabilities()},
                       {"serverInfo", ServerInfo(options_)},
                       {"instructions", kInstructions},
                       {"ttlMs", 3600 * 1000},
                       {"cacheScope", "public"},
                       {"resultType", "complete"},
                       {"_meta", server_meta}});
  }
  // initialize and ping are gone from 2026-07-28 (server/discover replaces both).
  if (method == "tools/list") {
    if (params.contains("cursor")) return Error(400, id, kInvalidParams, "invalid cursor");
    json tools = tools_->List();
    if (fixtures_) {
      for (const json& t : fixtures_->Tools()) tools.push_back(t);
    }
    return Result(id, {{"tools", tools},
                       {"ttlMs", 3600 * 1000},
                       {"cacheScope", "public"},
                       {"resultType", "complete"},
                       {"_meta", server_meta}});
  }
  if (method == "tools/call") {
    return CallTool(req, "", kModernVersion, std::make_shared<std::atomic<bool>>(false));
  }
  static const char* kFixtureMethods[] = {"resources/list", "resources/templates/list",
                                          "resources/read", "prompts/list",
                                          "prompts/get",    "completion/complete"};
  if (fixtures_ && std::find(std::begin(kFixtureMethods), std::end(kFixtureMethods), method) !=
                       std::end(kFixtureMethods)) {
    if (std::optional<FixtureReply> f = fixtures_->Handle(method, params)) {
      if (f->error_code != 0) return Error(200, id, f->error_code, f->error_message, f->error_data);
      json r = f->result;
      r["resultType"] = "complete";
      r["_meta"] = server_meta;
      return Result(id, r);
    }
  }
  return Error(404, id, kMethodNotFound, "Method not found: " + method);
}

bool McpServer::EndSession(const std::string& session_id, const std::string& principal) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Session* s = Find(session_id);
    if (!s || s->principal != principal) return false;
    for (auto& [rid, c] : s->inflight) c->store(true);
    sessions_.erase(session_id);
  }
  // A Save racing this re-checks (Save).
  if (dir_) dir_->Remove(kKind, StateDir::HashOf(session_id));
  if (end_session_) end_session_(SessionPrefix(principal) + "m:" + session_id);
  return true;
}

bool McpServer::WantsStream(const json& m) const {
  if (!m.is_object() || m.value("method", json()) != "tools/call") return false;
  const json& params = ParamsOf(m);
  if (fixtures_ && params.contains("name") && params["name"].is_string() &&
      fixtures_->HasTool(params["name"])) {
    return fixtures_->ToolStreams(params["name"]);
  }
  if (!params.contains("_meta") || !params["_meta"].is_object() ||
      !params["_meta"].contains("progressToken")) {
    return false;
  }
  if (params.value("name", json()) != "learn") return false;
  const json args = params.value("arguments", json::object());
  return args.is_object() && args.contains("examples") && args["examples"].is_array() &&
         args["examples"].size() > 1;
}

size_t McpServer::ExpireIdle() {
  std::vector<std::string> expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    expired = Sweep();
  }
  for (const std::string& key : expired) {
    if (end_session_) end_session_(key);
  }
  return expired.size();
}

bool McpServer::HasSession(const std::string& session_id, const std::string& principal) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it != sessions_.end()) return it->second.principal == principal;
  if (restored_.empty() || !IsSessionId(session_id)) return false;
  auto r = restored_.find(StateDir::HashOf(session_id));
  return r != restored_.end() && r->second.principal == principal;
}

Reply McpServer::CallFixture(const Request& req, const std::string& name, const json& args) {
  const json& id = req.message["id"];
  const json& params = ParamsOf(req.message);
  FixtureContext ctx;
  ctx.notify = req.notify;
  if (params.contains("_meta") && params["_meta"].is_object()) {
    ctx.progress_token = params["_meta"].value("progressToken", json());
    ctx.client_capabilities =
        params["_meta"].value("io.modelcontextprotocol/clientCapabilities", json::object());
  }
  if (!req.stateless) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = sessions_.find(req.session_id); it != sessions_.end()) {
      ctx.log_level = it->second.log_level;
      ctx.client_capabilities = it->second.client_capabilities;
    }
  }
  ctx.ask_client = [this, &req](const std::string& method, const json& p) {
    return AskClient(req, method, p);
  };
  json result;
  try {
    result = fixtures_->CallTool(name, args.is_object() ? args : json::object(), ctx);
  } catch (const std::exception& e) {
    result = {{"content", {{{"type", "text"}, {"text", std::string("fixture: ") + e.what()}}}},
              {"isError", true}};
  }
  if (req.stateless) result["resultType"] = "complete";
  return Result(id, std::move(result));
}

StatusOr<json> McpServer::AskClient(const Request& req, const std::string& method,
                                    const json& params) {
  if (!req.notify || req.stateless) {
    return Unavailable("no stream to send " + method + " on");
  }
  auto ask = std::make_shared<Ask>();
  std::string id;
  {
    std::lock_guard<std::mutex> lock(ask_mu_);
    if (asks_.size() >= 1024) return ResourceExhausted("too many requests to clients pending");
    id = "onlineps-" + std::to_string(next_ask_++);
    ask->session_id = req.session_id;
    asks_[id] = ask;
  }
  req.notify({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
  std::unique_lock<std::mutex> lock(ask->mu);
  const bool done = ask->cv.wait_for(lock, std::chrono::seconds(30), [&] { return ask->done; });
  {
    std::lock_guard<std::mutex> l(ask_mu_);
    asks_.erase(id);
  }
  if (!done) return DeadlineExceeded("the client did not answer " + method + " within 30 s");
  if (ask->response.contains("error")) {
    return Status(
        StatusCode::kFailedPrecondition,
        "the client answered " + method + " with an error: " + ask->response["error"].dump());
  }
  return ask->response.value("result", json::object());
}

bool McpServer::DeliverResponse(const json& m, const std::string& session_id) {
  if (!m["id"].is_string()) return false;
  std::shared_ptr<Ask> ask;
  {
    std::lock_guard<std::mutex> lock(ask_mu_);
    auto it = asks_.find(m["id"].get<std::string>());
    if (it == asks_.end() || it->second->session_id != session_id) return false;
    ask = it->second;
  }
  {
    std::lock_guard<std::mutex> lock(ask->mu);
    ask->response = m;
    ask->done = true;
  }
  ask->cv.notify_all();
  return true;
}

size_t McpServer::Persist(StateDir* dir) {
  std::vector<StateDir::Record> records = dir->Load(kKind);  // the most recent first
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (const StateDir::Record& r : records) {
    const json& v = r.value;
    std::string problem;
    if (!v.contains("version") || !v["version"].is_string() || !IsLegacyVersion(v["version"])) {
      problem = "no supported protocol version";
    } else if (!v.value("principal", json()).is_string() ||
               !v.value("log_level", json()).is_string() ||
               !v.value("client_capabilities", json()).is_object()) {
      problem = "principal, log_level or client_capabilities missing or of the wrong type";
    } else if (CountLocked() >= options_.max_sessions) {
      problem = "the bridge is full (--max-sessions)";
    }
    const auto age = std::chrono::milliseconds(r.age_ms);
    if (age > options_.session_idle || !problem.empty()) {
      if (!problem.empty())
        spdlog::warn("mcp: dropping saved session {}: {}", r.hash.substr(0, 12), problem);
      dir->Remove(kKind, r.hash);
      continue;
    }
    // Known by hash until a request brings its id (Find).
    Session& s = restored_[r.hash];
    s.principal = v["principal"];
    s.version = v["version"];
    s.log_level = v["log_level"];
    s.client_capabilities = v["client_capabilities"];
    s.used = s.touched = now - age;
  }
  dir_ = dir;
  return CountLocked();
}

Status McpServer::Save(const std::string& session_id) {
  if (!dir_) return Status::Ok();
  json record;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return Status::Ok();
    const Session& s = it->second;
    record = {{"principal", s.principal},
              {"version", s.version},
              {"log_level", s.log_level},
              {"client_capabilities", s.client_capabilities}};
  }
  const std::string hash = StateDir::HashOf(session_id);
  ONLINEPS_RETURN_IF_ERROR(dir_->Put(kKind, hash, record));
  // Ended while being written: its removal may have come first.
  std::lock_guard<std::mutex> lock(mu_);
  if (!sessions_.count(session_id)) dir_->Remove(kKind, hash);
  return Status::Ok();
}

size_t McpServer::sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return CountLocked();
}

}  // namespace onlineps::bridge
