// onlineps_mcp_bridge: serves MCP (Streamable HTTP or stdio) to agents and routes each
// session to one onlineps worker (mcp_bridge/bridge_app.h).
#include "mcp_bridge/bridge_app.h"

int main(int argc, char** argv) { return onlineps::bridge::RunBridge(argc, argv); }
