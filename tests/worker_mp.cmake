# Multi-process worker tests: real onlineps_ps shards and onlineps_worker processes on
# loopback, learning real data sets through the worker RPC.
onlineps_test(worker_multiprocess_test onlineps_worker_client onlineps_ps)
target_compile_definitions(
  worker_multiprocess_test PRIVATE ONLINEPS_BIN_DIR="${CMAKE_BINARY_DIR}/bin"
                                   ONLINEPS_TESTDATA_DIR="${CMAKE_SOURCE_DIR}/worker/testdata")
add_dependencies(worker_multiprocess_test onlineps_ps_server onlineps_worker)

# Per-request memory bounds: a shard and default-flag workers as processes; the largest
# allowed requests stay under the documented peak RSS, over-limit ones are refused fast.
onlineps_test(worker_limits_test onlineps_worker_client)
target_compile_definitions(worker_limits_test PRIVATE ONLINEPS_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
add_dependencies(worker_limits_test onlineps_ps_server onlineps_worker)
