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

}  // namespace
}  // namespace onlineps::ps
