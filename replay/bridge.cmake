# --bridge: the paced replay of a trace's tool calls against a running bridge, over the
# shared MCP client (common/mcp_client.h). Torch-free.
add_library(onlineps_replay_bridge bridge_replay.cc)
target_link_libraries(onlineps_replay_bridge PUBLIC onlineps_replay_core onlineps_replay_trace
                                                    onlineps_mcp_client Threads::Threads)
