# --bridge: an MCP client over Streamable HTTP and the paced replay of a trace's tool
# calls against a running bridge. Torch-free.
add_library(onlineps_replay_bridge mcp_client.cc bridge_replay.cc)
target_link_libraries(onlineps_replay_bridge PUBLIC onlineps_replay_core onlineps_replay_trace
                                                    PkgConfig::HTTPLIB Threads::Threads)
