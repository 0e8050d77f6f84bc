# CurveZMQ: key files and the ZeroMQ transport with CURVE (unit), and a real cluster.
onlineps_test(curve_test onlineps_common)
add_test(NAME Security.CurveCluster
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/curve_cluster_test.py)
set_tests_properties(Security.CurveCluster PROPERTIES
  ENVIRONMENT "ONLINEPS_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  TIMEOUT 300
  LABELS "security")
