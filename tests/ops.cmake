# Operations checks through the real binaries: /metrics of every binary passes
# `promtool check metrics` (promtool unpacked by scripts/setup.sh), probes answer 200.
add_test(NAME Ops.MetricsPassPromtool COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/metrics_lint.sh)
set_tests_properties(Ops.MetricsPassPromtool PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 120
  LABELS "ops")
