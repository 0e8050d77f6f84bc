onlineps_test(replay_test onlineps_replay_core)
# The MCP client that replay --bridge, the bridge tests and bridge_bench share.
onlineps_test(mcp_client_test onlineps_mcp_client)

# A trace recorded from the live bridge, replayed twice in logical mode (real processes).
add_test(NAME Replay.TraceFromLiveBridge
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/replay_trace_test.py)
set_tests_properties(Replay.TraceFromLiveBridge PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 300
  LABELS "replay")

# A recording sent to a running bridge over MCP with onlineps_replay --bridge (real processes).
add_test(NAME Replay.TraceOnBridge
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/replay_bridge_test.py)
set_tests_properties(Replay.TraceOnBridge PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 300
  LABELS "replay")
