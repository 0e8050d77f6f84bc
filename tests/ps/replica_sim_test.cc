// The deterministic fault simulation of shard replication (tests/ps/replica_sim.h): a few
// hundred seeds in CI (ONLINEPS_SIM_SEEDS overrides the count); any failing seed replays
// exactly with `onlineps_replica_sim --seed N --verbose`.
#include "tests/ps/replica_sim.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace onlineps::sim {
namespace {

uint64_t Seeds(uint64_t fallback) {
  const char* env = std::getenv("ONLINEPS_SIM_SEEDS");
  return env ? std::strtoull(env, nullptr, 10) : fallback;
}

TEST(ReplicaSimTest, SameSeedSameRun) {
  SimOptions o;
  o.seed = 42;
  SimResult a = RunSim(o), b = RunSim(o);
  EXPECT_EQ(a.Summary(), b.Summary());
  EXPECT_EQ(a.end_ms, b.end_ms);
  EXPECT_GT(a.acked, 100u);
}

TEST(ReplicaSimTest, NoFaultsElectsAndAcknowledges) {
  for (int n : {2, 3}) {
    SimOptions o;
    o.seed = 7;
    o.replicas = n;
    o.faults = false;
    SimResult r = RunSim(o);
    EXPECT_TRUE(r.ok) << r.Summary();
    EXPECT_GT(r.acked, 1000u) << r.Summary();
    EXPECT_EQ(r.kills, 0u);
  }
}

TEST(ReplicaSimTest, NoAcknowledgedPushLostUnderFaults) {
  const uint64_t n = Seeds(300);
  uint64_t failed = 0, kills = 0, partitions = 0, acked = 0;
  for (uint64_t seed = 1; seed <= n; ++seed) {
    SimOptions o;
    o.seed = seed;
    SimResult r = RunSim(o);
    kills += r.kills;
    partitions += r.partitions;
    acked += r.acked;
    if (!r.ok) {
      ++failed;
      ADD_FAILURE() << "seed " << seed << ": " << r.Summary()
                    << "\n  replay: onlineps_replica_sim --seed " << seed << " --verbose";
    }
  }
  std::printf("%llu seeds: %llu failed, %llu kills, %llu partitions, %llu pushes acknowledged\n",
              (unsigned long long)n, (unsigned long long)failed, (unsigned long long)kills,
              (unsigned long long)partitions, (unsigned long long)acked);
  EXPECT_GT(kills, n);  // the scheduler really injected faults
}

// Two replicas, 8 clients pushing again at once (entries in flight to the backup all the
// time), no faults; at 8 s the backup is killed and restarted empty. Expects it back in
// the ISR within 2 s (simulated) on each seed.
void ExpectRestartedBackupRejoinsUnderSaturatingWriters(bool sync, std::vector<uint64_t> seeds) {
  for (uint64_t seed : seeds) {
    SimOptions o;
    o.seed = seed;
    o.replicas = 2;
    o.sync = sync;
    o.unsafe_kills = !sync;  // async promises no acknowledged push: liveness only
    o.faults = false;
    o.clients = 8;
    o.think_ms = 0;
    o.backup_apply_ms = 2;  // the backup keeps up with the primary
    o.fault_ms = 5000;
    o.settle_ms = 15000;
    o.restart_backup_at_ms = 8000;
    SimResult r = RunSim(o);
    EXPECT_TRUE(r.ok) << "seed " << seed << ": " << r.Summary();
    EXPECT_GT(r.resync_ms, 0u) << "seed " << seed << ": the restarted backup never rejoined";
    EXPECT_LT(r.resync_ms, 2000u) << "seed " << seed;
    std::printf("seed %llu: backup restarted empty rejoined the ISR after %llu simulated ms; %s\n",
                (unsigned long long)seed, (unsigned long long)r.resync_ms, r.Summary().c_str());
  }
}

TEST(ReplicaSimTest, BackupRestartedEmptyRejoinsUnderSaturatingWriters) {
  // The commit point moves on as fast as the backup applies, so a backup admitted to the
  // ISR only by an ack that happens to reach it waited seconds (here: until the clients
  // stopped, 12 s later); counted for commits once it streams within a window, it reaches
  // them and rejoins at once (60-175 ms).
  ExpectRestartedBackupRejoinsUnderSaturatingWriters(/*sync=*/true, {1, 2, 3, 4, 5});
}

TEST(ReplicaSimTest, AsyncBackupRestartedEmptyRejoinsUnderSaturatingWriters) {
  // Async mode: commits never wait for a backup, so a backup that had to reach the
  // primary's last entry rejoined only when the clients stopped; one streaming within a
  // window joins (an update not yet streamed is lost on failover in async mode anyway).
  ExpectRestartedBackupRejoinsUnderSaturatingWriters(/*sync=*/false, {1, 2, 3});
}

TEST(ReplicaSimTest, LongRunSeedsThatFoundBugs) {
  // Seeds of `onlineps_replica_sim --seeds 100000` (beyond the CI range) that once failed;
  // the commit messages name each bug. 26152: an unclean election ranked a live replica
  // by its registration from before it re-synced (empty), so a restarted replica with an
  // older checkpoint won and the acknowledged updates only the live one held were lost.
  for (uint64_t seed : {8561, 9739, 16024, 18136, 20785, 26152}) {
    SimOptions o;
    o.seed = seed;
    SimResult r = RunSim(o);
    EXPECT_TRUE(r.ok) << "seed " << seed << ": " << r.Summary()
                      << "\n  replay: onlineps_replica_sim --seed " << seed << " --verbose";
  }
}

TEST(ReplicaSimTest, RecoversEvenWhenEveryInSyncReplicaIsLost) {
  // Kills regardless of the ISR: acknowledged pushes may be lost, but the group must
  // elect, converge and serve again once the faults stop.
  const uint64_t n = Seeds(300) / 6 + 1;
  for (uint64_t seed = 1; seed <= n; ++seed) {
    SimOptions o;
    o.seed = 1000000 + seed;
    o.unsafe_kills = true;
    SimResult r = RunSim(o);
    EXPECT_TRUE(r.ok) << "seed " << o.seed << ": " << r.Summary()
                      << "\n  replay: onlineps_replica_sim --seed " << o.seed
                      << " --unsafe-kills --verbose";
  }
}

}  // namespace
}  // namespace onlineps::sim
