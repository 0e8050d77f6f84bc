# Worker tests with libtorch models: model math, the service over a real PS, the worker
# RPC, and multi-process learning through real binaries.
onlineps_test(model_test onlineps_worker_models)
target_compile_definitions(model_test PRIVATE ONLINEPS_TESTDATA_DIR="${CMAKE_SOURCE_DIR}/worker/testdata")
onlineps_test(worker_service_test onlineps_worker_models onlineps_worker_client)
target_compile_definitions(worker_service_test PRIVATE ONLINEPS_TESTDATA_DIR="${CMAKE_SOURCE_DIR}/worker/testdata")
