// A table as held by one shard: the dense slices or sparse rows that hash to this
// shard, their optimizer and staleness state, and the table's version on this shard.
// Implementations: DenseTable (ps/dense_table.h) and SparseTable (ps/sparse_table.h).
// Thread-safe: Pull and Push may be called concurrently from any handler thread.
#ifndef ONLINEPS_PS_TABLE_H_
#define ONLINEPS_PS_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"
#include "ps/table_spec.h"
#include "ps/update_rule.h"

namespace onlineps::ps {

struct PullRequest {
  uint64_t sender = 0;
  const uint64_t* keys = nullptr;  // sparse: ids to read
  size_t num_keys = 0;
  // Dense: read only elements [first, first + count) of this shard's (count 0: all).
  uint64_t first = 0, count = 0;
  bool averaged = false;      // read the Polyak-averaged copy
  bool record_backup = true;  // DC-ASGD: remember what this sender read
  uint64_t now_ms = 0;        // monotonic clock, for TTL and SSP leases
  // Never wait for a lock of the table: when one is taken, read nothing and answer
  // would_block (the shard's I/O thread then hands the request to a handler thread).
  bool no_wait = false;
};

struct PullResult {
  uint64_t version = 0;
  std::vector<float> values;  // dense: this shard's elements (or the range); sparse: num_keys * dim
  bool would_block = false;   // no_wait and a lock was taken: nothing read
};

struct PushRequest {
  uint64_t sender = 0;
  uint64_t base_version = 0;
  bool delta = false;              // values are a parameter delta (model / elastic averaging)
  bool seed = false;               // with delta: a table's initial values (kFlagSeed): not clipped
  const uint64_t* keys = nullptr;  // sparse only
  size_t num_keys = 0;
  const float* values = nullptr;
  size_t num_values = 0;
  uint64_t now_ms = 0;   // monotonic clock, for TTL and SSP leases
  bool no_wait = false;  // as in PullRequest: nothing applied when a lock is taken
  // When set (RETURN_VALUES): gets the parameters as this push left them, read under the
  // locks it applied under (sparse: num_keys * dim floats, a row not admitted reads as
  // new; dense: every element of this shard). PushResult::values_read says whether it
  // was filled: not for a sparse push that was only accumulated.
  float* values_after = nullptr;
};

struct PushResult {
  uint64_t version = 0;      // table version on this shard after the push
  uint64_t tau = 0;          // staleness: version at apply - base
  bool queued = false;       // accumulated; applied when K pushes have arrived
  bool hold = false;         // block mode: reply must wait until Releasable(sender)
  bool would_block = false;  // no_wait and a lock was taken: nothing applied
  bool values_read = false;  // PushRequest::values_after was filled
  // Sparse: rows this push evicted to stay under max_rows (they read as new rows now);
  // change notices name them with the pushed keys.
  std::vector<uint64_t> evicted;
};

// Counters a table exposes for metrics and table info.
struct TableStats {
  uint64_t version = 0;
  uint64_t elements = 0;        // dense elements or sparse rows * dim on this shard
  uint64_t rows = 0;            // sparse rows held
  uint64_t evicted_rows = 0;    // sparse: TTL or LRU evictions so far
  uint64_t backups = 0;         // DC-ASGD copies held
  uint64_t backup_misses = 0;   // DC pushes without a backup (uncompensated)
  uint64_t clipped_pushes = 0;  // pushes scaled down to clip_norm
  uint64_t memory_bytes = 0;    // approximate bytes of parameters and state
};

// A checkpoint's snapshot: the whole table, or what changed since the previous one.
// kFull and kDelta: a checkpoint's (each starts the table's next change set). kCopy: a
// full copy that leaves the change set alone (a re-syncing replica's), so the next
// checkpoint's delta still holds every row changed since the last checkpoint.
enum class SnapshotKind { kFull, kDelta, kCopy };

// Rows a sparse table changed (pushed to or created) and dropped since the last
// snapshot's cut, and the rows it holds; dense tables report none.
struct ChangeStats {
  uint64_t changed_rows = 0;
  uint64_t dropped_rows = 0;
  uint64_t rows = 0;
  // More rows were dropped than a delta keeps track of: the next snapshot must be full.
  bool overflow = false;

  ChangeStats& operator+=(const ChangeStats& o) {
    changed_rows += o.changed_rows;
    dropped_rows += o.dropped_rows;
    rows += o.rows;
    overflow = overflow || o.overflow;
    return *this;
  }
};

class Table {
 public:
  virtual ~Table() = default;

  // Creates the part of `spec` held by shard `shard` of `num_shards`.
  static StatusOr<std::unique_ptr<Table>> Create(const TableSpec& spec, uint32_t shard,
                                                 uint32_t num_shards);

  virtual const TableSpec& spec() const = 0;
  virtual uint64_t version() const = 0;
  // Floats a dense push or pull must carry to this shard (0 for sparse).
  virtual uint64_t local_elements() const = 0;

  // Validates and serves a pull. Errors: kShapeMismatch, kInvalidArgument.
  virtual StatusOr<PullResult> Pull(const PullRequest& req) = 0;
  // Validates and applies a push. Errors: kShapeMismatch, kNonFinite, kStale. On error
  // nothing is applied.
  virtual StatusOr<PushResult> Push(const PushRequest& req) = 0;

  // Block mode: true once `sender` is within max_staleness pushes of the slowest live
  // sender (or the hold timed out). Always true for other modes.
  virtual bool Releasable(uint64_t sender, uint64_t now_ms) = 0;

  // Periodic housekeeping (TTL expiry). Cheap when there is nothing to do.
  virtual void Maintain(uint64_t now_ms) {}

  virtual TableStats Stats() const = 0;

  // Memory budget (ps/memory_budget.h). The bytes a table of `spec` holds on `shard`
  // from its creation: a dense table's whole state; 0 for sparse (it grows by rows).
  static StatusOr<uint64_t> InitialBytes(const TableSpec& spec, uint32_t shard,
                                         uint32_t num_shards);
  // About the bytes one more row (or admission candidate) costs: record, index entry,
  // pending sum; 0: dense.
  virtual uint64_t BytesPerNewRow() const { return 0; }
  // Rows a push of `keys` would create now: keys without a row, up to the room a row cap
  // leaves (a key repeated in the push counts each time; with admit_after, a key counts
  // before it is admitted). Takes the stripes' locks. 0 for dense tables.
  virtual uint64_t NewRows(const uint64_t* keys, size_t n) { return 0; }

  // Checkpoint: parameters, optimizer and policy state, version. Restore requires an
  // equal spec and layout (kDataLoss otherwise).
  virtual void Save(ByteWriter* w) const = 0;
  virtual Status Load(ByteReader* r) = 0;

  // Checkpoints without a pause: the state as it is now, written later by
  // TableSnapshot::Write while updates go on. REQUIRES: no update runs during the call
  // (the shard holds its apply gate); one snapshot of a table at a time, and the table
  // outlives it. The default serializes the table now; a sparse table instead copies a
  // row only when an update is about to change it before the writer has passed it.
  // kFull writes Save's format. kDelta writes only what changed since the cut of the
  // previous snapshot (of either kind), in LoadDelta's format; a dense table's delta is
  // its whole body. kFull and kDelta start a new change set; kCopy (a replica's copy)
  // writes Save's format and leaves the change set as it is.
  virtual std::unique_ptr<class TableSnapshot> BeginSnapshot(
      SnapshotKind kind = SnapshotKind::kFull);
  // Optional, before BeginSnapshot and outside the apply gate: maps what the snapshot's
  // copy on write needs, so neither the cut nor the updates right after it pay for that.
  virtual void PrepareSnapshot() {}
  // What a kDelta snapshot taken now would write. REQUIRES: as BeginSnapshot.
  virtual ChangeStats Changes() const { return {}; }
  // Applies a kDelta snapshot's bytes on top of this table's state (dense: Load).
  virtual Status LoadDelta(ByteReader* r) { return Load(r); }
};

class TableSnapshot {
 public:
  virtual ~TableSnapshot() = default;  // ends the snapshot; copies still held are freed
  // Appends the table as it was at BeginSnapshot. Called once; thread-safe with updates.
  virtual void Write(ByteWriter* w) = 0;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_TABLE_H_
