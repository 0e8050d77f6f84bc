# Operations checks through the real binaries: /metrics of every binary passes
# `promtool check metrics` (promtool unpacked by scripts/setup.sh), probes answer 200.
add_test(NAME Ops.MetricsPassPromtool COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/metrics_lint.sh)
set_tests_properties(Ops.MetricsPassPromtool PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 120
  LABELS "ops")

# The README's run command: serves MCP, and Ctrl-C stops everything with exit 0.
add_test(NAME Ops.RunLocalServesAndStopsOnCtrlC COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/run_local_test.py)
set_tests_properties(Ops.RunLocalServesAndStopsOnCtrlC PROPERTIES
  ENVIRONMENT "ONLINEPS_BUILD_DIR=${CMAKE_BINARY_DIR}"
  TIMEOUT 900
  RUN_SERIAL TRUE
  LABELS "ops")
