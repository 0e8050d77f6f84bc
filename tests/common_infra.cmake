# Config, logging and admin-server tests (common/config, common/logging, common/admin_server).
onlineps_test(config_test onlineps_common)
onlineps_test(logging_test onlineps_common)
onlineps_test(admin_server_test onlineps_common)
onlineps_test(hash_test onlineps_common)
