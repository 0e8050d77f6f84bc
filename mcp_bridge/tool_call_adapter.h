// ToolCallAdapter: serves the bridge's Tools as McpServer tools. Per call: the "session"
// argument (a client-chosen handle) or else the MCP session as the routing key, the
// per-session rate limit (per identity when stateless), per-session order (CallGate),
// progress notifications, the exception barrier, the CallToolResult (structured content
// plus its text, or isError) and the trace record. `tools` and `recorder` (may be null)
// outlive the adapter. Thread-safe. Tools with an asynchronous form (Tools::Blocks false)
// wait for their session's turn without a thread, and answer from the thread that
// finished them; the others block their thread while their session runs another call.
#ifndef ONLINEPS_MCP_BRIDGE_TOOL_CALL_ADAPTER_H_
#define ONLINEPS_MCP_BRIDGE_TOOL_CALL_ADAPTER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "mcp_bridge/call_gate.h"
#include "mcp_bridge/mcp_server.h"
#include "mcp_bridge/recorder.h"
#include "mcp_bridge/tools.h"

namespace onlineps::bridge {

struct ToolCallAdapterOptions {
  double rate_limit = 0;  // calls per second per session; 0: off
  double rate_burst = 20;
  size_t max_sessions = 10000;  // the rate buckets kept are bounded by twice this
};

// A tool's result as an MCP CallToolResult document: the structured content and its
// text, or isError with the message.
nlohmann::json CallToolResult(ToolResult&& result);
// The same as the Outcome McpServer answers: a successful result of a stateful request
// serialized once (Outcome::result_text, the same bytes as CallToolResult's document
// serialized), the document otherwise.
Outcome ToolOutcome(ToolResult&& result, bool stateless);

class ToolCallAdapter {
 public:
  ToolCallAdapter(ToolCallAdapterOptions options, Tools* tools, Recorder* recorder);

  // One definition per tool of `tools`, in tools/list order; their handlers use this.
  std::vector<ToolDefinition> Definitions();
  // Runs `end` once the calls of session `key` that reach a worker are done, the one
  // running and those waiting (which, their cancel flag set by the session's end, do not
  // run); no call of `key` starts while `end` runs. Blocks: a running call is bounded by
  // its worker deadline (a learn stops at its next chunk).
  void AfterCalls(const std::string& key, const std::function<void()>& end);
  // Called after every call with its trace record. Call before serving.
  void SetObserver(std::function<void(const TraceRecord&)> observer) {
    observer_ = std::move(observer);
  }

 private:
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point at;
  };

  void Call(const std::string& name, const nlohmann::json& arguments, const CallContext& ctx,
            Respond respond);
  // Tools::CallAsync behind the exception barrier; `done` runs once.
  void Run(const ToolCall& call, Tools::ToolDone done);
  bool Allow(const std::string& key);
  // The 429's message: the limit as given, and whose bucket it is.
  std::string RateLimitMessage(bool stateless) const;
  void Trace(const ToolCall& call, const ToolResult& result,
             std::chrono::steady_clock::time_point start,
             std::chrono::steady_clock::time_point admitted,
             std::chrono::steady_clock::time_point released);

  // Immutable after construction (observer_: before serving).
  const ToolCallAdapterOptions options_;
  Tools* const tools_;
  Recorder* const recorder_;
  std::function<void(const TraceRecord&)> observer_;

  CallGate gate_;  // thread-safe

  Mutex rate_mu_;
  std::unordered_map<std::string, Bucket> buckets_ GUARDED_BY(rate_mu_);  // bounded
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_TOOL_CALL_ADAPTER_H_
