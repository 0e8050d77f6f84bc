#include "mcp_bridge/session_table.h"

#include <spdlog/spdlog.h>
#include <sys/random.h>

#include "mcp_bridge/protocol.h"

namespace onlineps::bridge {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kSweepEvery = std::chrono::seconds(10);
constexpr char kKind[] = "sessions";
constexpr size_t kMaxInflight = 1024;

// The shape of the ids NewSessionId makes: a restored record answers no other.
bool IsSessionId(const std::string& id) {
  return id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string NewSessionId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string id;
  for (unsigned char b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

}  // namespace

SessionTable::SessionTable(size_t max_sessions, size_t max_per_client,
                           std::chrono::milliseconds idle)
    : max_sessions_(max_sessions),
      max_per_client_(max_per_client),
      idle_(idle),
      last_sweep_(Clock::now()) {}

std::string SessionTable::ClientOf(const std::string& principal, const std::string& address) {
  if (!principal.empty()) return "identity " + principal;
  if (address.empty() || address == "127.0.0.1" || address == "::1") return "";
  return "address " + address;
}

void SessionTable::CountClient(const Session& s, int delta) {
  if (s.client.empty()) return;
  auto it = per_client_.try_emplace(s.client, 0).first;
  it->second += delta;
  if (it->second == 0) per_client_.erase(it);
}

bool SessionTable::EndOldestOf(const std::string& client, std::vector<std::string>* ended) {
  // A scan, only when a client is at its limit: never on a call's path.
  auto oldest = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second.client == client && it->second.inflight.empty() &&
        (oldest == sessions_.end() || it->second.used < oldest->second.used)) {
      oldest = it;
    }
  }
  auto oldest_restored = restored_.end();
  for (auto it = restored_.begin(); it != restored_.end(); ++it) {
    if (it->second.client == client &&
        (oldest_restored == restored_.end() || it->second.used < oldest_restored->second.used)) {
      oldest_restored = it;
    }
  }
  if (oldest_restored != restored_.end() &&
      (oldest == sessions_.end() || oldest_restored->second.used <= oldest->second.used)) {
    // Unused since the restart: no worker holds its contexts (as in Sweep).
    CountClient(oldest_restored->second, -1);
    if (dir_) dir_->Remove(kKind, oldest_restored->first);
    restored_.erase(oldest_restored);
    return true;
  }
  if (oldest == sessions_.end()) return false;
  ended->push_back(KeyOf(oldest->second.principal, oldest->first));
  CountClient(oldest->second, -1);
  if (dir_) dir_->Remove(kKind, StateDir::HashOf(oldest->first));
  sessions_.erase(oldest);
  return true;
}

std::string SessionTable::PrefixOf(const std::string& principal) {
  return principal.empty() ? std::string() : principal + "/";
}

std::string SessionTable::IdentityOf(const std::string& key) {
  const size_t slash = key.find('/');
  return slash == std::string::npos ? std::string() : key.substr(0, slash);
}

std::string SessionTable::KeyOf(const std::string& principal, const std::string& session_id) {
  return PrefixOf(principal) + "m:" + session_id;
}

std::vector<std::string> SessionTable::Sweep() {
  last_sweep_ = Clock::now();
  std::vector<std::string> ended;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (Idle(it->second, last_sweep_)) {
      ended.push_back(KeyOf(it->second.principal, it->first));
      CountClient(it->second, -1);
      if (dir_) dir_->Remove(kKind, StateDir::HashOf(it->first));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  // Unused since the restart, so no worker has their contexts; the bridge's copies expire
  // by --context-ttl-s (their keys, which hold the ids, are not known here).
  for (auto it = restored_.begin(); it != restored_.end();) {
    if (last_sweep_ - it->second.used > idle_) {
      CountClient(it->second, -1);
      if (dir_) dir_->Remove(kKind, it->first);
      it = restored_.erase(it);
    } else {
      ++it;
    }
  }
  return ended;
}

SessionTable::Session* SessionTable::Find(const std::string& id) {
  if (auto it = sessions_.find(id); it != sessions_.end()) return &it->second;
  if (restored_.empty() || !IsSessionId(id)) return nullptr;
  auto it = restored_.find(StateDir::HashOf(id));
  if (it == restored_.end()) return nullptr;
  // Its first use since the restart: from now on it is known by its id.
  Session& s = sessions_[id] = std::move(it->second);
  restored_.erase(it);
  return &s;
}

const SessionTable::Session* SessionTable::FindConst(const std::string& id) const {
  if (auto it = sessions_.find(id); it != sessions_.end()) return &it->second;
  if (restored_.empty() || !IsSessionId(id)) return nullptr;
  auto it = restored_.find(StateDir::HashOf(id));
  return it == restored_.end() ? nullptr : &it->second;
}

bool SessionTable::Idle(const Session& s, Clock::time_point now) const {
  return s.inflight.empty() && now - s.used > idle_;
}

size_t SessionTable::CountLocked() const { return sessions_.size() + restored_.size(); }

StatusOr<std::string> SessionTable::Create(const std::string& principal, const std::string& client,
                                           const std::string& version, json client_capabilities,
                                           std::vector<std::string>* ended) {
  std::string id;
  {
    MutexLock lock(&mu_);
    if (CountLocked() >= max_sessions_ || Clock::now() - last_sweep_ > kSweepEvery) {
      for (std::string& key : Sweep()) ended->push_back(std::move(key));
    }
    if (auto it = per_client_.find(client);
        max_per_client_ != 0 && it != per_client_.end() && it->second >= max_per_client_) {
      const size_t held = it->second;
      if (!EndOldestOf(client, ended)) {
        return ResourceExhausted("this client (" + client + ") holds " + std::to_string(held) +
                                 " sessions, its limit (--max-sessions-per-client), each with "
                                 "a call in flight; end one (DELETE) or try again later");
      }
      spdlog::info(
          "mcp: {} holds {} sessions (--max-sessions-per-client): its least recently "
          "used one ended for a new one",
          client, held);
    }
    if (CountLocked() >= max_sessions_) {
      return ResourceExhausted("the bridge holds " + std::to_string(CountLocked()) +
                               " sessions, its limit (--max-sessions); try again later");
    }
    id = NewSessionId();
    Session& s = sessions_[id];
    s.view.client_capabilities = std::move(client_capabilities);
    s.view.version = version;
    s.principal = principal;
    s.client = client;
    s.used = s.touched = Clock::now();
    CountClient(s, +1);
  }
  if (Status saved = Save(id); !saved.ok()) {
    spdlog::error("mcp: {}", saved.ToString());
    MutexLock lock(&mu_);
    if (auto it = sessions_.find(id); it != sessions_.end()) {
      CountClient(it->second, -1);
      sessions_.erase(it);
    }
    return Unavailable("the bridge could not save the new session (" + saved.ToString() +
                       "); try again later");
  }
  return id;
}

std::optional<SessionView> SessionTable::Use(const std::string& id, const std::string& principal) {
  SessionView view;
  bool touch = false;
  {
    MutexLock lock(&mu_);
    Session* s = Find(id);
    const auto now = Clock::now();
    if (!s || s->principal != principal || Idle(*s, now)) return std::nullopt;
    s->used = now;
    view = s->view;
    // The file's time is the session's last use: move it now and then.
    touch = dir_ && now - s->touched > idle_ / 8;
    if (touch) s->touched = now;
  }
  if (touch) dir_->Touch(kKind, StateDir::HashOf(id));
  return view;
}

std::optional<SessionView> SessionTable::Peek(const std::string& id) const {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  return it->second.view;
}

bool SessionTable::Has(const std::string& id, const std::string& principal) const {
  MutexLock lock(&mu_);
  const Session* s = FindConst(id);
  return s && s->principal == principal;
}

Status SessionTable::SetLogLevel(const std::string& id, const std::string& level) {
  {
    MutexLock lock(&mu_);
    if (auto it = sessions_.find(id); it != sessions_.end()) it->second.view.log_level = level;
  }
  return Save(id);
}

bool SessionTable::End(const std::string& id, const std::string& principal) {
  {
    MutexLock lock(&mu_);
    Session* s = Find(id);
    if (!s || s->principal != principal) return false;
    for (auto& [rid, c] : s->inflight) c->store(true);
    CountClient(*s, -1);
    sessions_.erase(id);
  }
  // A Save racing this re-checks (Save).
  if (dir_) dir_->Remove(kKind, StateDir::HashOf(id));
  return true;
}

std::vector<std::string> SessionTable::ExpireIdle() {
  MutexLock lock(&mu_);
  return Sweep();
}

StatusOr<std::shared_ptr<std::atomic<bool>>> SessionTable::BeginCall(
    const std::string& id, const std::string& request_id) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return NotFound("Session not found");
  if (it->second.inflight.size() >= kMaxInflight) {
    return ResourceExhausted("too many requests in flight on this session");
  }
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  if (!it->second.inflight.emplace(request_id, cancelled).second) {
    return AlreadyExists("request id " + request_id +
                         " is already in use by a request in flight on this session (an id "
                         "must not be reused within a session)");
  }
  return cancelled;
}

void SessionTable::EndCall(const std::string& id, const std::string& request_id) {
  MutexLock lock(&mu_);
  if (auto it = sessions_.find(id); it != sessions_.end()) {
    it->second.inflight.erase(request_id);
    it->second.used = Clock::now();  // idle from the end of its last call
  }
}

void SessionTable::Cancel(const std::string& id, const std::string& request_id) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  if (auto c = it->second.inflight.find(request_id); c != it->second.inflight.end()) {
    c->second->store(true);
    spdlog::debug("mcp: request {} cancelled", request_id);
  }
}

size_t SessionTable::Persist(StateDir* dir) {
  std::vector<StateDir::Record> records = dir->Load(kKind);  // the most recent first
  MutexLock lock(&mu_);
  const auto now = Clock::now();
  for (const StateDir::Record& r : records) {
    const json& v = r.value;
    std::string problem;
    if (!v.contains("version") || !v["version"].is_string() || !IsLegacyVersion(v["version"])) {
      problem = "no supported protocol version";
    } else if (!v.value("principal", json()).is_string() ||
               !v.value("client", json("")).is_string() ||
               !v.value("log_level", json()).is_string() ||
               !v.value("client_capabilities", json()).is_object()) {
      problem = "principal, client, log_level or client_capabilities missing or of the wrong type";
    } else if (CountLocked() >= max_sessions_) {
      problem = "the bridge is full (--max-sessions)";
    }
    const auto age = std::chrono::milliseconds(r.age_ms);
    if (age > idle_ || !problem.empty()) {
      if (!problem.empty())
        spdlog::warn("mcp: dropping saved session {}: {}", r.hash.substr(0, 12), problem);
      dir->Remove(kKind, r.hash);
      continue;
    }
    // Known by hash until a request brings its id (Find).
    Session& s = restored_[r.hash];
    s.principal = v["principal"];
    s.client = v.value("client", "");  // absent in records of earlier versions: not counted
    CountClient(s, +1);
    s.view.version = v["version"];
    s.view.log_level = v["log_level"];
    s.view.client_capabilities = v["client_capabilities"];
    s.used = s.touched = now - age;
  }
  dir_ = dir;
  return CountLocked();
}

Status SessionTable::Save(const std::string& id) {
  if (!dir_) return Status::Ok();
  json record;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return Status::Ok();
    const Session& s = it->second;
    record = {{"principal", s.principal},
              {"client", s.client},
              {"version", s.view.version},
              {"log_level", s.view.log_level},
              {"client_capabilities", s.view.client_capabilities}};
  }
  const std::string hash = StateDir::HashOf(id);
  ONLINEPS_RETURN_IF_ERROR(dir_->Put(kKind, hash, record));
  // Ended while being written: its removal may have come first.
  MutexLock lock(&mu_);
  if (!sessions_.count(id)) dir_->Remove(kKind, hash);
  return Status::Ok();
}

size_t SessionTable::size() const {
  MutexLock lock(&mu_);
  return CountLocked();
}

}  // namespace onlineps::bridge
