# MCP bridge unit tests (no processes, no sockets).
onlineps_test(router_test onlineps_mcp_bridge)
onlineps_test(bridge_context_store_test onlineps_mcp_bridge)
onlineps_test(bridge_state_test onlineps_mcp_bridge)
onlineps_test(mcp_server_test onlineps_mcp_bridge)
