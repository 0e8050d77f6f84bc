# The deterministic fault simulation of shard replication (tests/replica_sim.h): a library
# shared by the CI test (a few hundred seeds) and onlineps_replica_sim (the long mode).
add_library(onlineps_replica_sim_lib STATIC sim_etcd.cc replica_sim.cc)
target_link_libraries(onlineps_replica_sim_lib PUBLIC onlineps_ps)
onlineps_test(replica_sim_test onlineps_replica_sim_lib)
add_executable(onlineps_replica_sim replica_sim_main.cc)
target_link_libraries(onlineps_replica_sim PRIVATE onlineps_replica_sim_lib)
set_target_properties(onlineps_replica_sim PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
# The etcd client against a real etcd (etcd-server from Debian, started by the test).
onlineps_test(etcd_kv_test onlineps_common)
onlineps_test(replica_group_test onlineps_replica_sim_lib)
