// The deterministic fault simulation of shard replication (the FoundationDB / VOPR
// shape): one thread, a simulated clock and network, 2-3 ReplicaCores (the protocol code
// the shard runs, unchanged) with a model of the shard's state, clients pushing unique
// updates and retrying like PsClient, and SimEtcd. A seeded scheduler injects kills,
// fast restarts with and without state, clean stops, pauses, message loss, duplication,
// reordering, delay and partitions (between replicas, clients and etcd). Everything
// random comes from the seed, so a failing seed replays exactly.
//
// Checked: every acknowledged push is held by every live in-sync replica whenever a
// push is acknowledged and every simulated second; after the faults stop, a primary is
// elected and acknowledges new pushes, the in-sync replicas converge to the primary's
// state, and that state holds every acknowledged push.
//
// Kills are "unclean" (the process loses its memory). The promise under test: an
// acknowledged push is lost only if every in-sync replica loses its memory, so the
// scheduler kills a replica only while another live replica is in the ISR (clean stops,
// pauses and partitions are unrestricted). With `unsafe_kills` it kills regardless and
// checks liveness and convergence only (acknowledged pushes may then be lost).
#ifndef ONLINEPS_TESTS_PS_REPLICA_SIM_H_
#define ONLINEPS_TESTS_PS_REPLICA_SIM_H_

#include <cstdint>
#include <string>

namespace onlineps::sim {

struct SimOptions {
  uint64_t seed = 1;
  int replicas = 0;  // 0: 2 or 3, from the seed
  bool sync = true;
  uint64_t fault_ms = 30000;   // simulated time with faults
  uint64_t settle_ms = 20000;  // then healed, clients still pushing
  int clients = 3;
  bool faults = true;
  bool unsafe_kills = false;
  bool verbose = false;               // log every event (stderr)
  uint64_t think_ms = 15;             // a client waits up to this long before its next push
  uint64_t backup_apply_ms = 4;       // a backup applies a replicated update in up to this long
  uint64_t restart_backup_at_ms = 0;  // kill -9 a backup then and restart it empty (0: never)
};

struct SimResult {
  bool ok = true;
  std::string failure;  // what broke, with the simulated time
  uint64_t acked = 0, sent = 0;
  uint64_t kills = 0, clean_stops = 0, restarts = 0, partitions = 0, pauses = 0;
  uint64_t elections = 0, unclean_elections = 0, snapshots = 0;
  uint64_t messages = 0, dropped = 0;
  uint64_t lost = 0;  // acknowledged but not in the final state (unsafe_kills only)
  uint64_t end_ms = 0;
  // From restart_backup_at_ms to that backup's new incarnation in the ISR (0: never).
  uint64_t resync_ms = 0;
  std::string Summary() const;
};

SimResult RunSim(const SimOptions& options);

}  // namespace onlineps::sim

#endif  // ONLINEPS_TESTS_PS_REPLICA_SIM_H_
