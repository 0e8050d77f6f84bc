// StdioTransport: MCP over stdin/stdout, one JSON-RPC message per line (any bytes but
// '\n', NUL included, up to max_line_bytes), one session per process. Requests run in
// arrival order on one executor thread while the reader keeps reading, so
// notifications/cancelled (which also drops a request still queued) and ping are
// handled during a long call; calls of the tools the bridge answers alone (get_context,
// model_info: McpServer::Ordered) run in order on a second thread, never behind a
// worker call.
// Only MCP messages go to stdout; logs go to stderr. Run() returns when stdin closes
// (after the queued requests finish) or Stop() is called.
#ifndef ONLINEPS_MCP_BRIDGE_STDIO_TRANSPORT_H_
#define ONLINEPS_MCP_BRIDGE_STDIO_TRANSPORT_H_

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "common/mutex.h"
#include "mcp_bridge/mcp_server.h"

namespace onlineps::bridge {

struct StdioTransportOptions {
  size_t max_line_bytes = 4 << 20;
  size_t max_queued = 1024;
};

class StdioTransport {
 public:
  StdioTransport(StdioTransportOptions options, McpServer* server, std::FILE* in = stdin,
                 std::FILE* out = stdout);
  // Serves until EOF on `in`. Returns the number of messages read.
  size_t Run();
  // Waits for a message being written to finish, flushes `out` and ends the process
  // with `code` (for a shutdown signal while Run() blocks reading).
  [[noreturn]] void FlushAndExit(int code);

 private:
  void Write(const nlohmann::json& message);
  void WriteLine(std::string line);  // one serialized message; the newline is added

  const StdioTransportOptions options_;
  McpServer* const mcp_;
  std::FILE* const in_;
  std::FILE* const out_;
  Mutex out_mu_;
  Mutex session_mu_;
  std::string session_id_ GUARDED_BY(session_mu_);  // set by initialize
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_STDIO_TRANSPORT_H_
