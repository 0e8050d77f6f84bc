#include "replay/mcp_client.h"

#include <httplib.h>

#include <regex>

namespace onlineps::replay {
namespace {

using nlohmann::json;

constexpr const char* kProtocolVersion = "2025-11-25";

// The last "data:" event of an SSE body: the JSON-RPC response comes after any progress.
std::string LastSseData(const std::string& body) {
  std::string last;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data:", 0) == 0) {
      last = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
    }
    pos = end + 1;
  }
  return last;
}

std::string Short(const std::string& s) { return s.size() > 300 ? s.substr(0, 300) + "..." : s; }

}  // namespace

StatusOr<McpUrl> ParseMcpUrl(const std::string& url) {
  static const std::regex re(
      R"(^(http://[A-Za-z0-9.\-]+|http://\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/.*)?$)");
  std::smatch m;
  if (!std::regex_match(url, m, re)) {
    if (url.rfind("https://", 0) == 0) {
      return InvalidArgument("bridge URL '" + url + "': https is not supported; use http://");
    }
    return InvalidArgument("bridge URL '" + url + "' is not http://HOST[:PORT][/PATH]");
  }
  McpUrl u;
  u.scheme_host_port = m[1].str() + m[2].str();
  u.path = m[3].matched && m[3].str() != "/" ? m[3].str() : "/mcp";
  return u;
}

McpHttpClient::McpHttpClient(const McpUrl& url, McpClientOptions options)
    : url_(url),
      options_(std::move(options)),
      http_(std::make_unique<httplib::Client>(url.scheme_host_port)) {
  http_->set_keep_alive(true);
  http_->set_tcp_nodelay(true);
  const int ms = std::max(1, options_.timeout_ms);
  http_->set_connection_timeout(ms / 1000, (ms % 1000) * 1000);
  http_->set_read_timeout(ms / 1000, (ms % 1000) * 1000);
  http_->set_write_timeout(ms / 1000, (ms % 1000) * 1000);
}

McpHttpClient::~McpHttpClient() = default;

StatusOr<json> McpHttpClient::Post(const json& message) {
  httplib::Headers h = {{"Accept", "application/json, text/event-stream"}};
  if (!options_.token.empty()) h.emplace("Authorization", "Bearer " + options_.token);
  if (!session_.empty()) {
    h.emplace("Mcp-Session-Id", session_);
    h.emplace("MCP-Protocol-Version", kProtocolVersion);
  }
  auto r = http_->Post(url_.path, h, message.dump(), "application/json");
  const std::string where = url_.scheme_host_port + url_.path;
  if (!r) {
    const auto e = r.error();
    const std::string what = httplib::to_string(e);
    if (e == httplib::Error::Read || e == httplib::Error::Write) {
      return DeadlineExceeded(where + ": " + what + " (no reply within " +
                              std::to_string(options_.timeout_ms) + " ms?)");
    }
    return Unavailable(where + ": " + what);
  }
  if (r->status == 404 && !session_.empty()) {
    return NotFound(where + " no longer knows session " + session_ + ": " + Short(r->body));
  }
  if (r->status == 401 || r->status == 403) {
    return FailedPrecondition(where + " refused the call (HTTP " + std::to_string(r->status) +
                              "): " + Short(r->body));
  }
  if (r->status == 429 || r->status == 503) {
    return Unavailable(where + " is busy (HTTP " + std::to_string(r->status) +
                       "): " + Short(r->body));
  }
  if (session_.empty() && r->has_header("Mcp-Session-Id")) {
    session_ = r->get_header_value("Mcp-Session-Id");
  }
  std::string body = r->body;
  if (r->get_header_value("Content-Type").rfind("text/event-stream", 0) == 0) {
    body = LastSseData(body);
  }
  if (r->status == 202 || body.empty()) {
    if (r->status >= 300) {
      return Unavailable(where + ": HTTP " + std::to_string(r->status));
    }
    return json();
  }
  json reply = json::parse(body, nullptr, false);
  if (reply.is_discarded() || !reply.is_object()) {
    return Malformed(where + ": HTTP " + std::to_string(r->status) +
                     " with a body that is not a JSON-RPC message: " + Short(body));
  }
  if (reply.contains("error")) {
    const json& e = reply["error"];
    const std::string msg = e.is_object() ? e.value("message", e.dump()) : e.dump();
    return InvalidArgument(where + ": JSON-RPC error " +
                           (e.is_object() ? std::to_string(e.value("code", 0)) : "") + ": " + msg);
  }
  if (r->status >= 300) {
    return Unavailable(where + ": HTTP " + std::to_string(r->status) + ": " + Short(body));
  }
  return reply;
}

Status McpHttpClient::Initialize() {
  session_.clear();
  auto r = Post({{"jsonrpc", "2.0"},
                 {"id", next_id_++},
                 {"method", "initialize"},
                 {"params",
                  {{"protocolVersion", kProtocolVersion},
                   {"capabilities", json::object()},
                   {"clientInfo", {{"name", options_.client_name}, {"version", "1"}}}}}});
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kInvalidArgument) {
      return FailedPrecondition("initialize refused: " + r.status().message());
    }
    return r.status();
  }
  if (!r->contains("result")) {
    return Malformed("initialize: the reply has no result: " + Short(r->dump()));
  }
  auto n = Post({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  return n.ok() ? Status::Ok() : n.status();
}

StatusOr<McpCallReply> McpHttpClient::CallTool(const std::string& tool, const json& arguments) {
  ONLINEPS_ASSIGN_OR_RETURN(json r, Post({{"jsonrpc", "2.0"},
                                          {"id", next_id_++},
                                          {"method", "tools/call"},
                                          {"params", {{"name", tool}, {"arguments", arguments}}}}));
  if (!r.contains("result") || !r["result"].is_object()) {
    return Malformed("tools/call " + tool + ": the reply has no result object: " + Short(r.dump()));
  }
  McpCallReply out;
  out.result = std::move(r["result"]);
  const json& e = out.result.contains("isError") ? out.result["isError"] : json(false);
  out.is_error = e.is_boolean() && e.get<bool>();
  return out;
}

void McpHttpClient::Close() {
  if (session_.empty()) return;
  httplib::Headers h = {{"Mcp-Session-Id", session_}, {"MCP-Protocol-Version", kProtocolVersion}};
  if (!options_.token.empty()) h.emplace("Authorization", "Bearer " + options_.token);
  static_cast<void>(http_->Delete(url_.path, h));
  session_.clear();
}

}  // namespace onlineps::replay
