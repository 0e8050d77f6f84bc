# Trace reader / writer (docs/trace.md). Torch-free.
add_library(onlineps_replay_trace trace.cc)
target_link_libraries(onlineps_replay_trace PUBLIC onlineps_common nlohmann_json::nlohmann_json)
