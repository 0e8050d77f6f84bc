# The replayer (torch-free) and the onlineps_replay tool (links the libtorch models;
# its own .cc files include no torch header).
add_library(onlineps_replay_core
  staleness_stats.cc
  models.cc
  batches.cc
  trace_steps.cc
  replayer.cc
  report.cc
)
target_link_libraries(onlineps_replay_core PUBLIC
  onlineps_worker_core onlineps_ps onlineps_replay_trace onlineps_replay_data
  onlineps_replay_schedule)

# The commit at configure time, for manifests and trace headers.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                OUTPUT_VARIABLE ONLINEPS_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET)
add_executable(onlineps_replay replay_main.cc replay_flags.cc)
set_target_properties(onlineps_replay PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
target_compile_definitions(onlineps_replay PRIVATE ONLINEPS_GIT_COMMIT="${ONLINEPS_GIT_COMMIT}")
target_link_libraries(onlineps_replay PRIVATE onlineps_replay_core onlineps_replay_bridge
                                              onlineps_worker_models onlineps_flags)
onlineps_use_malloc(onlineps_replay)
