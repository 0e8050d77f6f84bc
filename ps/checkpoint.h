// Shard checkpoints. A file holds every table of one shard (spec, version, parameters,
// optimizer and policy state) and the exactly-once dedup windows, followed by a
// checksum of everything before it (CRC-32; files of format 1 end in LegacyChecksum64
// and still load). Written to PATH.tmp, fsynced, then renamed over
// PATH, so a crash leaves either the old or the new file, never a torn one. Files are
// written and read in pieces, never held in memory whole.
// Incremental checkpoints: a delta file PATH.d<N> holds what changed since the file
// before it (PATH for N = 1, else PATH.d<N-1>), names that file by its trailing
// checksum, and is read after it; a restore reads PATH, then PATH.d1, PATH.d2, ... while
// each continues the chain.
// Format: docs/protocol.md#checkpoints. Functions are thread-safe (tables lock).
#ifndef ONLINEPS_PS_CHECKPOINT_H_
#define ONLINEPS_PS_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "ps/dedup.h"
#include "ps/table.h"

namespace onlineps::ps {

struct ShardIdentity {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
};

// Writes tables and dedup state atomically to `path` (SnapshotShard, then
// WriteSnapshot: the caller keeps updates out for the whole call). Returns bytes written.
StatusOr<uint64_t> WriteCheckpoint(const std::string& path, const ShardIdentity& id,
                                   const std::map<std::string, std::shared_ptr<Table>>& tables,
                                   const Dedup& dedup);

// Reads `path` into fresh tables and `dedup`. Errors: kNotFound (no file), kDataLoss
// (bad magic, checksum mismatch, truncation), kFailedPrecondition (written by another
// shard index or shard count). On error nothing is returned and `dedup` is unchanged.
StatusOr<std::map<std::string, std::shared_ptr<Table>>> ReadCheckpoint(const std::string& path,
                                                                       const ShardIdentity& id,
                                                                       Dedup* dedup);

// The checkpoint format in memory (a replica's snapshot); `path` names it in errors.
// SerializeShard reads each table with Save: it neither needs nor disturbs a
// checkpoint's snapshot or change set.
std::string SerializeShard(const ShardIdentity& id,
                           const std::map<std::string, std::shared_ptr<Table>>& tables,
                           const Dedup& dedup);
StatusOr<std::map<std::string, std::shared_ptr<Table>>> ParseShard(std::string_view bytes,
                                                                   const std::string& path,
                                                                   const ShardIdentity& id,
                                                                   Dedup* dedup);

// A shard's state fixed at one instant, to be written while updates go on: the specs,
// a TableSnapshot of each table, and the dedup windows. The file it makes holds
// exactly the pushes its dedup windows say were applied (a delta: together with the
// files before it).
struct ShardSnapshot {
  struct Entry {
    std::map<std::string, std::string> spec;  // EncodeSpec
    // Keeps the table alive while its snapshot is written: a replica that loads its
    // primary's snapshot meanwhile replaces the shard's tables. Destroyed after `table`.
    std::shared_ptr<Table> owner;
    std::unique_ptr<TableSnapshot> table;
  };
  ShardIdentity id;
  SnapshotKind kind = SnapshotKind::kFull;
  uint64_t seq = 0;           // a delta's N (PATH.d<N>): set by the caller
  uint64_t prev_trailer = 0;  // a delta's: the trailing checksum of the file before it
  std::vector<Entry> tables;
  std::string dedup;  // Dedup::Save
};

// REQUIRES: no update runs during the call (the shard holds its apply gate). Its cost
// is that of each table's BeginSnapshot (O(stripes) for an uncapped sparse table; a
// delta also counts each stripe's changed rows, a bit per row). Either kind starts the
// tables' next change set (Table::BeginSnapshot).
ShardSnapshot SnapshotShard(const ShardIdentity& id,
                            const std::map<std::string, std::shared_ptr<Table>>& tables,
                            const Dedup& dedup, SnapshotKind kind = SnapshotKind::kFull);
// Writes the snapshot atomically to `path`, streamed. Returns bytes written; `trailer`
// (optional) gets the file's trailing checksum, which a delta after it names.
StatusOr<uint64_t> WriteSnapshot(const std::string& path, ShardSnapshot* snapshot,
                                 uint64_t* trailer = nullptr);

// The snapshot in memory, in SerializeShard's format (ParseShard reads it): a
// re-syncing replica's copy, cut by SnapshotShard (kind kCopy) and written while updates
// go on. REQUIRES: a full snapshot (kFull or kCopy).
std::string SerializeSnapshot(ShardSnapshot* snapshot);

// PATH.d<seq>: the seq-th delta after the full checkpoint at `path`.
std::string DeltaPath(const std::string& path, uint64_t seq);
// Every delta file of `path` in its directory (PATH.d<digits>), by N ascending (an N past
// 18 digits counts as UINT64_MAX).
struct DeltaFile {
  uint64_t seq = 0;
  std::string path;
};
std::vector<DeltaFile> DeltaFiles(const std::string& path);
// The temporary files a write of the checkpoint at `path` or of one of its deltas leaves
// when the process dies in it (PATH.tmp, PATH.d<digits>.tmp) that are in its directory.
std::vector<std::string> LeftoverTempFiles(const std::string& path);

struct RestoredShard {
  std::map<std::string, std::shared_ptr<Table>> tables;
  std::string tip;                 // the last file read: `path` or its last delta
  uint64_t tip_trailer = 0;        // its trailing checksum
  uint64_t base_bytes = 0;         // size of the full checkpoint
  uint64_t delta_bytes = 0;        // sizes of the deltas read
  uint64_t deltas = 0;             // deltas read (the chain's length)
  std::vector<std::string> stale;  // delta files that do not continue the chain, last first
};
// ReadCheckpoint, then each delta PATH.d1, PATH.d2, ... applied in order while the
// next one exists and names the one before it. Errors: those of ReadCheckpoint, for the
// full checkpoint and for every delta of the chain (a delta that is corrupt, or written
// by another shard, is kDataLoss / kFailedPrecondition: the state after it is unknown).
StatusOr<RestoredShard> RestoreCheckpoint(const std::string& path, const ShardIdentity& id,
                                          Dedup* dedup);

// CRC-32 (zlib's, IEEE 802.3): the checksum of format 2, the one written; the file's last
// 8 bytes hold it zero-extended.
uint32_t Crc32(const void* data, size_t size);
// Four-lane FNV-1a, mixed: the checksum of format 1 (read, never written any more).
uint64_t LegacyChecksum64(const void* data, size_t size);

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_CHECKPOINT_H_
