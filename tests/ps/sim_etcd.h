// SimEtcd: an in-memory model of the etcd v3 semantics ReplicaCore relies on, for the
// deterministic simulation: one store revision bumped by every write (a transaction is
// one revision), create and mod revisions per key, leases in whole seconds that expire
// on the simulated clock and delete their keys, equality compares in transactions.
// Single-threaded; time is passed in.
#ifndef ONLINEPS_TESTS_PS_SIM_ETCD_H_
#define ONLINEPS_TESTS_PS_SIM_ETCD_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "common/kv_store.h"
#include "ps/replica_core.h"

namespace onlineps::sim {

class SimEtcd {
 public:
  // Executes one call at `now` (expiring leases first).
  KvResult Do(uint64_t now, const ps::KvCall& call);
  // Deletes the keys of leases past their expiry.
  void Expire(uint64_t now);
  // The current value of a key, or null.
  const KvEntry* Get(const std::string& key) const;
  uint64_t revision() const { return revision_; }

 private:
  struct Lease {
    int64_t ttl_s = 0;
    uint64_t expiry_ms = 0;
    std::set<std::string> keys;
  };
  void DeleteKey(const std::string& key);
  void RevokeLease(uint64_t id);
  std::vector<KvEntry> RangeOf(const std::string& prefix) const;

  uint64_t revision_ = 1;
  uint64_t next_lease_ = 7000;
  std::map<std::string, KvEntry> kv_;
  std::map<uint64_t, Lease> leases_;
};

}  // namespace onlineps::sim

#endif  // ONLINEPS_TESTS_PS_SIM_ETCD_H_
