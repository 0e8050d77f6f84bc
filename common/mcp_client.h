// McpHttpClient: one MCP client session over Streamable HTTP (cpp-httplib), replies as
// JSON or SSE: initialize, notifications/initialized, then requests carrying the
// Mcp-Session-Id the server gave and the protocol version it chose. Two layers:
// Initialize / CallTool / Close turn replies into a Status (the replay tool, benchmarks);
// Headers / Post / Send return the reply as the wire carried it (tests of the bridge's
// HTTP rules). Thread-compatible: one thread per object. Not linked by the PS.
#ifndef ONLINEPS_COMMON_MCP_CLIENT_H_
#define ONLINEPS_COMMON_MCP_CLIENT_H_

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace onlineps {

// The revision Initialize asks for unless told otherwise.
inline constexpr const char* kMcpProtocolVersion = "2025-11-25";

// "http://host:port/path" split up; https is not supported (no TLS in this build).
struct McpUrl {
  std::string scheme_host_port;  // "http://host:port"
  std::string path;              // "/mcp" when the URL has none
};
// kInvalidArgument naming the URL for anything but http://HOST[:PORT][/PATH].
StatusOr<McpUrl> ParseMcpUrl(const std::string& url);
// http://127.0.0.1:PORT/mcp
McpUrl LoopbackMcpUrl(int port);

// The JSON-RPC messages of an SSE body, in order: the data lines of each event joined
// (a body that is not JSON is a discarded value, json::is_discarded()).
std::vector<nlohmann::json> ParseSseMessages(const std::string& body);

struct McpClientOptions {
  std::string token;                     // bearer token ("" : none)
  int timeout_ms = 30000;                // connect, read and write timeout of each HTTP exchange
  std::string client_name = "onlineps";  // clientInfo.name of initialize
};

// One HTTP exchange as the wire carried it.
struct McpHttpReply {
  int status = 0;  // HTTP status; 0: no reply (see `error`)
  httplib::Error error = httplib::Error::Success;
  nlohmann::json body;  // null when empty, discarded when not JSON; the last SSE message
  std::vector<nlohmann::json> events;  // every SSE message (empty for a JSON reply)
  std::string session_id;              // the Mcp-Session-Id header ("" : none)
  std::string content_type;
  std::string raw;  // the body as received
};

// A tools/call's reply: the result object and whether it is a tool error.
struct McpCallReply {
  nlohmann::json result;  // the JSON-RPC result (content, structuredContent, isError)
  bool is_error = false;  // result.isError
};

class McpHttpClient {
 public:
  McpHttpClient(const McpUrl& url, McpClientOptions options);
  ~McpHttpClient();
  McpHttpClient(const McpHttpClient&) = delete;
  McpHttpClient& operator=(const McpHttpClient&) = delete;

  // initialize (asking for `protocol_version`) + notifications/initialized; forgets any
  // earlier session first. kUnavailable when the server cannot be reached; a refusal
  // (401/403, a JSON-RPC error) is kFailedPrecondition with the server's message.
  Status Initialize(const std::string& protocol_version = kMcpProtocolVersion);
  // tools/call. Transport or HTTP failures are errors naming the status; a JSON-RPC
  // error is kInvalidArgument with its message; kNotFound when the server no longer
  // knows the session (HTTP 404: call Initialize again for a new one). A tool error is
  // not an error here: it is McpCallReply::is_error.
  StatusOr<McpCallReply> CallTool(const std::string& tool, const nlohmann::json& arguments);
  // DELETE the session (best effort) and forget it.
  void Close();

  // The headers of a request in this session: Accept, Mcp-Session-Id and
  // MCP-Protocol-Version once known, Authorization with a token.
  httplib::Headers Headers() const;
  // POSTs `body` with exactly `headers`; never fails (status 0 when there is no reply).
  McpHttpReply Post(const std::string& body, const httplib::Headers& headers,
                    const std::string& content_type = "application/json");
  McpHttpReply Send(const nlohmann::json& message) { return Post(message.dump(), Headers()); }
  // A tools/call request, sent with Send.
  McpHttpReply SendToolCall(const std::string& tool, const nlohmann::json& arguments) {
    return Send(ToolCallRequest(tool, arguments));
  }
  // DELETE with Headers(); the HTTP status (0: no reply). The session is kept.
  int Delete();
  // A fresh JSON-RPC request id, unique in this process: clients that share a session
  // (set_session) never send the same id in it, which the spec forbids and the bridge
  // refuses while the first is in flight.
  static int64_t NextId() {
    static std::atomic<int64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  const std::string& session_id() const { return session_; }
  const std::string& protocol_version() const { return protocol_version_; }
  void set_session(std::string session) { session_ = std::move(session); }
  void set_token(std::string token) { options_.token = std::move(token); }
  void set_keep_alive(bool on);

 private:
  nlohmann::json ToolCallRequest(const std::string& tool, const nlohmann::json& arguments);
  // Send, with the reply turned into a Status (see CallTool) or the JSON-RPC message
  // (null for 202 and empty replies).
  StatusOr<nlohmann::json> Rpc(const nlohmann::json& message, McpHttpReply* reply = nullptr);

  const McpUrl url_;
  McpClientOptions options_;
  std::unique_ptr<httplib::Client> http_;
  std::string session_;           // "" : none yet
  std::string protocol_version_;  // negotiated by Initialize ("" : not sent)
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_MCP_CLIENT_H_
