onlineps_test(replay_test onlineps_replay_core)

# A trace recorded from the live bridge, replayed twice in logical mode (real processes).
add_test(NAME Replay.TraceFromLiveBridge
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/replay_trace_test.py)
set_tests_properties(Replay.TraceFromLiveBridge PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 300
  LABELS "replay")
