# Config, logging, admin-server and periodic-thread tests (common/config, common/logging,
# common/admin_server, common/periodic_thread).
onlineps_test(config_test onlineps_common)
onlineps_test(logging_test onlineps_common)
onlineps_test(admin_server_test onlineps_common)
onlineps_test(periodic_thread_test Threads::Threads)
onlineps_test(hash_test onlineps_common)
