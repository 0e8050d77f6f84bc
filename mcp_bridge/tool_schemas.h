// The bridge's tool definitions for tools/list (JSON Schema 2020-12). The "session"
// property of each tool carries "x-mcp-header": "Session", so clients of revision
// 2026-07-28 send it as the Mcp-Param-Session header and the bridge can route on it.
#ifndef ONLINEPS_MCP_BRIDGE_TOOL_SCHEMAS_H_
#define ONLINEPS_MCP_BRIDGE_TOOL_SCHEMAS_H_

#include <nlohmann/json.hpp>

namespace onlineps::bridge {

nlohmann::json ToolList();

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_TOOL_SCHEMAS_H_
