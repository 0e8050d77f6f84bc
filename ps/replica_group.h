// ReplicaGroup: how a replica group is laid out in etcd (docs/protocol.md, "Replication"):
// under the group's prefix, `members/<index>` (each replica's registration, on its
// lease), `leader` (the primary's record, on its lease; its create revision plus the
// group's `epoch_base` is the epoch), `epoch_base` (written when the group forms) and
// `isr` (the in-sync replicas). This file owns the key names, the JSON values and the
// transactions that change them; ReplicaCore decides when. Stateless.
#ifndef ONLINEPS_PS_REPLICA_GROUP_H_
#define ONLINEPS_PS_REPLICA_GROUP_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/kv_store.h"

namespace onlineps::ps {

// A replica process: its index in the group and its incarnation.
struct GroupMember {
  uint32_t index = 0;
  uint64_t incarnation = 0;
  bool operator==(const GroupMember& o) const {
    return index == o.index && incarnation == o.incarnation;
  }
  bool operator<(const GroupMember& o) const {
    return index != o.index ? index < o.index : incarnation < o.incarnation;
  }
};

struct GroupLeader {
  uint32_t index = 0;
  uint64_t incarnation = 0, epoch = 0;
  uint64_t lease = 0;  // the lease the key lives on
};

// What a replica registered: who it is and the state it holds (to rank replicas when
// every ISR member was lost).
struct GroupRegistration {
  uint64_t incarnation = 0, log_epoch = 0, lsn = 0;
  bool need = false, data = false;
  uint64_t mod_revision = 0;  // when it was written (read from the store)
  // The highest epoch it followed or led (clients may have seen it), at or above
  // log_epoch: a group formed again numbers its epochs above it. 0 from older replicas.
  uint64_t epoch = 0;
};

// The group as one read of its keys returned.
struct GroupView {
  bool has_leader = false, has_isr = false;
  // Added to the leader key's create revision to make the epoch (`epoch_base`, written
  // when a group forms): epochs stay above every epoch the replicas held before, even
  // when etcd lost its data and its revisions started over. 0 when absent.
  uint64_t epoch_base = 0;
  GroupLeader leader;
  uint64_t isr_epoch = 0, isr_mod_revision = 0;
  std::vector<GroupMember> isr;
  std::map<uint32_t, GroupRegistration> members;
};

// A fresh random incarnation (never 0): what a process start is told apart by.
uint64_t NewIncarnation();
// 16 lower-case hex digits, as incarnations are written; 0 for anything else.
std::string IncarnationHex(uint64_t incarnation);
uint64_t ParseIncarnation(const std::string& hex);

class ReplicaGroup {
 public:
  // `prefix` ends in '/' (ReplicaGroupKey in ps/replication.h).
  explicit ReplicaGroup(std::string prefix) : prefix_(std::move(prefix)) {}

  const std::string& prefix() const { return prefix_; }
  // The group's keys in a range read. Values that do not parse are skipped, with the
  // key in `skipped` (when given).
  GroupView Parse(const std::vector<KvEntry>& entries,
                  std::vector<std::string>* skipped = nullptr) const;
  // Puts `members/<index>` on `lease`.
  KvTxn Register(uint32_t index, const std::string& endpoint, const GroupRegistration& r,
                 uint64_t lease) const;
  // Takes `leader` on `lease` if it is absent and `isr` is as `seen` read it. A new group
  // (no `isr`) also sets `epoch_base` to `new_base` (ignored otherwise).
  KvTxn Campaign(const GroupView& seen, const GroupMember& me, const std::string& endpoint,
                 uint64_t lease, uint64_t new_base = 0) const;
  // Writes `isr` if `leader` still holds `epoch` (its create revision plus `base`) and
  // `isr` has mod revision `isr_mod_revision` (or is absent, when `isr_absent`).
  KvTxn WriteIsr(uint64_t epoch, uint64_t base, bool isr_absent, uint64_t isr_mod_revision,
                 const std::vector<GroupMember>& members) const;
  // Deletes `leader` if it still holds `epoch` (its create revision plus `base`).
  KvTxn RemoveLeader(uint64_t epoch, uint64_t base) const;
  std::string isr_key() const { return prefix_ + "isr"; }
  std::string leader_key() const { return prefix_ + "leader"; }
  std::string epoch_base_key() const { return prefix_ + "epoch_base"; }

 private:
  const std::string prefix_;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_REPLICA_GROUP_H_
