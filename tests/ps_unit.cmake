# Unit tests of the parameter-server internals (ps/): tables, dedup windows,
# checkpoints, and the shard server over every transport.
onlineps_test(table_test onlineps_ps)
onlineps_test(dedup_test onlineps_ps)
onlineps_test(checkpoint_test onlineps_ps)
onlineps_test(shard_server_test onlineps_ps)
