// The replica sidecar: a small JSON file beside a replicated shard's checkpoint
// (PATH.replica) that says which incarnation wrote the checkpoint, the log position it
// holds, and whether it was written by a clean stop (after replication stopped, so the
// position is exact). Only a clean stop's checkpoint lets a restarted replica keep its
// incarnation, and so its place in the in-sync replica set (ps/replica_core.h).
#ifndef ONLINEPS_PS_REPLICA_SIDECAR_H_
#define ONLINEPS_PS_REPLICA_SIDECAR_H_

#include <cstdint>
#include <string>

#include "common/status.h"

namespace onlineps::ps {

struct ReplicaSidecar {
  uint64_t incarnation = 0, log_epoch = 0, lsn = 0;
  bool clean = false;
  uint64_t checkpoint_bytes = 0;  // size of the checkpoint it describes
  // and its trailing checksum (CheckpointTrailer): a CRC-32 for checkpoints of format 2,
  // LegacyChecksum64 for those of format 1 (ps/checkpoint.h).
  uint64_t checkpoint_checksum = 0;
  // The highest epoch the replica followed or led when it was written (0 in sidecars of
  // older versions): a group formed again after etcd lost its data numbers above it.
  uint64_t epoch = 0;
};

// The checksum a checkpoint file ends with (its last 8 bytes); 0 when it cannot be read.
uint64_t CheckpointTrailer(const std::string& path);

// kNotFound when there is none; kDataLoss naming the file when it does not parse.
StatusOr<ReplicaSidecar> ReadReplicaSidecar(const std::string& path);
Status WriteReplicaSidecar(const std::string& path, const ReplicaSidecar& s);

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_REPLICA_SIDECAR_H_
