# Parameter-server tests (ps/): tables, server, client, checkpoints.
onlineps_test(ps_smoke_test onlineps_ps)
