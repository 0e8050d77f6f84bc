// RunBridge: the whole onlineps_mcp_bridge process (flags, workers, sessions, transports,
// admin port) until SIGTERM or, on stdio, the end of stdin. `extend`, when set, is called
// once with the McpServer before it serves, to register more tools, methods or
// capabilities (a test binary's fixtures). Blocks; returns the process exit code.
#ifndef ONLINEPS_MCP_BRIDGE_BRIDGE_APP_H_
#define ONLINEPS_MCP_BRIDGE_BRIDGE_APP_H_

#include <functional>

#include "mcp_bridge/mcp_server.h"

namespace onlineps::bridge {

int RunBridge(int argc, char** argv, const std::function<void(McpServer*)>& extend = nullptr);

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_BRIDGE_APP_H_
