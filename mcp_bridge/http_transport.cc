#include "mcp_bridge/http_transport.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

namespace onlineps::bridge {

using nlohmann::json;

namespace {

constexpr char kJson[] = "application/json";
constexpr char kSse[] = "text/event-stream";

void ReuseAddrOnly(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// "example.com:8080" -> "example.com"; "[::1]:80" -> "[::1]".
std::string HostName(const std::string& host) {
  if (!host.empty() && host[0] == '[') return Lower(host.substr(0, host.find(']') + 1));
  return Lower(host.substr(0, host.find(':')));
}

bool IsLoopbackName(const std::string& h) {
  return h == "localhost" || h == "127.0.0.1" || h == "[::1]";
}

// "http://localhost:3000" -> host "localhost".
std::string OriginHost(const std::string& origin) {
  const size_t p = origin.find("://");
  if (p == std::string::npos) return "";
  return HostName(origin.substr(p + 3));
}

std::string OriginNoPort(const std::string& origin) {
  const size_t p = origin.find("://");
  if (p == std::string::npos) return origin;
  const std::string rest = origin.substr(p + 3);
  if (!rest.empty() && rest[0] == '[')
    return Lower(origin.substr(0, p + 3) + rest.substr(0, rest.find(']') + 1));
  return Lower(origin.substr(0, p + 3) + rest.substr(0, rest.find(':')));
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

void SendError(httplib::Response& res, int status, int code, const std::string& message,
               const json& id = nullptr, const json& data = nullptr) {
  res.status = status;
  // Messages may quote header values: never let a bad byte turn a 4xx into a 500.
  res.set_content(
      JsonRpcError(id, code, message, data).dump(-1, ' ', false, json::error_handler_t::replace),
      kJson);
}

// Mcp-Param-* values that are not plain ASCII arrive as =?base64?...?= (padded base64);
// nullopt for a malformed encoding.
std::optional<std::string> DecodeHeaderValue(const std::string& v) {
  if (v.size() < 11 || v.rfind("=?base64?", 0) != 0 || v.substr(v.size() - 2) != "?=") return v;
  const std::string b64 = v.substr(9, v.size() - 11);
  if (b64.size() % 4 != 0) return std::nullopt;
  static const std::string kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (size_t i = 0; i < b64.size(); ++i) {
    if (b64[i] == '=') {
      if (i + 2 < b64.size() || b64.find_first_not_of('=', i) != std::string::npos) {
        return std::nullopt;
      }
      break;
    }
    const size_t pos = kAlphabet.find(b64[i]);
    if (pos == std::string::npos) return std::nullopt;
    val = ((val << 6) + static_cast<int>(pos)) & 0xffffff;
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xff));
      bits -= 8;
    }
  }
  return out;
}

}  // namespace

StatusOr<std::map<std::string, std::string>> LoadTokens(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("--tokens-file " + path + ": cannot open");
  std::map<std::string, std::string> tokens;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string identity, token, extra;
    ls >> identity >> token >> extra;
    const std::string where = path + ":" + std::to_string(n) + ": ";
    if (identity.empty() || token.empty() || !extra.empty()) {
      return InvalidArgument(where + "expected 'identity token'");
    }
    if (identity.size() > 64 ||
        identity.find_first_not_of(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
            std::string::npos) {
      return InvalidArgument(where + "identity must be 1-64 of [A-Za-z0-9._-]");
    }
    if (token.size() < 16) return InvalidArgument(where + "token is shorter than 16 characters");
    if (!tokens.emplace(token, identity).second) return InvalidArgument(where + "duplicate token");
  }
  if (tokens.empty()) return InvalidArgument("--tokens-file " + path + ": no tokens");
  return tokens;
}

class HttpTransport::Impl {
 public:
  Impl(HttpTransportOptions options, McpServer* server)
      : options_(std::move(options)), mcp_(server) {
    Configure();
  }
  StatusOr<int> Start();
  void Stop();

 private:
  void Configure();
  // Host, Origin and token checks shared by every method. Sets `principal`.
  bool Admit(const httplib::Request& req, httplib::Response& res, std::string* principal);
  void Post(const httplib::Request& req, httplib::Response& res);
  void Delete(const httplib::Request& req, httplib::Response& res);
  // Revision 2026-07-28 header rules; false with the error set.
  bool CheckModernHeaders(const httplib::Request& req, const json& m, httplib::Response& res);
  void Respond(httplib::Response& res, const Reply& r);

  const HttpTransportOptions options_;
  McpServer* const mcp_;
  httplib::Server server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
};

void HttpTransport::Impl::Configure() {
  const int threads = std::max(2, options_.threads);
  server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_.set_socket_options(ReuseAddrOnly);
  server_.set_tcp_nodelay(true);  // headers and body go out as separate writes
  server_.set_payload_max_length(options_.max_request_bytes);
  server_.set_keep_alive_timeout(options_.keep_alive_s);
  server_.set_keep_alive_max_count(options_.keep_alive_requests);
  server_.set_read_timeout(30, 0);
  server_.set_write_timeout(30, 0);
  server_.Post(options_.path,
               [this](const httplib::Request& q, httplib::Response& r) { Post(q, r); });
  server_.Delete(options_.path,
                 [this](const httplib::Request& q, httplib::Response& r) { Delete(q, r); });
  server_.Get(options_.path, [this](const httplib::Request& q, httplib::Response& r) {
    std::string principal;
    if (!Admit(q, r, &principal)) return;
    r.set_header("Allow", "POST, DELETE");
    SendError(r, 405, kServerError,
              "Method Not Allowed: this server offers no standalone SSE stream; POST requests");
  });
  server_.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      SendError(res, 413, kInvalidRequest, "request body is larger than --max-request-bytes");
    } else if (res.status == 404) {
      SendError(res, 404, kServerError, "no such path: MCP is served on the configured --path");
    }
  });
  server_.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        SendError(res, 500, kInternalError, "internal error: " + what);
      });
}

bool HttpTransport::Impl::Admit(const httplib::Request& req, httplib::Response& res,
                                std::string* principal) {
  const std::string host = HostName(req.get_header_value("Host"));
  if (!options_.allowed_hosts.empty() &&
      std::find(options_.allowed_hosts.begin(), options_.allowed_hosts.end(), host) ==
          options_.allowed_hosts.end()) {
    SendError(res, 403, kServerError,
              "Forbidden: Host '" + host +
                  "' is not allowed (--allowed-hosts; DNS-rebinding "
                  "protection)");
    return false;
  }
  if (req.has_header("Origin")) {
    const std::string origin = Lower(req.get_header_value("Origin"));
    bool ok;
    if (options_.allowed_origins.empty()) {
      ok = IsLoopbackName(OriginHost(origin));
    } else {
      ok = std::find(options_.allowed_origins.begin(), options_.allowed_origins.end(), origin) !=
               options_.allowed_origins.end() ||
           std::find(options_.allowed_origins.begin(), options_.allowed_origins.end(),
                     OriginNoPort(origin)) != options_.allowed_origins.end();
    }
    if (!ok) {
      SendError(res, 403, kServerError,
                "Forbidden: Origin '" + origin + "' is not allowed (--allowed-origins)");
      return false;
    }
  }
  if (!options_.tokens.empty()) {
    const std::string auth = req.get_header_value("Authorization");
    std::string token =
        auth.size() > 7 && Lower(auth.substr(0, 7)) == "bearer " ? auth.substr(7) : "";
    for (const auto& [t, identity] : options_.tokens) {
      if (ConstantTimeEquals(t, token)) *principal = identity;
    }
    if (principal->empty()) {
      res.set_header("WWW-Authenticate", "Bearer realm=\"onlineps\"");
      SendError(res, 401, kServerError,
                token.empty() ? "Unauthorized: send Authorization: Bearer <token>"
                              : "Unauthorized: the bearer token is not valid");
      return false;
    }
  }
  return true;
}

bool HttpTransport::Impl::CheckModernHeaders(const httplib::Request& req, const json& m,
                                             httplib::Response& res) {
  const json id = m.contains("id") ? m["id"] : json();
  auto mismatch = [&](const std::string& what) {
    SendError(res, 400, kHeaderMismatch, "Header mismatch: " + what, id);
    return false;
  };
  const std::string method = m.value("method", json("")).is_string() ? m.value("method", "") : "";
  if (!req.has_header("Mcp-Method")) return mismatch("the Mcp-Method header is required");
  if (req.get_header_value("Mcp-Method") != method) {
    return mismatch("Mcp-Method '" + req.get_header_value("Mcp-Method") + "' != body method '" +
                    method + "'");
  }
  const json params = m.value("params", json::object());
  const json meta = params.is_object() ? params.value("_meta", json::object()) : json::object();
  if (meta.is_object() && meta.contains("io.modelcontextprotocol/protocolVersion") &&
      meta["io.modelcontextprotocol/protocolVersion"] !=
          req.get_header_value("MCP-Protocol-Version")) {
    return mismatch("MCP-Protocol-Version header != params._meta protocolVersion");
  }
  if (method == "tools/call" || method == "resources/read" || method == "prompts/get") {
    const std::string key = method == "resources/read" ? "uri" : "name";
    const json name = params.is_object() ? params.value(key, json()) : json();
    if (!req.has_header("Mcp-Name")) return mismatch("the Mcp-Name header is required");
    const auto header_name = DecodeHeaderValue(req.get_header_value("Mcp-Name"));
    if (!header_name) return mismatch("Mcp-Name is not valid =?base64?...?= encoding");
    if (!name.is_string() || *header_name != name.get<std::string>()) {
      return mismatch("Mcp-Name header != params." + key);
    }
  }
  if (method == "tools/call") {
    const json args = params.value("arguments", json::object());
    const bool in_body = args.is_object() && args.contains("session");
    const bool in_header = req.has_header("Mcp-Param-Session");
    if (in_body && !in_header) {
      return mismatch("arguments.session is set but the Mcp-Param-Session header is missing");
    }
    if (in_header && !in_body) {
      return mismatch("the Mcp-Param-Session header is set but arguments.session is not");
    }
    const auto header_session = DecodeHeaderValue(req.get_header_value("Mcp-Param-Session"));
    if (in_header && !header_session) {
      return mismatch("Mcp-Param-Session is not valid =?base64?...?= encoding");
    }
    if (in_body &&
        (!args["session"].is_string() || *header_session != args["session"].get<std::string>())) {
      return mismatch("the Mcp-Param-Session header and arguments.session differ");
    }
  }
  return true;
}

void HttpTransport::Impl::Respond(httplib::Response& res, const Reply& r) {
  res.status = r.http_status;
  if (!r.new_session_id.empty()) res.set_header("Mcp-Session-Id", r.new_session_id);
  if (!r.body.is_null()) {
    res.set_content(r.body.dump(-1, ' ', false, json::error_handler_t::replace), kJson);
  }
}

void HttpTransport::Impl::Post(const httplib::Request& req, httplib::Response& res) {
  std::string principal;
  if (!Admit(req, res, &principal)) return;
  const std::string ctype = Lower(req.get_header_value("Content-Type"));
  if (ctype.rfind(kJson, 0) != 0) {
    SendError(res, 415, kServerError,
              "Unsupported Media Type: Content-Type must be application/json");
    return;
  }
  const std::string accept = Lower(req.get_header_value("Accept"));
  const bool any = accept.find("*/*") != std::string::npos;
  if (!any && (accept.find(kJson) == std::string::npos || accept.find(kSse) == std::string::npos)) {
    SendError(res, 406, kServerError,
              "Not Acceptable: Accept must list both application/json and text/event-stream");
    return;
  }
  if (NestsDeeperThan(req.body, kMaxJsonDepth)) {
    SendError(res, 400, kInvalidRequest,
              "Invalid Request: the body nests arrays or objects deeper than " +
                  std::to_string(kMaxJsonDepth) + " levels");
    return;
  }
  json m = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded()) {
    SendError(res, 400, kParseError, "Parse error: the body is not valid JSON");
    return;
  }
  Request r;
  r.principal = principal;
  r.session_id = req.get_header_value("Mcp-Session-Id");
  r.header_version = req.get_header_value("MCP-Protocol-Version");
  const RevisionChoice revision =
      ChooseRevision(m, r.session_id, r.header_version, TransportKind::kHttp);
  if (revision.refused()) {
    res.status = *revision.http_status;
    res.set_content(revision.body.dump(-1, ' ', false, json::error_handler_t::replace), kJson);
    return;
  }
  r.stateless = revision.stateless;
  if (r.stateless && m.is_object() && !CheckModernHeaders(req, m, res)) return;
  const bool stream =
      mcp_->WantsStream(m) && (r.stateless || mcp_->HasSession(r.session_id, r.principal));
  if (!stream) {
    r.message = std::move(m);
    Respond(res, mcp_->Handle(r));
    return;
  }
  // Streamed: progress notifications, then the response, as SSE events.
  r.message = std::move(m);
  res.set_header("Cache-Control", "no-cache");
  auto request = std::make_shared<Request>(std::move(r));
  res.set_chunked_content_provider(kSse, [this, request](size_t, httplib::DataSink& sink) {
    auto send = [&sink](const json& msg) {
      const std::string event =
          "event: message\ndata: " + msg.dump(-1, ' ', false, json::error_handler_t::replace) +
          "\n\n";
      return sink.write(event.data(), event.size());
    };
    request->notify = [&send](const json& n) { send(n); };
    Reply reply = mcp_->Handle(*request);
    if (!reply.body.is_null()) send(reply.body);
    sink.done();
    return true;
  });
}

void HttpTransport::Impl::Delete(const httplib::Request& req, httplib::Response& res) {
  std::string principal;
  if (!Admit(req, res, &principal)) return;
  const std::string sid = req.get_header_value("Mcp-Session-Id");
  if (sid.empty()) {
    SendError(res, 400, kServerError, "Bad Request: Mcp-Session-Id header is required");
    return;
  }
  if (!mcp_->EndSession(sid, principal)) {
    SendError(res, 404, kSessionNotFound, "Session not found");
    return;
  }
  res.status = 200;
}

StatusOr<int> HttpTransport::Impl::Start() {
  int bound = options_.port;
  if (options_.port == 0) {
    bound = server_.bind_to_any_port(options_.host);
  } else if (!server_.bind_to_port(options_.host, options_.port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return Unavailable("cannot bind " + options_.host + ":" + std::to_string(options_.port));
  }
  thread_ = std::thread([this] {
    server_.listen_after_bind();
    listen_returned_ = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!server_.is_running() && !listen_returned_ &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_.is_running()) {
    Stop();
    return Internal("HTTP server did not start");
  }
  return bound;
}

void HttpTransport::Impl::Stop() {
  if (!thread_.joinable()) return;
  server_.stop();
  thread_.join();
}

HttpTransport::HttpTransport(HttpTransportOptions options, McpServer* server)
    : impl_(std::make_unique<Impl>(std::move(options), server)) {}
HttpTransport::~HttpTransport() { Stop(); }
StatusOr<int> HttpTransport::Start() { return impl_->Start(); }
void HttpTransport::Stop() { impl_->Stop(); }

}  // namespace onlineps::bridge
