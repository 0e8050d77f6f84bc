// ReplicaGroup (ps/replica_group.h): what a replica writes to etcd reads back the same,
// values from other writers are skipped by name, and the transactions compare what the
// protocol relies on. Run against the in-memory etcd model of the simulation.
#include "ps/replica_group.h"

#include <gtest/gtest.h>

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
  EXPECT_FALSE(Txn(etcd, g.WriteIsr(v.leader.epoch + 1, true, 0, isr)).succeeded);
  KvResult w = Txn(etcd, g.WriteIsr(v.leader.epoch, true, 0, isr));
  ASSERT_TRUE(w.succeeded);
  GroupView after = g.Parse(w.entries);
  ASSERT_TRUE(after.has_isr);
  EXPECT_EQ(after.isr, isr);
  EXPECT_EQ(after.isr_epoch, v.leader.epoch);
  EXPECT_FALSE(Txn(etcd, g.WriteIsr(v.leader.epoch, true, 0, isr)).succeeded);
  EXPECT_FALSE(
      Txn(etcd, g.WriteIsr(v.leader.epoch, false, after.isr_mod_revision - 1, isr)).succeeded);
  EXPECT_TRUE(Txn(etcd, g.WriteIsr(v.leader.epoch, false, after.isr_mod_revision, isr)).succeeded);
  // A campaign on a stale view of the ISR loses even with the leader gone.
  ASSERT_TRUE(Txn(etcd, g.RemoveLeader(v.leader.epoch)).succeeded);
  EXPECT_FALSE(Txn(etcd, g.Campaign(after, {0, 5}, "tcp://a:7000", 0)).succeeded);
  EXPECT_TRUE(
      Txn(etcd, g.Campaign(g.Parse(Range(etcd, g.prefix())), {0, 5}, "tcp://a:7000", 0)).succeeded);
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

}  // namespace
}  // namespace onlineps::ps
