// Tools: the MCP tools the bridge serves (infer, learn, set_context, append_context,
// clear_context, get_context, model_info), each declared once with its schema and
// handler (a table, as the SDK's registerTool): arguments the schema does not name are
// refused from it, then the handler checks values and runs through the Backend. Invalid
// arguments and worker errors become results with is_error and a message saying what is
// wrong (MCP: isError results, so an agent can correct itself). Thread-safe.
#ifndef ONLINEPS_MCP_BRIDGE_TOOLS_H_
#define ONLINEPS_MCP_BRIDGE_TOOLS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "mcp_bridge/backend.h"
#include "mcp_bridge/context_store.h"
#include "mcp_bridge/router.h"
#include "mcp_bridge/worker_pool.h"

namespace onlineps::bridge {

struct ToolsOptions {
  size_t max_examples = 256;  // per learn or infer call; at most the worker's --max-batch
  size_t learn_chunk = 64;    // examples per worker call; progress is sent after each
  // Per example (text bytes, feature values) and per worker call (words of text), with
  // the worker's messages and flag names; each at most the worker's flag of that name,
  // so that what the bridge sends the worker accepts.
  size_t max_text_bytes = 64 * 1024;
  size_t max_tokens = 32 * 1024;
  size_t max_features = 4096;
};

// One tools/call as the tools see it.
struct ToolCall {
  std::string name;
  nlohmann::json arguments;  // an object
  std::string session;       // routing and context key; empty: no session
  // Sends notifications/progress when set (the client asked with a progressToken).
  std::function<void(double progress, double total, const std::string& message)> progress;
  // Sends notifications/message (logging) when set.
  std::function<void(const std::string& level, const nlohmann::json& data)> log;
  const std::atomic<bool>* cancelled = nullptr;
};

struct ToolResult {
  nlohmann::json structured = nlohmann::json::object();
  bool is_error = false;
  std::string error;  // the message when is_error
  // For the recorder.
  std::string worker;
  int64_t version = -1, tau = -1;
  std::string summary;
};

// The "session" argument of a tool: at most 128 characters of [A-Za-z0-9._:@-].
// Returns an error message, or "" when `s` is valid.
std::string CheckSessionName(const std::string& s);

class Tools {
 public:
  Tools(ToolsOptions options, Backend* backend, ContextStore* contexts, WorkerPool* pool,
        Router* router);

  // The tools/list "tools" array (deterministic, the same for every client).
  const nlohmann::json& List() const { return list_; }
  bool Has(const std::string& name) const;
  // Whether calls of `name` run in their session's order (CallGate): the tools that
  // reach a worker. get_context and model_info, which the bridge answers alone, never
  // wait behind a session's worker call. Unknown names: true.
  bool Ordered(const std::string& name) const;
  // Whether a call of `name` may block its thread (on a worker call): the tools that
  // reach a worker and have no asynchronous form. Unknown names: false (refused at once).
  bool Blocks(const std::string& name) const;
  ToolResult Call(const ToolCall& call);
  // The same without waiting where the tool has an asynchronous form (infer, learn):
  // `done` gets the result once, on a worker client's thread or the caller's; `call`
  // may go once CallAsync returns, but what its `progress`, `log` and `cancelled` point
  // to must live until `done`. Other tools run here and then call `done`.
  using ToolDone = std::function<void(ToolResult)>;
  void CallAsync(const ToolCall& call, ToolDone done);
  // Whether a call of `name` with `arguments` sends progress (a learn of several
  // examples), so wants a streamed response when the client asked for progress.
  bool SendsProgress(const std::string& name, const nlohmann::json& arguments) const;

 private:
  struct Entry {
    nlohmann::json declaration;
    ToolResult (Tools::*run)(const ToolCall&);            // or null, then:
    void (Tools::*run_async)(const ToolCall&, ToolDone);  // or null
    std::set<std::string> arguments;  // the names inputSchema.properties declares
    bool ordered = true;              // see Ordered()
  };
  struct LearnRun;  // a learn's chunks, one worker call after the other

  const Entry* Find(const std::string& name) const;
  void Infer(const ToolCall& c, ToolDone done);
  void Learn(const ToolCall& c, ToolDone done);
  void LearnNext(std::shared_ptr<LearnRun> run);
  ToolResult SetContext(const ToolCall& c);
  ToolResult AppendContext(const ToolCall& c);
  ToolResult StoreContext(const ToolCall& c, bool append);
  ToolResult ClearContext(const ToolCall& c);
  ToolResult GetContext(const ToolCall& c);
  ToolResult ModelInfo(const ToolCall& c);
  void NoteLearn(int64_t version, int64_t tau);

  const ToolsOptions options_;
  Backend* const backend_;
  ContextStore* const contexts_;
  WorkerPool* const pool_;
  Router* const router_;
  std::vector<Entry> entries_;
  nlohmann::json list_;

  Mutex mu_;                                        // staleness statistics from learn replies
  std::vector<uint64_t> tau_hist_ GUARDED_BY(mu_);  // [0, 1023] and one overflow bucket
  uint64_t tau_count_ GUARDED_BY(mu_) = 0, tau_sum_ GUARDED_BY(mu_) = 0,
                      tau_max_ GUARDED_BY(mu_) = 0;
  int64_t max_version_ GUARDED_BY(mu_) = 0;
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_TOOLS_H_
