# MCP conformance suite (npm @modelcontextprotocol/conformance, pinned in tests/conformance/run.sh)
# against the bridge serving the suite's fixtures (onlineps_mcp_bridge_fixtures, testing/), a PS
# shard and a worker; one test per spec
# revision, each with its baseline tests/conformance/expected-failures-<revision>.yml. Needs node
# and npx on PATH and the npm registry (or a filled npm cache); the suite runs on the npm package
# node@22. Shares the switch of the MCP client tests: -DONLINEPS_MCP_CLIENT_TESTS=OFF leaves these
# out too.
if(ONLINEPS_MCP_CLIENT_TESTS)
  foreach(_revision 2025-11-25 2026-07-28)
    string(REPLACE "-" "_" _name ${_revision})
    add_test(NAME McpConformance.Requirements${_name}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/conformance/run.sh ${_revision})
    set_tests_properties(McpConformance.Requirements${_name} PROPERTIES
      ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
      TIMEOUT 300
      LABELS "mcp;node;conformance")
  endforeach()
endif()
