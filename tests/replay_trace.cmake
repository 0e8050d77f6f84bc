# Trace reader / writer (replay/trace.h), including files the bridge's recorder writes.
onlineps_test(trace_test onlineps_replay_trace onlineps_mcp_bridge)
