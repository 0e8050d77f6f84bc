// McpHttpClient: one MCP session over Streamable HTTP (JSON or SSE replies), as an
// agent would open it: initialize, notifications/initialized, then tools/call with the
// Mcp-Session-Id the server gave. Used by the replay tool's --bridge mode; tests and
// benchmarks may use it too. Thread-compatible: one thread per object.
#ifndef ONLINEPS_REPLAY_MCP_CLIENT_H_
#define ONLINEPS_REPLAY_MCP_CLIENT_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace httplib {
class Client;
}

namespace onlineps::replay {

// "http://host:port/path" split up; https is not supported (no TLS in this build).
struct McpUrl {
  std::string scheme_host_port;  // "http://host:port"
  std::string path;              // "/mcp" when the URL has none
};
// kInvalidArgument naming the URL for anything but http://HOST[:PORT][/PATH].
StatusOr<McpUrl> ParseMcpUrl(const std::string& url);

struct McpClientOptions {
  std::string token;  // bearer token ("" : none)
  int timeout_ms = 30000;
  std::string client_name = "onlineps_replay";
};

// A tools/call's reply: the result object, or the JSON-RPC error.
struct McpCallReply {
  nlohmann::json result;  // the JSON-RPC result (content, structuredContent, isError)
  bool is_error = false;  // result.isError
};

class McpHttpClient {
 public:
  McpHttpClient(const McpUrl& url, McpClientOptions options);
  ~McpHttpClient();

  // initialize + notifications/initialized. kUnavailable when the server cannot be
  // reached; a refusal (401/403, a bad protocol version) is kFailedPrecondition with
  // the server's message.
  Status Initialize();
  // tools/call. Transport or HTTP failures are errors naming the status; a JSON-RPC
  // error is kInvalidArgument with its message; kNotFound when the server no longer
  // knows the session (HTTP 404: call Initialize again for a new one). A tool error is
  // not an error here: it is McpCallReply::is_error.
  StatusOr<McpCallReply> CallTool(const std::string& tool, const nlohmann::json& arguments);
  // DELETE the session (best effort).
  void Close();
  const std::string& session_id() const { return session_; }

 private:
  StatusOr<nlohmann::json> Post(const nlohmann::json& message);

  McpUrl url_;
  McpClientOptions options_;
  std::unique_ptr<httplib::Client> http_;
  std::string session_;
  int64_t next_id_ = 1;
};

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_MCP_CLIENT_H_
