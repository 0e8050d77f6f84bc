#include "common/mcp_client.h"

#include <algorithm>
#include <regex>
#include <utility>

namespace onlineps {
namespace {

using nlohmann::json;

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

McpUrl LoopbackMcpUrl(int port) { return {"http://127.0.0.1:" + std::to_string(port), "/mcp"}; }

std::vector<json> ParseSseMessages(const std::string& body) {
  std::vector<json> out;
  std::string data;
  bool have_data = false;
  auto dispatch = [&] {
    if (have_data) out.push_back(json::parse(data, nullptr, false));
    data.clear();
    have_data = false;
  };
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      dispatch();  // a blank line ends an event
    } else if (line.rfind("data:", 0) == 0) {
      if (have_data) data += '\n';
      data += line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
      have_data = true;
    }
    pos = end + 1;
  }
  dispatch();  // the last event of a body cut without its blank line
  return out;
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

void McpHttpClient::set_keep_alive(bool on) { http_->set_keep_alive(on); }

httplib::Headers McpHttpClient::Headers() const {
  httplib::Headers h = {{"Accept", "application/json, text/event-stream"}};
  if (!session_.empty()) h.emplace("Mcp-Session-Id", session_);
  if (!protocol_version_.empty()) h.emplace("MCP-Protocol-Version", protocol_version_);
  if (!options_.token.empty()) h.emplace("Authorization", "Bearer " + options_.token);
  return h;
}

McpHttpReply McpHttpClient::Post(const std::string& body, const httplib::Headers& headers,
                                 const std::string& content_type) {
  McpHttpReply out;
  auto r = http_->Post(url_.path, headers, body, content_type);
  if (!r) {
    out.error = r.error();
    return out;
  }
  out.status = r->status;
  out.raw = std::move(r->body);
  out.session_id = r->get_header_value("Mcp-Session-Id");
  out.content_type = r->get_header_value("Content-Type");
  if (out.content_type.rfind("text/event-stream", 0) == 0) {
    out.events = ParseSseMessages(out.raw);
    if (!out.events.empty()) out.body = out.events.back();
  } else if (!out.raw.empty()) {
    out.body = json::parse(out.raw, nullptr, false);
  }
  return out;
}

int McpHttpClient::Delete() {
  auto r = http_->Delete(url_.path, Headers());
  return r ? r->status : 0;
}

StatusOr<json> McpHttpClient::Rpc(const json& message, McpHttpReply* reply) {
  McpHttpReply own;
  McpHttpReply& r = reply ? *reply : own;
  r = Send(message);
  const std::string where = url_.scheme_host_port + url_.path;
  if (r.status == 0) {
    // httplib names a refused or unreachable connect only "Connection".
    const std::string what = r.error == httplib::Error::Connection
                                 ? "cannot connect (nothing listening there, or the host is "
                                   "unreachable)"
                                 : httplib::to_string(r.error);
    if (r.error == httplib::Error::Read || r.error == httplib::Error::Write) {
      return DeadlineExceeded(where + ": " + what + " (no reply within " +
                              std::to_string(options_.timeout_ms) + " ms?)");
    }
    return Unavailable(where + ": " + what);
  }
  const std::string status = "HTTP " + std::to_string(r.status);
  if (r.status == 404 && !session_.empty()) {
    return NotFound(where + " no longer knows session " + session_ + ": " + Short(r.raw));
  }
  if (r.status == 401 || r.status == 403) {
    return FailedPrecondition(where + " refused the call (" + status + "): " + Short(r.raw));
  }
  if (r.status == 429 || r.status == 503) {
    return Unavailable(where + " is busy (" + status + "): " + Short(r.raw));
  }
  if (r.status == 202 || r.body.is_null()) {
    if (r.status >= 300) return Unavailable(where + ": " + status);
    return json();
  }
  if (r.body.is_discarded() || !r.body.is_object()) {
    return Malformed(where + ": " + status +
                     " with a body that is not a JSON-RPC message: " + Short(r.raw));
  }
  if (r.body.contains("error")) {
    const json& e = r.body["error"];
    const std::string msg = e.is_object() ? e.value("message", e.dump()) : e.dump();
    return InvalidArgument(where + ": JSON-RPC error " +
                           (e.is_object() ? std::to_string(e.value("code", 0)) : "") + ": " + msg);
  }
  if (r.status >= 300) return Unavailable(where + ": " + status + ": " + Short(r.raw));
  return r.body;
}

Status McpHttpClient::Initialize(const std::string& protocol_version) {
  session_.clear();
  protocol_version_.clear();
  McpHttpReply raw;
  auto r = Rpc({{"jsonrpc", "2.0"},
                {"id", NextId()},
                {"method", "initialize"},
                {"params",
                 {{"protocolVersion", protocol_version},
                  {"capabilities", json::object()},
                  {"clientInfo", {{"name", options_.client_name}, {"version", "1"}}}}}},
               &raw);
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kInvalidArgument) {
      return FailedPrecondition("initialize refused: " + r.status().message());
    }
    return r.status();
  }
  if (!r->contains("result") || !(*r)["result"].is_object()) {
    return Malformed("initialize: the reply has no result: " + Short(r->dump()));
  }
  session_ = raw.session_id;
  const json& chosen = (*r)["result"].value("protocolVersion", json());
  protocol_version_ = chosen.is_string() ? chosen.get<std::string>() : protocol_version;
  auto n = Rpc({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  return n.ok() ? Status::Ok() : n.status();
}

json McpHttpClient::ToolCallRequest(const std::string& tool, const json& arguments) {
  return {{"jsonrpc", "2.0"},
          {"id", NextId()},
          {"method", "tools/call"},
          {"params", {{"name", tool}, {"arguments", arguments}}}};
}

StatusOr<McpCallReply> McpHttpClient::CallTool(const std::string& tool, const json& arguments) {
  ONLINEPS_ASSIGN_OR_RETURN(json r, Rpc(ToolCallRequest(tool, arguments)));
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
  static_cast<void>(Delete());
  session_.clear();
  protocol_version_.clear();
}

}  // namespace onlineps
