# Security (CurveZMQ: key files, the ZeroMQ transport with CURVE, a real cluster) and the
# crash tests of issue 7.
onlineps_test(curve_test onlineps_common)
add_test(NAME Security.CurveCluster
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/curve_cluster_test.py)
set_tests_properties(Security.CurveCluster PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 300
  LABELS "security")

# kill -9 a worker, then the bridge, under MCP learn traffic: no acknowledged learn lost;
# sessions fail over to the live worker; after the bridge restart, 404 and re-initialize.
add_test(NAME Reliability.Kill9WorkerThenBridge
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/crash_test.py)
set_tests_properties(Reliability.Kill9WorkerThenBridge PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 300
  LABELS "reliability")

# The same with --state-dir: after the bridge restarts on its state directory, every
# session goes on (no 404) with its own context.
add_test(NAME Reliability.Kill9WorkerThenBridge.StateDir
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/crash_test.py --state-dir)
set_tests_properties(Reliability.Kill9WorkerThenBridge.StateDir PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 300
  LABELS "reliability")

# Issue 18, finding 4: slowloris connections on the admin ports of a real shard, worker
# and bridge; /livez, /readyz and /metrics keep answering, the deadline closes them.
add_test(NAME Reliability.AdminSlowClients
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/admin_slow_clients_test.py)
set_tests_properties(Reliability.AdminSlowClients PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 300
  LABELS "reliability")
