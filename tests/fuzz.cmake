# Fuzzing (docs/reliability.md, "Fuzzing"). The libFuzzer targets are a clang project of
# their own (fuzz/CMakeLists.txt, built by scripts/fuzz.sh into build-fuzz/); here, the
# regression inputs they found replay through the same entry points with g++.
add_library(onlineps_fuzz_entries STATIC ${CMAKE_SOURCE_DIR}/fuzz/wire_entry.cc
            ${CMAKE_SOURCE_DIR}/fuzz/mcp_entry.cc ${CMAKE_SOURCE_DIR}/fuzz/trace_entry.cc)
target_link_libraries(onlineps_fuzz_entries PUBLIC onlineps_ps onlineps_mcp_fixtures
                      onlineps_replay_trace)
onlineps_test(fuzz_regression_test onlineps_fuzz_entries onlineps_worker_core)
target_compile_definitions(fuzz_regression_test PRIVATE
                           ONLINEPS_FUZZ_REGRESSIONS="${CMAKE_SOURCE_DIR}/fuzz/regressions")

# Each target for 20 s (after its sanitized regression replay), building build-fuzz/ first
# if needed. Alone, so the fuzzers do not slow the timing-sensitive tests; skipped (77)
# where clang or its libFuzzer runtime is missing.
add_test(NAME Fuzz.Bounded COMMAND ${CMAKE_SOURCE_DIR}/scripts/fuzz.sh 20)
set_tests_properties(Fuzz.Bounded PROPERTIES LABELS fuzz TIMEOUT 1800 RUN_SERIAL TRUE
                     SKIP_RETURN_CODE 77)
