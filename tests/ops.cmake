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

# SIGTERM under load, per binary: drains, exits 0, loses no acknowledged update.
onlineps_test(drain_test onlineps_ps onlineps_worker_client onlineps_mcp_client)
target_compile_definitions(drain_test PRIVATE ONLINEPS_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
add_dependencies(drain_test onlineps_ps_server onlineps_worker onlineps_mcp_bridge_bin)

# PS, workers and the bridge in separate network namespaces (skipped, exit 77, where
# namespaces cannot be created).
add_test(NAME Ops.MultiHostNetworkNamespaces COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/netns_test.py)
set_tests_properties(Ops.MultiHostNetworkNamespaces PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  SKIP_RETURN_CODE 77
  TIMEOUT 300
  LABELS "ops")

# JSON logs stay valid JSON, the config precedence holds, every flag is documented, a
# failed final checkpoint is a non-zero exit.
foreach(check json-logs precedence docs-flags final-checkpoint)
  add_test(NAME Ops.Cli.${check} COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/ops_cli_test.py ${check})
  set_tests_properties(Ops.Cli.${check} PROPERTIES
    ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
    TIMEOUT 180
    LABELS "ops")
endforeach()
# The run command with replicated shards on a local etcd: kill -9 of a primary mid-service.
add_test(NAME Ops.RunLocalReplicatedSurvivesKill9
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/run_local_test.py --replicas 2
                 --base-port 18000 --mcp-port 18400)
set_tests_properties(Ops.RunLocalReplicatedSurvivesKill9 PROPERTIES TIMEOUT 900 LABELS "ops"
                     ENVIRONMENT "ONLINEPS_BUILD_DIR=${CMAKE_BINARY_DIR}")
