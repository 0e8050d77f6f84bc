// McpServer: the MCP protocol, independent of the transport. Parses and validates
// JSON-RPC messages, negotiates the protocol revision, keeps the stateful sessions of
// revisions 2025-03-26 / 2025-06-18 / 2025-11-25 (bounded, idle-expired, bound to
// the caller's identity), serves the stateless revision 2026-07-28 (server/discover,
// per-request _meta), and runs tools/call through Tools with per-session ordering,
// progress, cancellation and a per-session rate limit. With Persist, sessions are kept
// in the state directory and survive a restart. The transports (HTTP, stdio) turn a
// Reply into bytes. Thread-safe.
#ifndef ONLINEPS_MCP_BRIDGE_MCP_SERVER_H_
#define ONLINEPS_MCP_BRIDGE_MCP_SERVER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/json_depth.h"
#include "mcp_bridge/fixtures.h"
#include "mcp_bridge/recorder.h"
#include "mcp_bridge/state_dir.h"
#include "mcp_bridge/tools.h"

namespace onlineps::bridge {

inline constexpr char kModernVersion[] = "2026-07-28";
inline constexpr char kLatestLegacyVersion[] = "2025-11-25";
bool IsLegacyVersion(const std::string& v);  // 2025-11-25, 2025-06-18, 2025-03-26
nlohmann::json SupportedVersions();          // newest first, as server/discover lists them

// JSON-RPC and MCP error codes.
inline constexpr int kParseError = -32700, kInvalidRequest = -32600, kMethodNotFound = -32601,
                     kInvalidParams = -32602, kInternalError = -32603, kServerError = -32000,
                     kSessionNotFound = -32001, kHeaderMismatch = -32020,
                     kMissingCapability = -32021, kUnsupportedVersion = -32022;

// Deepest nesting of arrays and objects a message may have. nlohmann::json copies and
// prints values recursively: a body of a few hundred KB of '[' would overflow the stack of
// the thread handling it, so the transports refuse deeper messages before parsing them.
inline constexpr size_t kMaxJsonDepth = 64;
using onlineps::NestsDeeperThan;  // common/json_depth.h

nlohmann::json JsonRpcError(const nlohmann::json& id, int code, const std::string& message,
                            const nlohmann::json& data = nullptr);

struct McpServerOptions {
  std::string name = "onlineps-mcp-bridge";
  std::string version = "0.1.0";
  size_t max_sessions = 10000;
  std::chrono::milliseconds session_idle{3600 * 1000};
  double rate_limit = 0;  // tools/call per second per session; 0: off
  double rate_burst = 20;
};

// One message as a transport hands it over.
struct Request {
  nlohmann::json message;
  std::string principal;       // the caller's identity ("" when auth is off)
  std::string session_id;      // Mcp-Session-Id (HTTP) or the process session (stdio)
  std::string header_version;  // MCP-Protocol-Version header; "" when absent
  bool stateless = false;      // revision 2026-07-28 (no session)
  // Sends a notification related to this request before its response (SSE or stdio);
  // null when the transport cannot (a plain JSON response).
  std::function<void(const nlohmann::json&)> notify;
};

struct Reply {
  int http_status = 200;
  nlohmann::json body;         // null: no body (202 Accepted, or a cancelled request)
  std::string new_session_id;  // set by initialize
};

class McpServer {
 public:
  McpServer(McpServerOptions options, Tools* tools, Recorder* recorder,
            std::function<void(const std::string& session_key)> end_session);

  // Serves the conformance fixtures too (--test-fixtures). Call before serving.
  void SetFixtures(Fixtures* fixtures) { fixtures_ = fixtures; }
  // Loads the sessions saved in `dir` (those idle past session_idle are dropped) and
  // saves every new session there, before its id reaches the client. The directory
  // knows sessions by the hash of their id: a loaded one is found when a request brings
  // its id. Returns how many were loaded. Call before serving; `dir` outlives the server.
  size_t Persist(StateDir* dir);
  // Called after every tools/call (metrics). Call before serving.
  void SetCallObserver(std::function<void(const TraceRecord&)> observer) {
    observer_ = std::move(observer);
  }

  // Never throws: an unexpected exception becomes a -32603 reply (HTTP 500).
  Reply Handle(const Request& req);
  // DELETE: ends a session. Returns false when there is no such session (404).
  bool EndSession(const std::string& session_id, const std::string& principal);
  // Whether a request should get a streamed (SSE) response: a tools/call that asked for
  // progress and will send some.
  bool WantsStream(const nlohmann::json& message) const;
  size_t sessions() const;
  // Ends the MCP sessions idle past session_idle (their contexts go with them); returns
  // how many. Called periodically by the owner (and by initialize when full).
  size_t ExpireIdle();
  bool HasSession(const std::string& session_id, const std::string& principal) const;

 private:
  struct Session {
    std::string principal;
    std::string version;
    std::string log_level = "";  // set by logging/setLevel; "" sends no log messages
    std::chrono::steady_clock::time_point used;
    std::chrono::steady_clock::time_point touched;  // last use the state directory knows of
    std::map<std::string, std::shared_ptr<std::atomic<bool>>> inflight;  // request id -> cancel
    nlohmann::json client_capabilities = nlohmann::json::object();
  };
  struct Ask {  // a request the server sent to the client, waiting for its response
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    nlohmann::json response;
    std::string session_id;  // only that session may answer
  };
  struct Gate {  // FIFO order of one session's calls
    uint64_t next = 0, serving = 0;
    int users = 0;
  };
  // Waits for this call's turn in its session on construction; hands the turn on when
  // destroyed, whatever the call did.
  class GateTicket {
   public:
    GateTicket(McpServer* server, const std::string& key);
    ~GateTicket();
    GateTicket(const GateTicket&) = delete;
    GateTicket& operator=(const GateTicket&) = delete;

   private:
    McpServer* const server_;
    const std::string key_;
  };
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point at;
  };

  Reply HandleMessage(const Request& req);
  Reply Initialize(const Request& req);
  Reply Dispatch(const Request& req, Session* s);
  Reply Stateless(const Request& req);
  nlohmann::json ModernCapabilities() const;
  Reply CallTool(const Request& req, const std::string& session_key, const std::string& version,
                 std::shared_ptr<std::atomic<bool>> cancelled);
  void Notification(const Request& req, Session* s);
  bool Allow(const std::string& key);
  Reply CallFixture(const Request& req, const std::string& name, const nlohmann::json& args);
  StatusOr<nlohmann::json> AskClient(const Request& req, const std::string& method,
                                     const nlohmann::json& params);
  bool DeliverResponse(const nlohmann::json& m, const std::string& session_id);
  std::vector<std::string> Sweep();  // REQUIRES: mu_; returns the ended session keys
  // The live or restored session of that id (a restored one moves to sessions_); null
  // when there is none.
  Session* Find(const std::string& session_id);  // REQUIRES: mu_
  size_t CountLocked() const;                    // REQUIRES: mu_
  std::string NewSessionId();
  Status Save(const std::string& session_id);  // the session's record to dir_

  const McpServerOptions options_;
  Tools* const tools_;
  Recorder* const recorder_;
  Fixtures* fixtures_ = nullptr;
  std::function<void(const TraceRecord&)> observer_;
  StateDir* dir_ = nullptr;
  const std::function<void(const std::string&)> end_session_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Session> sessions_;  // guarded by mu_
  // Loaded from dir_ and unused since, by StateDir::HashOf(id); Find moves them.
  std::unordered_map<std::string, Session> restored_;  // guarded by mu_
  std::chrono::steady_clock::time_point last_sweep_;   // guarded by mu_

  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  std::unordered_map<std::string, Gate> gates_;  // guarded by gate_mu_; erased when unused

  std::mutex ask_mu_;
  std::map<std::string, std::shared_ptr<Ask>> asks_;  // guarded by ask_mu_
  uint64_t next_ask_ = 1;                             // guarded by ask_mu_

  std::mutex rate_mu_;
  std::unordered_map<std::string, Bucket> buckets_;  // guarded by rate_mu_; bounded
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_MCP_SERVER_H_
