// HttpTransport: MCP Streamable HTTP on one endpoint (/mcp). POST carries one JSON-RPC
// message (answered as application/json, or as text/event-stream when progress will be
// sent); GET answers 405 (no standalone stream); DELETE ends a session. Checks, in
// order: Host (DNS-rebinding protection), Origin, bearer token, method, Content-Type,
// Accept, body size, JSON, then the MCP rules of McpServer. Each refusal has a status
// code and a JSON-RPC error body saying why. Start/Stop from one owning thread.
//
// Event-driven (Boost.Beast over Asio): io_threads wait on every socket at once, so an
// idle or slow connection holds memory and a file descriptor, never a thread; a complete
// request runs on one of `threads` request threads (a tool call blocks on its worker
// there), which hands the answer back to the connection. Connections are capped per
// client address and in total (past a cap: 503 and close).
#ifndef ONLINEPS_MCP_BRIDGE_HTTP_TRANSPORT_H_
#define ONLINEPS_MCP_BRIDGE_HTTP_TRANSPORT_H_

#include <chrono>
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
  size_t max_header_bytes = 16 << 10;  // request line + headers; past it: 431
  // Requests run at once (each holds a thread until its answer); idle connections hold none.
  int threads = 64;
  // Threads reading and writing every socket. With 2 or more, a request that arrives
  // while another I/O thread is free runs on the thread that read it (no hand-off; at
  // most io_threads - 1 at once, so one always serves the sockets); the rest go to the
  // request threads. 1: every request goes to a request thread.
  int io_threads = 2;
  // From accept to the end of the first request's headers: a client that connects and
  // sends nothing is closed after this, whatever the keep-alive time.
  std::chrono::milliseconds first_request_timeout{5000};
  int keep_alive_s = 60;  // a kept-alive connection may wait this long for its next request
  std::chrono::milliseconds read_timeout{30000};   // from the headers to the end of the body
  std::chrono::milliseconds write_timeout{30000};  // a client that does not read its answer
  size_t keep_alive_requests = 100000;             // requests per connection before it is closed
  // Stop() answers every request already read, for up to this long, before it closes.
  std::chrono::milliseconds drain_timeout{35000};
  // Open connections per client address (IPv4, or IPv6 /64; not 127.0.0.1 and ::1, where
  // a local proxy or sidecar connects for every client) and in total.
  size_t max_connections_per_address = 512;
  size_t max_connections = 10000;
};

struct HttpTransportStats {
  uint64_t open = 0;                 // connections open now
  uint64_t refused_per_address = 0;  // answered 503: --max-connections-per-address
  uint64_t refused_total = 0;        // answered 503: --max-connections
  // Closed by a timeout: no first request, keep-alive idle, body or answer too slow.
  uint64_t timed_out = 0;
  // Responses sent, by HTTP status (100..599; statuses never sent are left out).
  std::map<int, uint64_t> responses;
};

class HttpTransport {
 public:
  class Impl;  // defined in the .cc; public so its connection objects can name it

  HttpTransport(HttpTransportOptions options, McpServer* server);
  ~HttpTransport();  // Stop()s

  // Binds and serves on background threads; returns the bound port.
  StatusOr<int> Start();
  void Stop();
  HttpTransportStats stats() const;  // thread-safe

 private:
  std::unique_ptr<Impl> impl_;  // keeps Beast and Asio out of includers
};

// Loads "--tokens-file": one "identity token" pair per line (# comments). Errors name the
// line. An identity is 1-64 of [A-Za-z0-9._-]; a token at least 16 characters.
StatusOr<std::map<std::string, std::string>> LoadTokens(const std::string& path);

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_HTTP_TRANSPORT_H_
