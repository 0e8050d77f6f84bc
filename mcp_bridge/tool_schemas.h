// The declarations (tools/list entries, JSON Schema 2020-12) of the bridge's tools. The
// "session" property of each tool carries "x-mcp-header": "Session", so clients of
// revision 2026-07-28 send it as the Mcp-Param-Session header and the bridge can route
// on it. infer and learn take examples by the rule of worker/examples.h, whose schema
// they embed. Stateless.
#ifndef ONLINEPS_MCP_BRIDGE_TOOL_SCHEMAS_H_
#define ONLINEPS_MCP_BRIDGE_TOOL_SCHEMAS_H_

#include <nlohmann/json.hpp>

namespace onlineps::bridge {

nlohmann::json InferTool();
nlohmann::json LearnTool();
nlohmann::json SetContextTool();
nlohmann::json AppendContextTool();
nlohmann::json ClearContextTool();
nlohmann::json GetContextTool();
nlohmann::json ModelInfoTool();

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_TOOL_SCHEMAS_H_
