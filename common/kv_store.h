// KvStore: the part of etcd's v3 API that coordination needs (leases, prefix reads and
// compare-and-swap transactions), asynchronous, so the same callers run against a real
// etcd (common/etcd_kv.h) and against the in-memory model of the deterministic
// simulation (tests/ps/sim_etcd.h). The semantics are etcd's: every successful write bumps
// the store's revision; a key keeps the revision that created it and the one that last
// changed it; a key put with a lease is deleted when the lease expires or is revoked.
//
// REQUIRES for implementations: methods are thread-safe and never block on the network;
// each callback runs exactly once, on a thread of the implementation's choosing, and
// must not call back into the store synchronously from a lock it holds.
#ifndef ONLINEPS_COMMON_KV_STORE_H_
#define ONLINEPS_COMMON_KV_STORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace onlineps {

struct KvEntry {
  std::string key, value;
  uint64_t create_revision = 0, mod_revision = 0;
  uint64_t lease = 0;  // 0: none
};

// A transaction: when every compare holds, the puts and deletes are applied atomically
// (succeeded = true); otherwise nothing changes. Either way the range of `read_prefix`
// (when not empty) is returned as it is after the transaction.
struct KvTxn {
  struct Compare {
    enum class Target { kCreateRevision, kModRevision };
    std::string key;
    Target target = Target::kCreateRevision;
    uint64_t revision = 0;  // equality; create revision 0 means "the key does not exist"
  };
  struct Put {
    std::string key, value;
    uint64_t lease = 0;
  };
  std::vector<Compare> compares;
  std::vector<Put> puts;
  std::vector<std::string> deletes;
  std::string read_prefix;
};

struct KvResult {
  Status status;                 // not OK: the store could not be reached or refused the call
  bool succeeded = false;        // Txn: the compares held
  uint64_t revision = 0;         // the store's revision after the call
  std::vector<KvEntry> entries;  // Range, or Txn's read_prefix
  uint64_t lease = 0;            // Grant: the new lease
  int64_t ttl_s = 0;             // Grant / KeepAlive: seconds left; <= 0: the lease is gone
};

class KvStore {
 public:
  using Callback = std::function<void(KvResult)>;
  virtual ~KvStore() = default;

  // A lease of `ttl_s` seconds (etcd rounds TTLs up to its minimum).
  virtual void Grant(int64_t ttl_s, Callback done) = 0;
  virtual void KeepAlive(uint64_t lease, Callback done) = 0;
  // Deletes the lease and every key attached to it.
  virtual void Revoke(uint64_t lease, Callback done) = 0;
  // Every key that starts with `prefix`, in key order.
  virtual void Range(const std::string& prefix, Callback done) = 0;
  virtual void Txn(KvTxn txn, Callback done) = 0;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_KV_STORE_H_
