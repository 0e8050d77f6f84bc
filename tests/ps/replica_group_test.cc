// ReplicaGroup (ps/replica_group.h): what a replica writes to etcd reads back the same,
// values from other writers are skipped by name, and the transactions compare what the
// protocol relies on. Run against the in-memory etcd model of the simulation.
#include "ps/replica_group.h"

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>

#include "ps/replica_core.h"
#include "tests/ps/sim_etcd.h"

namespace onlineps::ps {
namespace {

KvResult Txn(sim::SimEtcd& etcd, const KvTxn& txn, uint64_t now = 0) {
  KvCall call;
  call.kind = KvCall::Kind::kTxn;
  call.txn = txn;
  return etcd.Do(now, call);
}

std::vector<KvEntry> Range(sim::SimEtcd& etcd, const std::string& prefix) {
  KvCall call;
  call.kind = KvCall::Kind::kRange;
  call.prefix = prefix;
  return etcd.Do(0, call).entries;
}

TEST(ReplicaGroupTest, RegistrationsLeaderAndIsrReadBack) {
  sim::SimEtcd etcd;
  ReplicaGroup g("/c/shard-0-of-1/");
  GroupRegistration reg{0xabcdef0123456789ULL, 7, 42, true, true, 0};
  ASSERT_TRUE(Txn(etcd, g.Register(1, "tcp://b:7000", reg, 0)).succeeded);
  GroupView empty = g.Parse(Range(etcd, g.prefix()));
  EXPECT_FALSE(empty.has_leader);
  EXPECT_FALSE(empty.has_isr);
  KvResult won = Txn(etcd, g.Campaign(empty, {1, reg.incarnation}, "tcp://b:7000", 0));
  ASSERT_TRUE(won.succeeded);
  GroupView v = g.Parse(won.entries);
  ASSERT_TRUE(v.has_leader);
  EXPECT_EQ(v.leader.index, 1u);
  EXPECT_EQ(v.leader.incarnation, reg.incarnation);
  EXPECT_EQ(v.leader.epoch, won.revision);  // the epoch is the election's revision
  ASSERT_EQ(v.members.size(), 1u);
  EXPECT_EQ(v.members[1].lsn, 42u);
  EXPECT_EQ(v.members[1].log_epoch, 7u);
  EXPECT_TRUE(v.members[1].need);
  EXPECT_TRUE(v.members[1].data);
  // A second campaign on the same view loses: the leader exists.
  EXPECT_FALSE(Txn(etcd, g.Campaign(empty, {0, 5}, "tcp://a:7000", 0)).succeeded);
  // The ISR: first write needs it absent, then its mod revision, and the leader's epoch.
  std::vector<GroupMember> isr{{1, reg.incarnation}};
  EXPECT_FALSE(Txn(etcd, g.WriteIsr(v.leader.epoch + 1, 0, true, 0, isr)).succeeded);
  KvResult w = Txn(etcd, g.WriteIsr(v.leader.epoch, 0, true, 0, isr));
  ASSERT_TRUE(w.succeeded);
  GroupView after = g.Parse(w.entries);
  ASSERT_TRUE(after.has_isr);
  EXPECT_EQ(after.isr, isr);
  EXPECT_EQ(after.isr_epoch, v.leader.epoch);
  EXPECT_FALSE(Txn(etcd, g.WriteIsr(v.leader.epoch, 0, true, 0, isr)).succeeded);
  EXPECT_FALSE(
      Txn(etcd, g.WriteIsr(v.leader.epoch, 0, false, after.isr_mod_revision - 1, isr)).succeeded);
  EXPECT_TRUE(
      Txn(etcd, g.WriteIsr(v.leader.epoch, 0, false, after.isr_mod_revision, isr)).succeeded);
  // A campaign on a stale view of the ISR loses even with the leader gone.
  ASSERT_TRUE(Txn(etcd, g.RemoveLeader(v.leader.epoch, 0)).succeeded);
  EXPECT_FALSE(Txn(etcd, g.Campaign(after, {0, 5}, "tcp://a:7000", 0)).succeeded);
  EXPECT_TRUE(
      Txn(etcd, g.Campaign(g.Parse(Range(etcd, g.prefix())), {0, 5}, "tcp://a:7000", 0)).succeeded);
}

// A new group's campaign writes the epoch base it is given, and every epoch is then that
// base plus the leader key's create revision: after etcd lost its data (revisions start
// over), a group formed with the replicas' highest epoch as its base still numbers its
// epochs above every old one. The transactions that name an epoch compare the revision.
TEST(ReplicaGroupTest, ANewGroupsEpochsStartAboveItsBase) {
  sim::SimEtcd etcd;
  ReplicaGroup g("/c/shard-0-of-1/");
  GroupView empty = g.Parse(Range(etcd, g.prefix()));
  EXPECT_EQ(empty.epoch_base, 0u);
  KvResult won = Txn(etcd, g.Campaign(empty, {0, 5}, "tcp://a:7000", 0, /*new_base=*/1000));
  ASSERT_TRUE(won.succeeded);
  GroupView v = g.Parse(won.entries);
  EXPECT_EQ(v.epoch_base, 1000u);
  EXPECT_EQ(v.leader.epoch, 1000 + won.revision);
  std::vector<GroupMember> isr{{0, 5}};
  EXPECT_FALSE(Txn(etcd, g.WriteIsr(won.revision, v.epoch_base, true, 0, isr)).succeeded)
      << "the raw revision is not the epoch";
  KvResult w = Txn(etcd, g.WriteIsr(v.leader.epoch, v.epoch_base, true, 0, isr));
  ASSERT_TRUE(w.succeeded);
  GroupView after = g.Parse(w.entries);
  EXPECT_EQ(after.isr_epoch, v.leader.epoch);
  // An election with the ISR in place keeps the base (new_base is ignored).
  ASSERT_TRUE(Txn(etcd, g.RemoveLeader(v.leader.epoch, v.epoch_base)).succeeded);
  KvResult again = Txn(etcd, g.Campaign(g.Parse(Range(etcd, g.prefix())), {0, 5}, "tcp://a:7000", 0,
                                        /*new_base=*/7));
  ASSERT_TRUE(again.succeeded);
  GroupView next = g.Parse(again.entries);
  EXPECT_EQ(next.epoch_base, 1000u);
  EXPECT_GT(next.leader.epoch, v.leader.epoch);
  // A malformed base is skipped by name.
  std::vector<std::string> skipped;
  g.Parse({{"/c/shard-0-of-1/epoch_base", "{\"base\": -1}", 3, 3, 0}}, &skipped);
  EXPECT_EQ(skipped, (std::vector<std::string>{"/c/shard-0-of-1/epoch_base"}));
}

TEST(ReplicaGroupTest, ForeignValuesAreSkippedByName) {
  std::vector<KvEntry> entries = {{"/g/leader", "not json", 3, 3, 0},
                                  {"/g/members/x", "{}", 4, 4, 0},
                                  {"/g/isr", "[1,2]", 5, 5, 0},
                                  {"/other/leader", "{\"index\":1}", 6, 6, 0}};
  std::vector<std::string> skipped;
  GroupView v = ReplicaGroup("/g/").Parse(entries, &skipped);
  EXPECT_FALSE(v.has_leader);
  EXPECT_FALSE(v.has_isr);
  EXPECT_TRUE(v.members.empty());
  EXPECT_EQ(skipped, (std::vector<std::string>{"/g/leader", "/g/members/x", "/g/isr"}));
}

TEST(ReplicaGroupTest, IncarnationsRoundTripAndRejectGarbage) {
  EXPECT_EQ(ParseIncarnation(IncarnationHex(0x0123456789abcdefULL)), 0x0123456789abcdefULL);
  EXPECT_EQ(IncarnationHex(1), "0000000000000001");
  EXPECT_EQ(ParseIncarnation("xyz"), 0u);
  EXPECT_EQ(ParseIncarnation("00000000000000001"), 0u);  // 17 digits
  EXPECT_EQ(ParseIncarnation(""), 0u);
}

// Two ReplicaCores on SimEtcd, messages delivered in order, no faults.
struct TwoCoresNode final : ReplicaEnv {
  std::deque<std::pair<size_t, Frames>> out;
  std::deque<std::pair<uint64_t, KvCall>> kv;
  std::deque<std::pair<size_t, uint64_t>> snaps;
  void Send(size_t m, Frames f) override { out.emplace_back(m, std::move(f)); }
  void Kv(uint64_t id, KvCall c) override { kv.emplace_back(id, std::move(c)); }
  void TakeSnapshot(size_t m, uint64_t t) override { snaps.emplace_back(m, t); }
};

ReplicaConfig TwoCoresConfig(uint32_t index, size_t chunk, uint64_t lsn) {
  ReplicaConfig c;
  c.members = {"a", "b"};
  c.index = index;
  c.group = "/r/shard-0-of-1/";
  c.incarnation = 100 + index;
  c.snapshot_chunk_bytes = chunk;
  c.restored = true;  // both hold data of unknown position: the one with lsn 10 leads
  c.restored_lsn = lsn;
  return c;
}

// A primary whose snapshot chunk is smaller than the backup's (the shard sets it from
// --max-message-mb) sends a multi-part snapshot; the backup loads it (it bounded the
// part count by its own chunk size and refused every part as "does not fit").
TEST(ReplicaCoreTwoNodesTest, BackupWithLargerChunkLoadsMultiPartSnapshot) {
  sim::SimEtcd etcd;
  TwoCoresNode env[2];
  ReplicaCore a(TwoCoresConfig(0, 256 << 10, 10), &env[0]);
  ReplicaCore b(TwoCoresConfig(1, 1 << 20, 0), &env[1]);
  ReplicaCore* core[2] = {&a, &b};
  const std::string state(4 << 20, 'x');
  int loads = 0, refusals = 0;
  std::string refusal;
  uint64_t now = 1;
  a.Start(now);
  b.Start(now);
  for (; now < 20000 && loads == 0; now += 5) {
    for (int i = 0; i < 2; ++i) core[i]->Tick(now);
    for (int i = 0; i < 2; ++i) {
      while (!env[i].kv.empty()) {
        auto [id, call] = env[i].kv.front();
        env[i].kv.pop_front();
        core[i]->OnKv(now, id, etcd.Do(now, call));
      }
      while (!env[i].snaps.empty()) {
        auto [m, t] = env[i].snaps.front();
        env[i].snaps.pop_front();
        core[i]->OnSnapshot(now, m, t, state, core[i]->lsn());
      }
      while (!env[i].out.empty()) {
        auto [m, frames] = std::move(env[i].out.front());
        env[i].out.pop_front();
        auto h = DecodeHeader(frames[0].data(), frames[0].size());
        ASSERT_TRUE(h.ok());
        Header reply;
        auto action = core[m]->BeginMessage(now, *h, frames, &reply);
        if (action == ReplicaCore::Action::kLoad) {
          EXPECT_EQ(core[m]->TakeLoad().size(), state.size());
          ++loads;
          reply = core[m]->FinishMessage(now, *h, Status::Ok());
        } else if (action == ReplicaCore::Action::kApply) {
          reply = core[m]->FinishMessage(now, *h, Status::Ok());
        }
        if (reply.code == StatusCode::kMalformed) {
          ++refusals;
          refusal = reply.message;
        }
        core[i]->OnReply(now, m, reply);
      }
    }
  }
  EXPECT_TRUE(a.primary());
  EXPECT_GE(loads, 1) << "the backup never loaded the snapshot; " << refusals
                      << " parts refused, last: " << refusal;
}

// No push is acknowledged without a member the ISR names. An etcd stall (a slow fsync) of
// ~0.8 s on the primary's etcd client, with the primary's ISR write that adds a backup queued
// behind a read. The primary steps down at its lease deadline; when etcd answers again (FIFO,
// renewals first, as EtcdKv does) the read re-elects it on its still-valid lease (Won resets every
// follower; the read predates the ISR write, so the backup is not kept), then the ISR write's
// answer puts the backup in isr_ while nothing counts it: pushes are acknowledged on the primary
// alone while etcd's ISR names the backup, which was then elected without them. A member
// the ISR names now counts for commits until a write removing it lands.
struct StallNode final : ReplicaEnv {
  struct Call {
    uint64_t id;
    KvCall call;
  };
  std::deque<std::pair<size_t, Frames>> out;
  std::deque<Call> urgent, normal;
  void Send(size_t m, Frames f) override { out.emplace_back(m, std::move(f)); }
  void Kv(uint64_t id, KvCall c) override {
    const bool u = c.kind == KvCall::Kind::kKeepAlive || c.kind == KvCall::Kind::kRevoke;
    (u ? urgent : normal).push_back(Call{id, std::move(c)});
  }
  void TakeSnapshot(size_t, uint64_t) override {}
};

TEST(ReplicaCoreTwoNodesTest, EtcdStallDoesNotAckWithoutAnIsrMember) {
  sim::SimEtcd etcd;
  StallNode env[2];
  auto config = [](uint32_t index) {
    ReplicaConfig c;
    c.members = {"a", "b"};
    c.index = index;
    c.group = "/r/shard-0-of-1/";
    c.incarnation = 100 + index;
    c.heartbeat_ms = 100;
    c.lease_ms = 1000;
    c.kv_timeout_ms = 1000;
    c.follower_timeout_ms = 2000;
    c.bootstrap_wait_ms = 3000;
    return c;
  };
  ReplicaCore a(config(0), &env[0]), b(config(1), &env[1]);
  ReplicaCore* core[2] = {&a, &b};
  bool stalled = false, link = false;
  int phase = 0;  // 0: forming, 1: stalled, 2: resumed, 3: acked
  uint64_t acked_lsn = 0, stepdown_at = 0;
  bool acked_while_isr_names_b = false, ok = false;
  std::string isr_at_ack;
  auto run_kv = [&](int i, uint64_t now, bool one_by_one_hook) {
    for (int guard = 0; guard < 100; ++guard) {
      StallNode& e = env[i];
      if (e.urgent.empty() && e.normal.empty()) return;
      auto& q = e.urgent.empty() ? e.normal : e.urgent;
      StallNode::Call c = std::move(q.front());
      q.pop_front();
      const bool was_isr = c.call.kind == KvCall::Kind::kTxn && !c.call.txn.puts.empty() &&
                           c.call.txn.puts[0].key == "/r/shard-0-of-1/isr";
      core[i]->OnKv(now, c.id, etcd.Do(now, c.call));
      if (one_by_one_hook && was_isr && a.primary() && phase == 2) {
        // A push arrives now (on a busy shard, thousands a second do).
        Frames req{Frame::FromString(EncodeHeader(Header{}))};
        ASSERT_TRUE(a.CheckPrimary(now, 0).ok());
        acked_lsn = a.Append(req);
        a.WhenCommitted(acked_lsn, [&](const Status& st) { ok = st.ok(); });
        for (auto& [done, st] : a.TakeCompletions()) done(st);
        const KvEntry* isr = etcd.Get("/r/shard-0-of-1/isr");
        isr_at_ack = isr ? isr->value : "";
        acked_while_isr_names_b = ok && isr_at_ack.find("\"index\":1") != std::string::npos;
        phase = 3;  // pushed (acknowledged or waiting)
      }
    }
  };
  uint64_t now = 1;
  a.Start(now);
  b.Start(now);
  for (; now < 30000; now += 5) {
    for (int i = 0; i < 2; ++i) core[i]->Tick(now);
    if (phase == 0 && a.primary()) {
      bool read_pending = false;
      for (auto& c : env[0].normal) read_pending |= c.call.kind == KvCall::Kind::kRange;
      if (read_pending) {  // etcd stalls for the primary now; the backup starts acking
        stalled = true;
        link = true;
        phase = 1;
      }
    }
    if (phase == 1 && a.Stats().step_downs > 0) {
      if (stepdown_at == 0) stepdown_at = now;
      if (now >= stepdown_at + 50) {
        stalled = false;
        phase = 2;
      }
    }
    if (!stalled) run_kv(0, now, true);
    run_kv(1, now, false);
    for (int i = 0; i < 2; ++i) {
      while (!env[i].out.empty()) {
        auto [m, frames] = std::move(env[i].out.front());
        env[i].out.pop_front();
        if (!link) continue;
        auto h = DecodeHeader(frames[0].data(), frames[0].size());
        Header reply;
        auto action = core[m]->BeginMessage(now, *h, frames, &reply);
        if (action != ReplicaCore::Action::kReply)
          reply = core[m]->FinishMessage(now, *h, Status::Ok());
        core[i]->OnReply(now, m, reply);
      }
    }
    for (int i = 0; i < 2; ++i) core[i]->TakeCompletions();
    if (phase == 3 && b.primary()) break;
  }
  ASSERT_EQ(phase, 3) << "scenario did not unfold";
  std::printf("push lsn %llu: %s; backup %s at lsn %llu\n", (unsigned long long)acked_lsn,
              ok ? "acknowledged" : "not acknowledged", b.primary() ? "primary" : "backup",
              (unsigned long long)b.lsn());
  EXPECT_FALSE(acked_while_isr_names_b)
      << "push lsn " << acked_lsn << " acknowledged by the primary alone while etcd's ISR is "
      << isr_at_ack << " and the backup is at lsn " << b.lsn();
  if (b.primary() && ok) {
    EXPECT_GE(b.lsn(), acked_lsn) << "the backup was elected without acknowledged push lsn "
                                  << acked_lsn << " (it is at lsn " << b.lsn() << ")";
  }
}

// Two ReplicaCores on SimEtcd (the first restored at lsn 10, so it leads), messages
// delivered in order, etcd answering at once. A backup's snapshot load may take
// `load_ms`: the backup handles nothing else meanwhile, and messages to it queue.
struct TwoCores {
  sim::SimEtcd etcd;
  TwoCoresNode env[2];
  std::unique_ptr<ReplicaCore> core[2];
  std::deque<std::pair<size_t, Frames>> inbox[2];  // (sender, frames)
  uint64_t now = 1, load_ms = 0;
  uint64_t busy_until[2] = {0, 0};
  std::optional<std::pair<size_t, Header>> loading[2];  // (sender, header)
  std::string state = "s";
  std::function<bool(size_t to, const Header& h)> drop;  // messages lost when true

  explicit TwoCores(std::function<void(ReplicaConfig&)> tune = nullptr) {
    for (uint32_t i = 0; i < 2; ++i) {
      ReplicaConfig c = TwoCoresConfig(i, 1 << 20, i == 0 ? 10 : 0);
      if (tune) tune(c);
      core[i] = std::make_unique<ReplicaCore>(c, &env[i]);
      core[i]->Start(now);
    }
  }
  ReplicaCore& a() { return *core[0]; }
  ReplicaCore& b() { return *core[1]; }
  void Reply(size_t to, size_t from, const Header& reply) { core[to]->OnReply(now, from, reply); }
  void Deliver(size_t m) {
    if (loading[m] && now >= busy_until[m]) {
      auto [from, h] = *loading[m];
      loading[m].reset();
      Reply(from, m, core[m]->FinishMessage(now, h, Status::Ok()));
    }
    while (!loading[m] && !inbox[m].empty()) {
      auto [from, frames] = std::move(inbox[m].front());
      inbox[m].pop_front();
      auto h = DecodeHeader(frames[0].data(), frames[0].size());
      Header reply;
      auto action = core[m]->BeginMessage(now, *h, frames, &reply);
      if (action == ReplicaCore::Action::kLoad) {
        core[m]->TakeLoad();
        loading[m].emplace(from, *h);
        busy_until[m] = now + load_ms;
        return Deliver(m);
      }
      if (action == ReplicaCore::Action::kApply)
        reply = core[m]->FinishMessage(now, *h, Status::Ok());
      Reply(from, m, reply);
    }
  }
  void Step() {
    for (int i = 0; i < 2; ++i) core[i]->Tick(now);
    for (int i = 0; i < 2; ++i) {
      while (!env[i].kv.empty()) {
        auto [id, call] = env[i].kv.front();
        env[i].kv.pop_front();
        core[i]->OnKv(now, id, etcd.Do(now, call));
      }
      while (!env[i].snaps.empty()) {
        auto [m, t] = env[i].snaps.front();
        env[i].snaps.pop_front();
        core[i]->OnSnapshot(now, m, t, state, core[i]->lsn());
      }
      while (!env[i].out.empty()) {
        auto [m, frames] = std::move(env[i].out.front());
        env[i].out.pop_front();
        auto h = DecodeHeader(frames[0].data(), frames[0].size());
        if (drop && drop(m, *h)) continue;  // lost on the way
        inbox[m].emplace_back(i, std::move(frames));
      }
    }
    for (int i = 0; i < 2; ++i) Deliver(i);
    for (int i = 0; i < 2; ++i) {
      for (auto& [done, st] : core[i]->TakeCompletions()) done(st);
    }
    now += 5;
  }
  // Steps until `done` holds or `ms` pass; whether it held.
  bool RunUntil(uint64_t ms, const std::function<bool()>& done) {
    for (const uint64_t end = now + ms; now < end;) {
      if (done()) return true;
      Step();
    }
    return done();
  }
  // The primary (a) logs one update; `*acked` is set when it is acknowledged.
  void Push(bool* acked = nullptr) {
    ASSERT_TRUE(a().CheckPrimary(now, 0).ok());
    Frames req{Frame::FromString(EncodeHeader(Header{}))};
    const uint64_t lsn = a().Append(req);
    a().WhenCommitted(lsn, [acked](const Status& st) {
      if (acked != nullptr) *acked = st.ok();
    });
  }
};

// A push that passed CheckPrimary while this replica led is applied and logged only once
// it follows the next primary (ShardServer: its handler waited on the apply gate while the
// replica loaded that primary's snapshot): the backup then holds one update more than the
// primary's history, and says it needs a snapshot. The primary's snapshot, taken while
// writes are idle, is at the lsn the backup had loaded; the backup took it for a delayed
// duplicate (its lsn was one past it) and ignored it, and again every time, until writes
// resumed: it stayed out of the ISR (a group of two ran on its primary alone).
TEST(ReplicaCoreTwoNodesTest, BackupAheadOfAnIdlePrimaryAfterARacedPushReloads) {
  TwoCores g;
  ASSERT_TRUE(g.RunUntil(20000, [&] { return g.a().primary() && g.b().in_sync(); }));
  bool acked = false;
  for (int i = 0; i < 5; ++i) g.Push(&acked);
  ASSERT_TRUE(g.RunUntil(2000, [&] { return acked; }));
  const uint64_t loaded = g.b().Stats().snapshots_loaded;
  Frames req{Frame::FromString(EncodeHeader(Header{}))};
  g.b().Append(req);  // the raced push, applied on the backup
  ASSERT_TRUE(g.b().needs_snapshot());
  EXPECT_TRUE(g.RunUntil(20000,
                         [&] {
                           return g.b().Stats().snapshots_loaded > loaded &&
                                  !g.b().needs_snapshot() && g.b().in_sync();
                         }))
      << "the backup did not reload (needs a snapshot: " << g.b().needs_snapshot() << ", lsn "
      << g.b().lsn() << ", primary at " << g.a().lsn() << ")";
}

// A backup loading a snapshot while the primary logs more entries than max_log_entries:
// the entries after the snapshot were trimmed, so once loaded the backup could not stream
// and was sent a new snapshot, which took as long: under steady writes it never rejoined
// the ISR. The entries after a snapshot in progress stay (up to max_log_bytes).
TEST(ReplicaCoreTwoNodesTest, SlowSnapshotLoadUnderSteadyWritesRejoins) {
  TwoCores g([](ReplicaConfig& c) {
    c.max_log_entries = 64;
    c.window = 16;
  });
  ASSERT_TRUE(g.RunUntil(20000, [&] { return g.a().primary() && g.b().in_sync(); }));
  // The backup restarts empty (a new incarnation) and is caught up with a snapshot whose
  // load takes 1.5 s, while the primary logs one update every 5 ms.
  ReplicaConfig c = TwoCoresConfig(1, 1 << 20, 0);
  c.incarnation = 555;
  c.restored = false;
  g.core[1] = std::make_unique<ReplicaCore>(c, &g.env[1]);
  g.core[1]->Start(g.now);
  g.load_ms = 1500;
  bool rejoined = false;
  for (int i = 0; i < 6000 && !rejoined; ++i) {
    if (g.a().primary()) g.Push();
    g.Step();
    rejoined = g.b().in_sync() && g.b().Stats().snapshots_loaded > 0;
  }
  EXPECT_TRUE(rejoined) << "the backup did not rejoin in 30 s of steady writes: "
                        << g.b().Stats().snapshots_loaded << " snapshots loaded, "
                        << g.a().Stats().snapshots_sent << " sent; backup at lsn " << g.b().lsn()
                        << ", primary at " << g.a().lsn();
  EXPECT_EQ(g.b().Stats().snapshots_loaded, 1u) << "the backup reloaded";
}

// An in-sync backup lost an entry in flight (ZeroMQ drops what exceeds its high-water
// mark) that the primary then trimmed from its log (more entries or bytes than its caps
// while the backup's ack lagged): the resend restarted at the log's first entry, after
// the gap, so the backup kept acking the lsn before it, and every commit waited for it
// for ever (it answered, so it never timed out of the ISR). A backup that needs a
// trimmed entry now gets a snapshot (and leaves the ISR meanwhile).
TEST(ReplicaCoreTwoNodesTest, EntryLostInFlightAndTrimmedDoesNotStallCommits) {
  TwoCores g([](ReplicaConfig& c) { c.max_log_entries = 64; });
  ASSERT_TRUE(g.RunUntil(20000, [&] { return g.a().primary() && g.b().in_sync(); }));
  bool acked = false;
  g.Push(&acked);
  ASSERT_TRUE(g.RunUntil(2000, [&] { return acked; }));
  const uint64_t lost = g.a().lsn() + 1;
  g.drop = [&](size_t to, const Header& h) {
    return to == 1 && h.op == Op::kReplicate && h.seq == lost;
  };
  bool last_acked = false;
  for (int i = 0; i < 100; ++i) g.Push(i == 99 ? &last_acked : nullptr);  // a burst
  g.Step();
  g.drop = nullptr;
  EXPECT_TRUE(g.RunUntil(30000, [&] { return last_acked; }))
      << "the burst was never acknowledged: the backup is at lsn " << g.b().lsn()
      << ", the primary at " << g.a().lsn();
  EXPECT_TRUE(g.RunUntil(30000, [&] { return g.b().in_sync() && g.b().lsn() == g.a().lsn(); }))
      << "the backup did not catch up: at lsn " << g.b().lsn() << ", the primary at "
      << g.a().lsn();
}

}  // namespace
}  // namespace onlineps::ps
