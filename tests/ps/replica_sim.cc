#include "tests/ps/replica_sim.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <queue>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "common/bytes.h"
#include "common/wire.h"
#include "ps/replica_core.h"
#include "tests/ps/sim_etcd.h"

namespace onlineps::sim {

namespace {

using ps::KvCall;
using ps::ReplicaConfig;
using ps::ReplicaCore;

constexpr int kEtcd = 1000;       // endpoint id of etcd
constexpr int kClientBase = 100;  // endpoint id of client c: kClientBase + c
const char kGroup[] = "/onlineps/sim/shard-0-of-1/";

// The shard's state as the simulation models it: the pushes applied, in the order they
// were applied (a backup must apply the primary's log in its order), with exactly-once
// semantics (the shard's dedup windows are part of its replicated state).
struct Model {
  std::vector<uint64_t> order;
  std::set<uint64_t> ids;
  bool Has(uint64_t id) const { return ids.count(id) > 0; }
  void Apply(uint64_t id) {
    if (ids.insert(id).second) order.push_back(id);
  }
  std::string Serialize() const {
    std::string out;
    for (uint64_t id : order) out.append(reinterpret_cast<const char*>(&id), sizeof id);
    return out;
  }
  bool Parse(const std::string& bytes) {
    if (bytes.size() % 8 != 0) return false;
    order.clear();
    ids.clear();
    for (size_t i = 0; i < bytes.size(); i += 8) {
      uint64_t id;
      std::memcpy(&id, bytes.data() + i, 8);
      Apply(id);
    }
    return true;
  }
};

uint64_t PushId(uint64_t sender, uint64_t seq) { return (sender << 40) | seq; }

class Sim;

struct Node final : ps::ReplicaEnv {
  Sim* sim = nullptr;
  int index = 0;
  bool alive = false, stopping = false;
  uint64_t gen = 0, inc = 0;
  std::unique_ptr<ReplicaCore> core;
  Model state;
  struct Disk {
    bool has = false, clean = false;
    Model state;
    uint64_t lsn = 0, log_epoch = 0, inc = 0;
  } disk;
  bool busy = false;  // applying a replication message; others wait (as apply_mu_ does)
  std::deque<std::function<void()>> inbox;
  bool push_busy = false;  // applying a client push (order_mu_)
  std::deque<std::function<void()>> pushes;
  uint64_t paused_until = 0;
  bool down_clean = false;  // went down by a clean stop

  void Send(size_t member, Frames frames) override;
  void Kv(uint64_t id, KvCall call) override;
  void TakeSnapshot(size_t member, uint64_t token) override;
};

struct Client {
  int id = 0;
  uint64_t seq = 0, attempt = 0, max_epoch = 0;
  bool inflight = false;
  int target = 0;
};

class Sim {
 public:
  explicit Sim(const SimOptions& o) : o_(o), rng_(o.seed) {
    n_ = o.replicas > 0 ? o.replicas : 2 + static_cast<int>(Rand(2));
    drop_ = o.faults ? RandDouble() * 0.08 : 0;
    dup_ = o.faults ? RandDouble() * 0.08 : 0;
    jitter_ = 1 + Rand(o.faults ? 30 : 5);
    nodes_.resize(n_);
    for (int i = 0; i < n_; ++i) {
      nodes_[i] = std::make_unique<Node>();
      nodes_[i]->sim = this;
      nodes_[i]->index = i;
    }
    clients_.resize(o.clients);
    for (int c = 0; c < o.clients; ++c) clients_[c].id = c;
  }

  SimResult Run();

  // Called by nodes.
  void NodeSend(Node& from, size_t member, Frames frames);
  void NodeKv(Node& from, uint64_t id, KvCall call);
  void NodeSnapshot(Node& from, size_t member, uint64_t token);

 private:
  struct Event {
    uint64_t at, seq;
    int node;  // deferred while that node is paused; -1: none
    std::function<void()> fn;
    bool operator>(const Event& e) const { return at != e.at ? at > e.at : seq > e.seq; }
  };

  uint64_t Rand(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  double RandDouble() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  void At(uint64_t t, int node, std::function<void()> fn) {
    events_.push(Event{t, next_seq_++, node, std::move(fn)});
  }
  void Log(const std::string& what) {
    if (o_.verbose)
      std::fprintf(stderr, "[sim %8llu ms] %s\n", (unsigned long long)now_, what.c_str());
  }
  void Fail(const std::string& what) {
    if (!result_.ok) return;
    result_.ok = false;
    result_.failure = "at " + std::to_string(now_) + " ms: " + what;
    Log("FAILURE " + what);
  }

  bool Cut(int a, int b) const { return cuts_.count({std::min(a, b), std::max(a, b)}) > 0; }
  // Delivers `fn` from endpoint `from` to endpoint `to` through the faulty network;
  // `to_gen` (non-zero) addresses one process instance of a replica.
  void Net(int from, int to, uint64_t to_gen, std::function<void()> fn);

  void StartNode(int i, bool restore);
  void KillNode(int i, const std::string& why);
  void CleanStop(int i);
  void FinishStop(int i, uint64_t gen, uint64_t started);
  void TickLoop(int i, uint64_t gen);
  void CheckpointLoop(int i, uint64_t gen);
  void Drain(Node& node);
  void Deliver(int to, int from, uint64_t from_gen, Frames frames);
  void Process(int to, int from, uint64_t from_gen, Frames frames);

  void ClientSend(int c);
  void OnClientPush(int node, int c, uint64_t attempt, Frames frames);
  void ProcessPush(int node, int c, uint64_t attempt, Frames frames);
  void ReplyToClient(int node, int c, uint64_t attempt, const Header& req, const Status& st,
                     std::optional<uint32_t> primary = std::nullopt);
  void OnClientReply(int c, uint64_t attempt, const Header& reply);

  void FaultLoop();
  void Heal();
  void RestartBackup();
  void WatchResync(int i, uint64_t inc, uint64_t since);
  std::vector<std::pair<int, uint64_t>> EtcdIsr() const;
  void CheckAcked(const std::vector<uint64_t>& ids, const std::string& when);
  void FinalCheck();

  const SimOptions o_;
  std::mt19937_64 rng_;
  int n_ = 2;
  double drop_ = 0, dup_ = 0;
  uint64_t jitter_ = 1;
  uint64_t now_ = 0, next_seq_ = 0;
  bool faulting_ = true, pushing_ = true;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Client> clients_;
  std::set<std::pair<int, int>> cuts_;
  SimEtcd etcd_;
  std::vector<uint64_t> acked_;
  std::set<uint64_t> acked_set_;
  uint64_t last_ack_ms_ = 0, acks_after_heal_ = 0;
  SimResult result_;
};

void Node::Send(size_t member, Frames frames) { sim->NodeSend(*this, member, std::move(frames)); }
void Node::Kv(uint64_t id, KvCall call) { sim->NodeKv(*this, id, std::move(call)); }
void Node::TakeSnapshot(size_t member, uint64_t token) { sim->NodeSnapshot(*this, member, token); }

void Sim::Net(int from, int to, uint64_t to_gen, std::function<void()> fn) {
  result_.messages++;
  if (RandDouble() < drop_) {
    result_.dropped++;
    return;
  }
  const int copies = RandDouble() < dup_ ? 2 : 1;
  auto shared = std::make_shared<std::function<void()>>(std::move(fn));
  for (int k = 0; k < copies; ++k) {
    const uint64_t delay = 1 + Rand(jitter_);
    const int tag = to < kClientBase ? to : -1;
    At(now_ + delay, tag, [this, from, to, to_gen, shared] {
      if (Cut(from, to)) {
        result_.dropped++;
        return;
      }
      if (to < kClientBase) {
        const Node& n = *nodes_[to];
        if (!n.alive || (to_gen != 0 && n.gen != to_gen)) return;
      }
      (*shared)();
    });
  }
}

void Sim::Drain(Node& node) {
  if (!node.core) return;
  for (auto& [done, st] : node.core->TakeCompletions()) done(st);
}

// ------------------------------------------------------------------------------ replicas

void Sim::StartNode(int i, bool restore) {
  Node& n = *nodes_[i];
  n.gen++;
  n.alive = true;
  n.stopping = false;
  n.busy = n.push_busy = false;
  n.inbox.clear();
  n.pushes.clear();
  n.paused_until = 0;
  const bool clean = restore && n.disk.has && n.disk.clean;
  n.inc = clean ? n.disk.inc : (rng_() | 1);
  n.state = restore && n.disk.has ? n.disk.state : Model{};
  ReplicaConfig c;
  for (int m = 0; m < n_; ++m) c.members.push_back("sim://" + std::to_string(m));
  c.index = static_cast<uint32_t>(i);
  c.group = kGroup;
  c.sync = o_.sync;
  c.heartbeat_ms = 100;
  c.lease_ms = 1000;
  c.follower_timeout_ms = 1000;
  c.kv_timeout_ms = 500;
  c.bootstrap_wait_ms = 3000;
  c.unclean_wait_ms = 30000;
  c.window = 64;
  c.snapshot_chunk_bytes = 512;  // snapshots of a few KB go in several parts
  c.max_snapshot_bytes = 1 << 20;
  c.max_log_entries = 512;
  c.incarnation = n.inc;
  if (restore && n.disk.has) {
    c.restored = true;
    c.restored_exact = clean;
    c.restored_lsn = n.disk.lsn;
    c.restored_log_epoch = n.disk.log_epoch;
  }
  n.disk.clean = false;  // as the shard rewrites its sidecar at start
  n.core = std::make_unique<ReplicaCore>(c, &n);
  Log("start replica " + std::to_string(i) +
      (restore && n.disk.has ? (clean ? " (clean restore)" : " (checkpoint)") : " (empty)") +
      " inc " + std::to_string(n.inc % 10000));
  n.core->Start(now_);
  Drain(n);
  const uint64_t gen = n.gen;
  At(now_ + 1 + Rand(25), i, [this, i, gen] { TickLoop(i, gen); });
  At(now_ + 500 + Rand(3000), i, [this, i, gen] { CheckpointLoop(i, gen); });
}

void Sim::TickLoop(int i, uint64_t gen) {
  Node& n = *nodes_[i];
  if (!n.alive || n.gen != gen) return;
  n.core->Tick(now_);
  Drain(n);
  At(now_ + 20 + Rand(10), i, [this, i, gen] { TickLoop(i, gen); });
}

void Sim::CheckpointLoop(int i, uint64_t gen) {
  Node& n = *nodes_[i];
  if (!n.alive || n.gen != gen || n.stopping) return;
  n.disk.has = true;
  n.disk.clean = false;
  n.disk.state = n.state;
  // A periodic checkpoint's lsn is approximate in the shard (read beside the tables).
  n.disk.lsn = n.core->lsn() - (n.core->lsn() > 0 ? Rand(2) : 0);
  n.disk.log_epoch = n.core->log_epoch();
  n.disk.inc = n.inc;
  At(now_ + 1000 + Rand(4000), i, [this, i, gen] { CheckpointLoop(i, gen); });
}

void Sim::KillNode(int i, const std::string& why) {
  Node& n = *nodes_[i];
  Log("kill -9 replica " + std::to_string(i) + " (" + why + ")");
  result_.kills++;
  n.alive = false;
  n.down_clean = false;
  n.core.reset();
  n.gen++;
  n.inbox.clear();
  n.pushes.clear();
  n.busy = n.push_busy = false;
}

void Sim::CleanStop(int i) {
  Node& n = *nodes_[i];
  if (!n.alive || n.stopping) return;
  if (n.busy || n.push_busy) {  // the shard finishes the update in hand first
    const uint64_t gen = n.gen;
    At(now_ + 1, i, [this, i, gen] {
      if (nodes_[i]->gen == gen) CleanStop(i);
    });
    return;
  }
  Log("SIGTERM replica " + std::to_string(i));
  result_.clean_stops++;
  n.stopping = true;
  n.core->Stop(now_);
  Drain(n);
  FinishStop(i, n.gen, now_);
}

void Sim::FinishStop(int i, uint64_t gen, uint64_t started) {
  Node& n = *nodes_[i];
  if (!n.alive || n.gen != gen) return;
  if (!n.core->stop_settled() && now_ - started < 1000) {
    At(now_ + 5, -1, [this, i, gen, started] { FinishStop(i, gen, started); });
    return;
  }
  // As the shard: the final checkpoint is clean only if its state is a point of the
  // group's history (ShardServer::Stop, Replica::ExactState).
  n.disk = Node::Disk{true,          !n.core->needs_snapshot(), n.state,
                      n.core->lsn(), n.core->log_epoch(),       n.inc};
  n.alive = false;
  n.down_clean = true;
  n.core.reset();
  n.gen++;
  n.inbox.clear();
  n.pushes.clear();
}

void Sim::NodeSend(Node& from, size_t member, Frames frames) {
  const int to = static_cast<int>(member);
  const int f = from.index;
  const uint64_t gen = from.gen;
  Net(f, to, 0, [this, to, f, gen, frames] { Deliver(to, f, gen, frames); });
}

void Sim::Deliver(int to, int from, uint64_t from_gen, Frames frames) {
  Node& n = *nodes_[to];
  if (n.busy) {
    n.inbox.push_back([this, to, from, from_gen, frames] { Process(to, from, from_gen, frames); });
    return;
  }
  Process(to, from, from_gen, std::move(frames));
}

void Sim::Process(int to, int from, uint64_t from_gen, Frames frames) {
  Node& n = *nodes_[to];
  auto h = DecodeHeader(frames[0].data(), frames[0].size());
  if (!h.ok()) return;
  auto reply_to = [this, to, from, from_gen](const Header& r) {
    Net(to, from, from_gen, [this, from, to, r] {
      Node& s = *nodes_[from];
      s.core->OnReply(now_, static_cast<size_t>(to), r);
      Drain(s);
    });
  };
  Header reply;
  const auto action = n.core->BeginMessage(now_, *h, frames, &reply);
  Drain(n);
  if (action == ReplicaCore::Action::kReply) return reply_to(reply);
  n.busy = true;
  const uint64_t gen = n.gen;
  At(now_ + Rand(o_.backup_apply_ms), to, [this, to, gen, header = *h, frames, action, reply_to] {
    Node& m = *nodes_[to];
    if (!m.alive || m.gen != gen) return;
    Status st;
    if (action == ReplicaCore::Action::kLoad) {
      Model loaded;
      if (loaded.Parse(m.core->TakeLoad())) {
        m.state = std::move(loaded);
        result_.snapshots++;
      } else {
        st = DataLoss("snapshot does not parse");
      }
    } else {
      auto inner = DecodeHeader(frames[1].data(), frames[1].size());
      if (!inner.ok()) {
        st = inner.status();
      } else {
        m.state.Apply(PushId(inner->sender, inner->seq));
      }
    }
    Header r = m.core->FinishMessage(now_, header, st);
    Header early;
    Frames early_frames;
    while (m.core->NextEarly(&early, &early_frames)) {
      auto inner = DecodeHeader(early_frames[1].data(), early_frames[1].size());
      if (inner.ok()) m.state.Apply(PushId(inner->sender, inner->seq));
      r = m.core->FinishMessage(now_, early, inner.status());
    }
    Drain(m);
    m.busy = false;
    reply_to(r);
    while (!m.busy && !m.inbox.empty() && m.alive && m.gen == gen) {
      auto next = std::move(m.inbox.front());
      m.inbox.pop_front();
      next();
    }
  });
}

void Sim::NodeKv(Node& from, uint64_t id, KvCall call) {
  const int f = from.index;
  const uint64_t gen = from.gen;
  auto shared = std::make_shared<KvCall>(std::move(call));
  Net(f, kEtcd, 0, [this, f, gen, id, shared] {
    KvResult r = etcd_.Do(now_, *shared);
    Net(kEtcd, f, gen, [this, f, id, r] {
      Node& n = *nodes_[f];
      n.core->OnKv(now_, id, r);
      Drain(n);
    });
  });
}

void Sim::NodeSnapshot(Node& from, size_t member, uint64_t token) {
  const int f = from.index;
  const uint64_t gen = from.gen;
  At(now_ + Rand(20), f, [this, f, gen, member, token] {
    Node& n = *nodes_[f];
    if (!n.alive || n.gen != gen || n.push_busy) {
      if (n.alive && n.gen == gen) {  // the snapshot waits for the push in hand (order_mu_)
        At(now_ + 1, f, [this, f, gen, member, token] {
          Node& m = *nodes_[f];
          if (!m.alive || m.gen != gen) return;
          m.core->OnSnapshot(now_, member, token, m.state.Serialize(), m.core->lsn());
          Drain(m);
        });
      }
      return;
    }
    n.core->OnSnapshot(now_, member, token, n.state.Serialize(), n.core->lsn());
    Drain(n);
  });
}

// ------------------------------------------------------------------------------ clients

void Sim::ClientSend(int c) {
  Client& cl = clients_[c];
  cl.attempt++;
  Header h;
  h.op = Op::kPushSparse;
  h.sender = static_cast<uint64_t>(c + 1);
  h.seq = cl.seq;
  h.epoch = cl.max_epoch;
  h.request_id = static_cast<uint32_t>(cl.attempt);
  Frames frames{Frame::FromString(EncodeHeader(h))};
  const uint64_t attempt = cl.attempt;
  const int target = cl.target;
  result_.sent++;
  Net(kClientBase + c, target, 0,
      [this, target, c, attempt, frames] { OnClientPush(target, c, attempt, frames); });
  At(now_ + 300, -1, [this, c, attempt] {
    Client& x = clients_[c];
    if (!x.inflight || x.attempt != attempt) return;
    x.target = (x.target + 1) % n_;  // a silent replica may be a dead primary
    ClientSend(c);
  });
}

void Sim::OnClientPush(int node, int c, uint64_t attempt, Frames frames) {
  Node& n = *nodes_[node];
  if (n.push_busy) {
    n.pushes.push_back([this, node, c, attempt, frames] { ProcessPush(node, c, attempt, frames); });
    return;
  }
  ProcessPush(node, c, attempt, std::move(frames));
}

void Sim::ProcessPush(int node, int c, uint64_t attempt, Frames frames) {
  Node& n = *nodes_[node];
  auto h = DecodeHeader(frames[0].data(), frames[0].size());
  std::optional<uint32_t> primary;
  Status st = n.core->CheckPrimary(now_, h->epoch, &primary);
  Drain(n);
  if (!st.ok()) return ReplyToClient(node, c, attempt, *h, st, primary);
  n.push_busy = true;
  const uint64_t gen = n.gen;
  // The shard applies the push with the replica's lock released, then logs it.
  At(now_ + Rand(3), node, [this, node, gen, c, attempt, frames, header = *h] {
    Node& m = *nodes_[node];
    if (!m.alive || m.gen != gen) return;
    const uint64_t id = PushId(header.sender, header.seq);
    uint64_t lsn;
    if (m.state.Has(id)) {
      lsn = m.core->lsn();  // a duplicate waits for everything logged so far
    } else {
      m.state.Apply(id);
      lsn = m.core->Append(frames);
    }
    m.core->WhenCommitted(lsn, [this, node, c, attempt, header](const Status& s) {
      ReplyToClient(node, c, attempt, header, s);
    });
    Drain(m);
    m.push_busy = false;
    while (!m.push_busy && !m.pushes.empty() && m.alive && m.gen == gen) {
      auto next = std::move(m.pushes.front());
      m.pushes.pop_front();
      next();
    }
  });
}

void Sim::ReplyToClient(int node, int c, uint64_t attempt, const Header& req, const Status& st,
                        std::optional<uint32_t> primary) {
  Header r = MakeReply(req, st);
  r.primary = primary;
  r.epoch = nodes_[node]->core ? nodes_[node]->core->epoch() : 0;
  Net(node, kClientBase + c, 0, [this, c, attempt, r] { OnClientReply(c, attempt, r); });
}

void Sim::OnClientReply(int c, uint64_t attempt, const Header& reply) {
  Client& cl = clients_[c];
  if (!cl.inflight || cl.attempt != attempt) return;
  Status st = ReplyStatus(reply);
  // Epoch fencing, as PsClient does: never take an answer from an older primary.
  if (reply.epoch > cl.max_epoch) cl.max_epoch = reply.epoch;
  if (reply.epoch < cl.max_epoch && st.code() != StatusCode::kNotPrimary) {
    st = Status(StatusCode::kNotPrimary, "answer from a deposed primary");
  }
  if (st.ok()) {
    const uint64_t id = PushId(static_cast<uint64_t>(c + 1), cl.seq);
    acked_.push_back(id);
    acked_set_.insert(id);
    last_ack_ms_ = now_;
    if (!faulting_) acks_after_heal_++;
    if (!o_.unsafe_kills) CheckAcked({id}, "on acknowledgement");
    cl.inflight = false;
    At(now_ + Rand(o_.think_ms), -1, [this, c] {
      Client& x = clients_[c];
      if (!pushing_ || x.inflight) return;
      x.seq++;
      x.inflight = true;
      ClientSend(c);
    });
    return;
  }
  if (st.code() == StatusCode::kNotPrimary) {
    if (reply.code == StatusCode::kNotPrimary && reply.primary) {
      cl.target = static_cast<int>(*reply.primary % n_);
      return ClientSend(c);
    }
    cl.target = (cl.target + 1) % n_;
  }
  At(now_ + 20, -1, [this, c, attempt] {
    Client& x = clients_[c];
    if (x.inflight && x.attempt == attempt) ClientSend(c);
  });
}

// ------------------------------------------------------------------------------ faults

std::vector<std::pair<int, uint64_t>> Sim::EtcdIsr() const {
  std::vector<std::pair<int, uint64_t>> out;
  const KvEntry* e = etcd_.Get(std::string(kGroup) + "isr");
  if (e == nullptr) return out;
  auto j = nlohmann::json::parse(e->value, nullptr, false);
  if (!j.is_object()) return out;
  for (const auto& m : j.value("members", nlohmann::json::array())) {
    out.emplace_back(m.value("index", 0),
                     std::stoull(m.value("incarnation", std::string("0")), nullptr, 16));
  }
  return out;
}

void Sim::CheckAcked(const std::vector<uint64_t>& ids, const std::string& when) {
  for (const auto& [i, inc] : EtcdIsr()) {
    if (i < 0 || i >= n_) continue;
    const Node& n = *nodes_[i];
    if (!n.alive || n.inc != inc || !n.core) continue;
    for (uint64_t id : ids) {
      if (!n.state.Has(id)) {
        Fail("acknowledged push " + std::to_string(id) + " is missing on in-sync replica " +
             std::to_string(i) + " (" + when + ")");
        return;
      }
    }
  }
}

void Sim::FaultLoop() {
  if (!faulting_) return;
  At(now_ + 200 + Rand(2500), -1, [this] { FaultLoop(); });
  const uint64_t pick = Rand(100);
  const int i = static_cast<int>(Rand(n_));
  Node& n = *nodes_[i];
  if (pick < 25) {
    if (!n.alive || n.stopping) return;
    bool other_in_sync = false;
    for (const auto& [j, inc] : EtcdIsr()) {
      if (j != i && j >= 0 && j < n_ && nodes_[j]->alive && nodes_[j]->inc == inc) {
        other_in_sync = true;
      }
    }
    if (!other_in_sync && !o_.unsafe_kills) return;
    KillNode(i, other_in_sync ? "another in-sync replica lives" : "unsafe");
    const bool fast = Rand(2) == 0;
    const bool with_state = Rand(2) == 0;
    At(now_ + (fast ? Rand(300) : 300 + Rand(3700)), -1, [this, i, with_state] {
      if (nodes_[i]->alive) return;
      result_.restarts++;
      StartNode(i, with_state);
    });
  } else if (pick < 40) {
    if (!n.alive || n.stopping) return;
    CleanStop(i);
    At(now_ + 1100 + Rand(3000), -1, [this, i] {
      if (nodes_[i]->alive) return;
      result_.restarts++;
      StartNode(i, true);
    });
  } else if (pick < 65) {
    // A partition: one replica from everything, from etcd only, or one link.
    std::vector<std::pair<int, int>> cut;
    const uint64_t kind = Rand(4);
    if (kind == 0) {
      for (int m = 0; m < n_; ++m)
        if (m != i) cut.emplace_back(i, m);
      cut.emplace_back(i, kEtcd);
      for (int c = 0; c < o_.clients; ++c) cut.emplace_back(i, kClientBase + c);
    } else if (kind == 1) {
      cut.emplace_back(i, kEtcd);
    } else if (kind == 2) {
      cut.emplace_back(i, static_cast<int>((i + 1 + Rand(n_ - 1)) % n_));
    } else {
      for (int m = 0; m < n_; ++m)
        if (m != i) cut.emplace_back(i, m);
    }
    result_.partitions++;
    for (auto& [a, b] : cut) cuts_.insert({std::min(a, b), std::max(a, b)});
    Log("partition of replica " + std::to_string(i) + " (kind " + std::to_string(kind) + ")");
    At(now_ + 200 + Rand(4800), -1, [this, cut] {
      for (auto& [a, b] : cut) cuts_.erase({std::min(a, b), std::max(a, b)});
    });
  } else if (pick < 75) {
    if (!n.alive) return;
    result_.pauses++;
    n.paused_until = now_ + 200 + Rand(2800);
    Log("pause replica " + std::to_string(i) + " until " + std::to_string(n.paused_until));
  } else if (pick < 85) {
    drop_ = RandDouble() * 0.1;
    dup_ = RandDouble() * 0.1;
    jitter_ = 1 + Rand(40);
  }
}

void Sim::Heal() {
  faulting_ = false;
  cuts_.clear();
  drop_ = dup_ = 0;
  jitter_ = 3;
  Log("heal: no more faults");
  for (int i = 0; i < n_; ++i) {
    nodes_[i]->paused_until = 0;
    if (!nodes_[i]->alive) {
      result_.restarts++;
      StartNode(i, Rand(2) == 0 || nodes_[i]->down_clean);
    }
  }
}

void Sim::RestartBackup() {
  for (int i = 0; i < n_; ++i) {
    Node& n = *nodes_[i];
    if (!n.alive || !n.core || n.core->primary()) continue;
    KillNode(i, "scripted: a backup restarted empty");
    result_.restarts++;
    StartNode(i, false);
    WatchResync(i, n.inc, now_);
    return;
  }
  Fail("no live backup to restart");
}

void Sim::WatchResync(int i, uint64_t inc, uint64_t since) {
  const Node& n = *nodes_[i];
  if (!n.alive || n.inc != inc) return;
  for (const auto& [j, isr_inc] : EtcdIsr()) {
    if (j == i && isr_inc == inc) {
      result_.resync_ms = now_ - since;
      Log("replica " + std::to_string(i) + " back in the ISR after " +
          std::to_string(result_.resync_ms) + " ms");
      return;
    }
  }
  At(now_ + 5, -1, [this, i, inc, since] { WatchResync(i, inc, since); });
}

void Sim::FinalCheck() {
  int primary = -1;
  const KvEntry* leader = etcd_.Get(std::string(kGroup) + "leader");
  for (int i = 0; i < n_; ++i) {
    const Node& n = *nodes_[i];
    if (n.alive && n.core && n.core->primary()) {
      if (primary >= 0) return Fail("two primaries at the end");
      primary = i;
    }
  }
  if (primary < 0 || leader == nullptr) return Fail("no primary after the faults stopped");
  if (acks_after_heal_ < 10) {
    return Fail("only " + std::to_string(acks_after_heal_) + " pushes acknowledged after healing");
  }
  const Node& p = *nodes_[primary];
  for (uint64_t id : acked_) {
    if (!p.state.Has(id)) {
      result_.lost++;
      if (!o_.unsafe_kills) return Fail("acknowledged push " + std::to_string(id) + " lost");
    }
  }
  auto isr = EtcdIsr();
  for (int i = 0; i < n_; ++i) {
    const Node& n = *nodes_[i];
    bool in = false;
    for (const auto& [j, inc] : isr) in |= j == i && n.inc == inc;
    if (!in) return Fail("replica " + std::to_string(i) + " did not rejoin the ISR");
    if (n.state.order != p.state.order) {
      return Fail("in-sync replica " + std::to_string(i) + " holds " +
                  std::to_string(n.state.order.size()) + " pushes, the primary " +
                  std::to_string(p.state.order.size()) +
                  (n.state.ids == p.state.ids ? ": the same ones in another order" : ""));
    }
  }
}

SimResult Sim::Run() {
  for (int i = 0; i < n_; ++i) StartNode(i, false);
  for (int c = 0; c < o_.clients; ++c) {
    clients_[c].inflight = true;
    clients_[c].target = static_cast<int>(Rand(n_));
    At(Rand(100), -1, [this, c] { ClientSend(c); });
  }
  if (o_.faults) At(3000 + Rand(3000), -1, [this] { FaultLoop(); });
  if (o_.restart_backup_at_ms != 0) At(o_.restart_backup_at_ms, -1, [this] { RestartBackup(); });
  At(o_.fault_ms, -1, [this] { Heal(); });
  At(o_.fault_ms + o_.settle_ms, -1, [this] { pushing_ = false; });
  for (uint64_t t = 1000; t < o_.fault_ms + o_.settle_ms; t += 1000) {
    if (!o_.unsafe_kills) At(t, -1, [this] { CheckAcked(acked_, "periodic check"); });
  }
  const uint64_t end = o_.fault_ms + o_.settle_ms + 3000;
  while (!events_.empty() && result_.ok) {
    Event e = events_.top();
    events_.pop();
    if (e.at > end) break;
    now_ = e.at;
    if (e.node >= 0 && nodes_[e.node]->paused_until > now_) {
      events_.push(Event{nodes_[e.node]->paused_until, next_seq_++, e.node, std::move(e.fn)});
      continue;
    }
    e.fn();
  }
  if (result_.ok) FinalCheck();
  result_.acked = acked_.size();
  result_.end_ms = now_;
  for (const auto& n : nodes_) {
    if (n->core) {
      auto s = n->core->Stats();
      result_.elections += s.promotions;
      result_.unclean_elections += s.unclean_elections;
    }
  }
  return result_;
}

}  // namespace

std::string SimResult::Summary() const {
  std::ostringstream s;
  s << (ok ? "ok" : "FAILED " + failure) << ": " << acked << " acked of " << sent << " sent, "
    << kills << " kills, " << clean_stops << " clean stops, " << restarts << " restarts, "
    << partitions << " partitions, " << pauses << " pauses, " << snapshots << " snapshots loaded, "
    << messages << " messages (" << dropped << " dropped)";
  if (lost) s << ", " << lost << " acknowledged pushes lost";
  return s.str();
}

SimResult RunSim(const SimOptions& options) {
  auto level = spdlog::get_level();
  spdlog::set_level(options.verbose ? spdlog::level::debug : spdlog::level::off);
  Sim sim(options);
  SimResult r = sim.Run();
  spdlog::set_level(level);
  return r;
}

}  // namespace onlineps::sim
