# Soak (docs/reliability.md, "Soak"): 2 shards, 2 workers and the bridge under a mixed
# MCP infer/learn load for 60 s; fails on any error, RSS growth after warm-up, a
# process exit or an unclean shutdown. Alone, so other tests neither slow its calls nor
# blur its RSS and latency figures; the script kills everything at --hard-timeout.
add_test(NAME Soak.Short
         COMMAND python3 ${CMAKE_SOURCE_DIR}/scripts/soak.py --duration 60 --warmup 20
                 --window 20 --hard-timeout 240 --bin-dir ${CMAKE_BINARY_DIR}/bin
                 --out ${CMAKE_BINARY_DIR}/soak-short)
set_tests_properties(Soak.Short PROPERTIES
  TIMEOUT 300
  RUN_SERIAL TRUE
  LABELS "soak")
