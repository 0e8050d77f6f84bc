# MCP client tests: the official TypeScript SDK clients (tests/mcp/, node:test) against the real
# bridge, PS and worker binaries. tests/mcp/run.sh runs `npm ci` when node_modules is missing or
# stale (a failed install fails the test) and then `node --test FILE`. Needs node >= 20 and npm
# on PATH and the npm registry (or a filled npm cache) on first run; configure with
# -DONLINEPS_MCP_CLIENT_TESTS=OFF to leave these tests out.
option(ONLINEPS_MCP_CLIENT_TESTS "Register the MCP TypeScript-SDK client tests (node, npm)" ON)

if(ONLINEPS_MCP_CLIENT_TESTS)
  set(_mcp_dir ${CMAKE_CURRENT_SOURCE_DIR}/mcp)
  foreach(_mcp_test sdk_http sdk_stdio sdk_modern)
    add_test(NAME McpSdk.${_mcp_test}
             COMMAND bash ${_mcp_dir}/run.sh ${_mcp_test}.test.mjs
             WORKING_DIRECTORY ${_mcp_dir})
    set_tests_properties(McpSdk.${_mcp_test} PROPERTIES
      ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
      TIMEOUT 180
      LABELS "mcp;node")
  endforeach()
endif()
