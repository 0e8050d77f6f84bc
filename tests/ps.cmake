# Parameter-server tests (ps/): tables, server, client, checkpoints.
onlineps_test(ps_smoke_test onlineps_ps)
onlineps_test(multiprocess_test onlineps_ps)
target_compile_definitions(multiprocess_test PRIVATE ONLINEPS_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
add_dependencies(multiprocess_test onlineps_ps_server onlineps_ps_cli)
onlineps_test(replication_test onlineps_ps)
target_compile_definitions(replication_test PRIVATE ONLINEPS_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
add_dependencies(replication_test onlineps_ps_server)
# Exactly once through the fault-injecting transport (drops, duplicates, reordering).
onlineps_test(fault_injection_test onlineps_ps onlineps_testing)
# 100 start/stop cycles of 2 shards x 2 workers (real processes), a hard timeout per cycle.
add_test(NAME Cycles.StartStop100
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cycles_test.py --cycles 100 --cycle-timeout 60
                 --bin-dir ${CMAKE_BINARY_DIR}/bin)
set_tests_properties(Cycles.StartStop100 PROPERTIES TIMEOUT 1200 LABELS "cycles")
