# MCP bridge through the real binaries: a PS shard, text-model workers and the bridge
# on loopback, driven over HTTP.
foreach(t bridge_http_test bridge_routing_test bridge_restart_test)
  onlineps_test(${t} onlineps_ps onlineps_mcp_client)
  target_compile_definitions(${t} PRIVATE ONLINEPS_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
  add_dependencies(${t} onlineps_ps_server onlineps_worker onlineps_mcp_bridge_bin)
endforeach()
