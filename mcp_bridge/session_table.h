// SessionTable: the MCP sessions of the stateful revisions (2025-03-26 / 2025-06-18 /
// 2025-11-25): bounded in total and per client (one client past its share ends its own
// least recently used session, so that it cannot lock the others out), idle-expired,
// bound to the caller's identity, with the calls in
// flight on each (for notifications/cancelled). With Persist, sessions are kept in the
// state directory and survive a restart. Ending a session's contexts is the caller's
// job: the methods that end sessions return their keys (KeyOf). Thread-safe; no method
// blocks on anything but its own mutex and the state directory.
#ifndef ONLINEPS_MCP_BRIDGE_SESSION_TABLE_H_
#define ONLINEPS_MCP_BRIDGE_SESSION_TABLE_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "mcp_bridge/state_dir.h"

namespace onlineps::bridge {

// What a request's handlers see of its session.
struct SessionView {
  std::string version;    // the negotiated protocol revision
  std::string log_level;  // set by logging/setLevel; "" sends no log messages
  nlohmann::json client_capabilities = nlohmann::json::object();
};

class SessionTable {
 public:
  // max_per_client: sessions one client (Create's `client`) holds at once; 0: no limit.
  SessionTable(size_t max_sessions, size_t max_per_client, std::chrono::milliseconds idle);

  // The key a client's sessions are counted by: its identity when it has one, else its
  // address ("" for none, or loopback, where a local proxy connects for every client:
  // not counted).
  static std::string ClientOf(const std::string& principal, const std::string& address);

  // "<principal>/" ("" without one): the prefix of every routing key of that identity.
  static std::string PrefixOf(const std::string& principal);
  // The identity whose prefix starts `key` ("" for none): the inverse of PrefixOf. Neither
  // identities nor session names hold a '/'.
  static std::string IdentityOf(const std::string& key);
  // The routing and context key of a session: PrefixOf(principal) + "m:" + id.
  static std::string KeyOf(const std::string& principal, const std::string& session_id);

  // Loads the sessions saved in `dir` (those idle past `idle` are dropped) and saves
  // every new session there, before its id reaches the client. Returns how many are
  // held. Call before serving; `dir` outlives the table.
  size_t Persist(StateDir* dir);

  // A new session (a fresh random id, never a client-chosen one) of `principal`, counted
  // for `client` (ClientOf). Sweeps idle sessions first when full or every 10 s; a client
  // at its limit ends its least recently used session without a call in flight. Appends
  // the ended sessions' keys to `*ended`. Errors: kResourceExhausted (full, or the client
  // at its limit with a call in flight on every session) or kUnavailable (not saved),
  // with the message to send.
  StatusOr<std::string> Create(const std::string& principal, const std::string& client,
                               const std::string& version, nlohmann::json client_capabilities,
                               std::vector<std::string>* ended);
  // The live session `id` of `principal`, marked used; nullopt when there is none (404).
  std::optional<SessionView> Use(const std::string& id, const std::string& principal);
  // The session `id` as it is, without marking it used; nullopt when there is none.
  std::optional<SessionView> Peek(const std::string& id) const;
  bool Has(const std::string& id, const std::string& principal) const;
  // Sets the logging/setLevel level; an error when it could not be saved (it holds until
  // a restart then).
  Status SetLogLevel(const std::string& id, const std::string& level);
  // Ends session `id` of `principal`, cancelling its calls in flight; false when there
  // is no such session.
  bool End(const std::string& id, const std::string& principal);
  // Ends the sessions idle past `idle` (a call in flight keeps one alive; idle counts
  // from the end of its last call); returns their keys.
  std::vector<std::string> ExpireIdle();

  // Registers call `request_id` of session `id` and returns its cancel flag. Errors:
  // kNotFound (no session), kResourceExhausted (1024 calls in flight), kAlreadyExists
  // (request_id is in flight already: JSON-RPC ids must not be reused within a session).
  StatusOr<std::shared_ptr<std::atomic<bool>>> BeginCall(const std::string& id,
                                                         const std::string& request_id);
  void EndCall(const std::string& id, const std::string& request_id);
  // Sets the cancel flag of call `request_id` of session `id`, if it is in flight.
  void Cancel(const std::string& id, const std::string& request_id);

  size_t size() const;

 private:
  struct Session {
    std::string principal;
    std::string client;  // ClientOf; "" not counted
    SessionView view;
    std::chrono::steady_clock::time_point used;
    std::chrono::steady_clock::time_point touched;  // last use the state directory knows of
    std::map<std::string, std::shared_ptr<std::atomic<bool>>> inflight;  // request id -> cancel
  };

  std::vector<std::string> Sweep() REQUIRES(mu_);  // returns the ended session keys
  // The live or restored session of that id (a restored one moves to sessions_); null
  // when there is none.
  Session* Find(const std::string& id) REQUIRES(mu_);
  const Session* FindConst(const std::string& id) const REQUIRES(mu_);
  size_t CountLocked() const REQUIRES(mu_);
  // Unused for longer than idle_ at `now`, with no call in flight.
  bool Idle(const Session& s, std::chrono::steady_clock::time_point now) const REQUIRES(mu_);
  // Adds `delta` to the count of s's client.
  void CountClient(const Session& s, int delta) REQUIRES(mu_);
  // Ends the least recently used session of `client` without a call in flight, appending
  // its key to `*ended`; false when every one has a call in flight.
  bool EndOldestOf(const std::string& client, std::vector<std::string>* ended) REQUIRES(mu_);
  Status Save(const std::string& id);  // the session's record to dir_

  // Immutable after construction (dir_: after Persist, before serving).
  const size_t max_sessions_;
  const size_t max_per_client_;
  const std::chrono::milliseconds idle_;
  StateDir* dir_ = nullptr;

  mutable Mutex mu_;
  std::unordered_map<std::string, Session> sessions_ GUARDED_BY(mu_);
  // Loaded from dir_ and unused since, by StateDir::HashOf(id); Find moves them.
  std::unordered_map<std::string, Session> restored_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_sweep_ GUARDED_BY(mu_);
  // Sessions held (live and restored) per counted client.
  std::unordered_map<std::string, size_t> per_client_ GUARDED_BY(mu_);
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_SESSION_TABLE_H_
