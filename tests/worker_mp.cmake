# Multi-process worker tests: real onlineps_ps shards and onlineps_worker processes on
# loopback, learning real data sets through the worker RPC.
onlineps_test(worker_multiprocess_test onlineps_worker_client onlineps_ps)
target_compile_definitions(
  worker_multiprocess_test PRIVATE ONLINEPS_BIN_DIR="${CMAKE_BINARY_DIR}/bin"
                                   ONLINEPS_TESTDATA_DIR="${CMAKE_SOURCE_DIR}/worker/testdata")
add_dependencies(worker_multiprocess_test onlineps_ps_server onlineps_worker)
