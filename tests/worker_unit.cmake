# Worker unit tests that need no libtorch: cache, context, accumulation (fast to build).
onlineps_test(accumulator_test onlineps_worker_core)
onlineps_test(context_store_test onlineps_worker_core)
onlineps_test(param_cache_test onlineps_worker_core)
onlineps_test(request_limits_test onlineps_worker_core)
onlineps_test(examples_test onlineps_worker_client)
