// HttpTransport: MCP Streamable HTTP on one endpoint (/mcp). POST carries one JSON-RPC
// message (answered as application/json, or as text/event-stream when progress will be
// sent); GET answers 405 (no standalone stream); DELETE ends a session. Checks, in
// order: Host (DNS-rebinding protection), Origin, bearer token, method, Content-Type,
// Accept, body size, JSON, then the MCP rules of McpServer. Each refusal has a status
// code and a JSON-RPC error body saying why. Start/Stop from one owning thread.
#ifndef ONLINEPS_MCP_BRIDGE_HTTP_TRANSPORT_H_
#define ONLINEPS_MCP_BRIDGE_HTTP_TRANSPORT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "mcp_bridge/mcp_server.h"

namespace onlineps::bridge {

struct HttpTransportOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  std::string path = "/mcp";
  // Host header names accepted (any port); empty: any. Default: loopback names.
  std::vector<std::string> allowed_hosts = {"localhost", "127.0.0.1", "[::1]"};
  // Origin values accepted when the header is present (scheme://host[:port], or
  // scheme://host to allow any port); empty list: only loopback origins.
  std::vector<std::string> allowed_origins;
  std::map<std::string, std::string> tokens;  // bearer token -> identity; empty: no auth
  size_t max_request_bytes = 4 << 20;
  // Connections served at once: each open connection, idle keep-alive ones too, holds
  // one thread until keep_alive_s passes without a request.
  int threads = 256;
  int keep_alive_s = 5;
  size_t keep_alive_requests = 100000;  // requests per connection before it is closed
};

class HttpTransport {
 public:
  HttpTransport(HttpTransportOptions options, McpServer* server);
  ~HttpTransport();  // Stop()s

  // Binds and serves on background threads; returns the bound port.
  StatusOr<int> Start();
  void Stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;  // keeps httplib.h out of includers
};

// Loads "--tokens-file": one "identity token" pair per line (# comments). Errors name the
// line. An identity is 1-64 of [A-Za-z0-9._-]; a token at least 16 characters.
StatusOr<std::map<std::string, std::string>> LoadTokens(const std::string& path);

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_HTTP_TRANSPORT_H_
