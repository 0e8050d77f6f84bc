// McpServer: the MCP protocol, independent of the transport, along the lines of the
// official TypeScript SDK's server: one method table for the stateful revisions
// (2025-03-26 / 2025-06-18 / 2025-11-25, sessions in a SessionTable) and the stateless
// 2026-07-28 (server/discover, per-request _meta); tools registered with their
// declaration and handler together (RegisterTool, the SDK's registerTool); the bridge's
// own tools come in through a ToolCallAdapter (per-session order, progress, rate limit,
// trace). Extensions (more tools, methods, capabilities, a handler of the client's
// responses) are registered before serving. The transports turn a Reply into bytes.
// Thread-safe once serving.
#ifndef ONLINEPS_MCP_BRIDGE_MCP_SERVER_H_
#define ONLINEPS_MCP_BRIDGE_MCP_SERVER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/json_depth.h"
#include "mcp_bridge/protocol.h"
#include "mcp_bridge/recorder.h"
#include "mcp_bridge/session_table.h"
#include "mcp_bridge/state_dir.h"
#include "mcp_bridge/tools.h"

namespace onlineps::bridge {

class ToolCallAdapter;

// Deepest nesting of arrays and objects a message may have. nlohmann::json copies and
// prints values recursively: a body of a few hundred KB of '[' would overflow the stack of
// the thread handling it, so the transports refuse deeper messages before parsing them.
inline constexpr size_t kMaxJsonDepth = 64;
using onlineps::NestsDeeperThan;  // common/json_depth.h

struct McpServerOptions {
  std::string name = "onlineps-mcp-bridge";
  std::string version = "0.1.0";
  size_t max_sessions = 10000;
  // Sessions one client holds at once (its identity with auth, else its address; not
  // loopback); past it, its least recently used session ends. 0: no limit.
  size_t max_sessions_per_client = 1000;
  std::chrono::milliseconds session_idle{3600 * 1000};
  double rate_limit = 0;  // tools/call per second per session; 0: off
  double rate_burst = 20;
};

// One message as a transport hands it over.
struct Request {
  nlohmann::json message;
  std::string principal;       // the caller's identity ("" when auth is off)
  std::string client_address;  // the peer's address (IPv6: its /64); "" when not a network peer
  std::string session_id;      // Mcp-Session-Id (HTTP) or the process session (stdio)
  std::string header_version;  // MCP-Protocol-Version header; "" when absent
  bool stateless = false;      // revision 2026-07-28 (no session): ChooseRevision
  bool http = false;           // came over Streamable HTTP (its session is a header)
  // Sends a message related to this request before its response (SSE or stdio); null
  // when the transport cannot (a plain JSON response).
  std::function<void(const nlohmann::json&)> notify;
  // A stateless request's cancel flag, which its transport sets (stdio: on
  // notifications/cancelled); null: it cannot be cancelled. A stateful request's flag is
  // its session's.
  std::shared_ptr<std::atomic<bool>> cancelled;
};

struct Reply {
  int http_status = 200;
  nlohmann::json body;  // null: no body (202 Accepted, or a cancelled request)
  // The body already serialized (a result whose handler serialized it, Outcome::
  // result_text); when set, `body` is null. Text() and Document() read either.
  std::string body_text;
  std::string new_session_id;  // set by initialize

  bool has_body() const { return !body_text.empty() || !body.is_null(); }
  // The body as the transports send it (invalid UTF-8 replaced); "" when none.
  std::string Text() const;
  // The body as a document (body_text parsed); null when none.
  nlohmann::json Document() const;
  // Whether it answers a request its client cancelled (error -32800): the transports
  // send no response for it.
  bool cancelled() const;
};

// The JSON-RPC outcome of a method or tool handler: a result, or an error.
struct Outcome {
  nlohmann::json result;
  // The result already serialized (a JSON object), used instead of `result` when set: a
  // tool result is serialized once, not built into the answer's document and serialized
  // again with it. Only for stateful requests (a stateless result gains members here).
  std::string result_text;
  int error_code = 0;  // 0: result
  std::string error_message;
  nlohmann::json error_data;  // the error's "data"; null for none
  int http_status = 200;      // of an error

  static Outcome Ok(nlohmann::json result);
  static Outcome Error(int code, std::string message, nlohmann::json data = nullptr,
                       int http_status = 200);
};

// What a handler knows of the request it serves. Valid during the call only.
struct CallContext {
  const Request* request = nullptr;  // principal, session_id, stateless, notify
  std::string session_key;           // SessionTable::KeyOf of a stateful session; "" stateless
  SessionView session;               // the stateful session's state (defaults when stateless)
  nlohmann::json client_capabilities = nlohmann::json::object();  // initialize's or _meta's
  nlohmann::json progress_token;                 // params._meta.progressToken; null when absent
  const std::atomic<bool>* cancelled = nullptr;  // notifications/cancelled or the session ended
};

using Handler = std::function<Outcome(const nlohmann::json& params, const CallContext& ctx)>;
// A handler that answers later: `respond` exactly once, from any thread. `params` and
// `ctx` are valid during the call only, but what ctx.request and ctx.cancelled point to
// stays valid until `respond`. It must not block (it may run on a transport's I/O
// thread, and its continuation on a worker client's thread).
using Respond = std::function<void(Outcome)>;
using AsyncHandler =
    std::function<void(const nlohmann::json& params, const CallContext& ctx, Respond respond)>;

// A tool: its tools/list entry and its handler, declared together.
struct ToolDefinition {
  nlohmann::json declaration;  // name, title?, description, inputSchema, outputSchema?, ...
  // Runs a call: `params` are the arguments (an object); the result a CallToolResult.
  // One of the two; async_handler when set.
  Handler handler;
  AsyncHandler async_handler;
  // Whether a call may block its thread (McpServer::Blocks).
  bool blocks = true;
  // Whether a session's calls of it wait their turn behind its other ordered calls (the
  // tools that reach a worker); false for those the bridge answers alone (McpServer::
  // Ordered).
  bool ordered = true;
  // Whether a tools/call (its params) needs a streamed (SSE) response: it sends progress
  // or other messages before its result. Null: never.
  std::function<bool(const nlohmann::json& params)> streams;
};

// The revisions a method is served in.
enum class Revisions { kStateful, kStateless, kBoth };

class McpServer {
 public:
  // `tools` (the bridge's tools; may be null) and `recorder` (may be null) outlive the
  // server. `end_session` is called with the key of every session that ends.
  McpServer(McpServerOptions options, Tools* tools, Recorder* recorder,
            std::function<void(const std::string& session_key)> end_session);
  ~McpServer();

  // Extensions; each call before serving. tools/list lists tools in registration order.
  void RegisterTool(ToolDefinition tool);
  void RegisterMethod(const std::string& method, Revisions revisions, Handler handler);
  // Merged into the capabilities of initialize and server/discover.
  void AddCapabilities(const nlohmann::json& capabilities);
  // Receives the client's responses to requests the server sent it (on `notify`), with
  // the session they came on. Without one they are accepted and dropped.
  void SetResponseHandler(
      std::function<void(const nlohmann::json& response, const std::string& session_id)> h);
  // Loads the sessions saved in `dir` and saves every new one there (SessionTable::
  // Persist). Returns how many were loaded. Call before serving.
  size_t Persist(StateDir* dir);
  // Called after every call of the bridge's tools (metrics), with the call's trace record
  // (its arguments only when a recorder is set). Call before serving.
  void SetCallObserver(std::function<void(const TraceRecord&)> observer);

  // Never throws: an unexpected exception becomes a -32603 reply (HTTP 500).
  Reply Handle(const Request& req);
  // The same without waiting: `done` gets the reply exactly once, on this thread or on
  // the thread that finished the work (a worker client's). Blocks its thread only for a
  // message Blocks() says so of.
  using ReplyDone = std::function<void(Reply)>;
  void HandleAsync(Request req, ReplyDone done);
  // Whether handling `message` may block the thread (a worker call made synchronously,
  // or a method that writes files): such messages belong on a thread that may wait.
  bool Blocks(const nlohmann::json& message) const;
  // Whether `message` waits its turn behind the session's earlier requests: false only
  // for a tools/call of a tool declared unordered (ToolDefinition::ordered), which a
  // transport that runs requests in order may run beside them.
  bool Ordered(const nlohmann::json& message) const;
  // DELETE: ends a session. Returns false when there is no such session (404). Blocks
  // until the session's call still running, if any, is done (its calls waiting do not
  // run), so that nothing of the session comes back after its end.
  bool EndSession(const std::string& session_id, const std::string& principal);
  // Whether a request should get a streamed (SSE) response (ToolDefinition::streams).
  bool WantsStream(const nlohmann::json& message) const;
  size_t sessions() const;
  // Ends the MCP sessions idle past session_idle (their contexts go with them); returns
  // how many. Called periodically by the owner (and by initialize when full).
  size_t ExpireIdle();
  bool HasSession(const std::string& session_id, const std::string& principal) const;

 private:
  struct Method {
    Revisions revisions;
    Handler handler;     // or
    AsyncHandler async;  // when set
  };
  using RequestPtr = std::shared_ptr<const Request>;

  void HandleMessage(const RequestPtr& req, const ReplyDone& done);
  // A JSON-RPC batch: each message handled as if sent alone, the answers in one array
  // (none: 202). Served on a session of revision 2025-03-26 only (kBatchVersion).
  void Batch(const RequestPtr& req, const ReplyDone& done);
  Reply Initialize(const Request& req);
  void Stateful(const RequestPtr& req, const ReplyDone& done);
  void Stateless(const RequestPtr& req, const ReplyDone& done);
  void Dispatch(const RequestPtr& req, CallContext ctx, const ReplyDone& done);
  void Notification(const Request& req);
  nlohmann::json Capabilities(bool stateless) const;
  nlohmann::json ServerInfo() const;
  void EndKeys(const std::vector<std::string>& keys);
  void EndKey(const std::string& key);  // end_session_, after the key's calls in flight
  // The core methods.
  Outcome Ping(const nlohmann::json& params, const CallContext& ctx);
  Outcome ListTools(const nlohmann::json& params, const CallContext& ctx);
  void CallTool(const nlohmann::json& params, const CallContext& ctx, Respond respond);
  Outcome SetLogLevel(const nlohmann::json& params, const CallContext& ctx);
  Outcome Discover(const nlohmann::json& params, const CallContext& ctx);

  // Immutable once serving.
  const McpServerOptions options_;
  const std::function<void(const std::string&)> end_session_;
  std::unique_ptr<ToolCallAdapter> adapter_;  // null without tools
  std::vector<ToolDefinition> tools_;
  std::map<std::string, size_t> tool_index_;  // name -> tools_ index
  std::map<std::string, Method> methods_;
  nlohmann::json extra_capabilities_ = nlohmann::json::object();
  std::function<void(const nlohmann::json&, const std::string&)> response_handler_;

  SessionTable sessions_;  // thread-safe
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_MCP_SERVER_H_
