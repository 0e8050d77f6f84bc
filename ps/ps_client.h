// PsClient: the parameter-server client library used by workers. Pulls and pushes are
// split per shard (sparse keys by hash, dense tensors by slice), sent to all shards in
// parallel, and complete as one Ticket. Every call has a deadline; lost or refused
// attempts are retried, and pushes keep their (sender, seq) across retries so a shard
// applies each push exactly once. Thread-safe; calls may be issued from any thread.
#ifndef ONLINEPS_PS_PS_CLIENT_H_
#define ONLINEPS_PS_PS_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/frame.h"
#include "common/status.h"
#include "common/transport.h"
#include "ps/table_spec.h"

namespace onlineps::ps {

struct PsClientOptions {
  std::vector<std::string> shards;  // endpoint of shard i at index i
  // 0 (default): a random 64-bit id per client object. A fixed id may be reused by a
  // client started after the last one with that id is gone (a restarted worker): push
  // seqs start from the wall clock in nanoseconds, past any seq the old client reached
  // (unless the clock was set back further than the old client ran). Two clients using one
  // id at the same time are not supported: the older one's pushes are refused
  // (FAILED_PRECONDITION, below the dedup window) once the newer one has pushed.
  uint64_t sender_id = 0;
  std::chrono::milliseconds timeout{5000};          // whole call, all attempts
  std::chrono::milliseconds attempt_timeout{1000};  // one attempt before it is resent
  // A pull whose rows (sparse) or elements (dense) for one shard exceed this many bytes
  // goes out as several parts at once (at most 16 per shard), so the shard's reads, the
  // transfer and the client's copy-out overlap; each shard's version is then the oldest
  // its parts read. DC-ASGD tables' dense pulls stay whole (they record the copy read).
  // 0: one part per shard.
  size_t pull_part_bytes = size_t{256} << 10;
  TransportOptions transport;
};

// Table version per shard, as returned by a pull and carried by the next push.
using VersionVector = std::vector<uint64_t>;

struct PushReply {
  std::vector<uint64_t> versions;  // per shard touched (0 for shards not touched)
  std::vector<uint64_t> taus;
  uint64_t max_tau = 0;
  uint64_t max_version = 0;
  bool queued = false;     // some shard accumulated the push without applying it yet
  bool duplicate = false;  // some shard had already applied it (a retry)
  // Shards that took their part (applied or queued it, or had it already); of a call that
  // failed, those whose part was applied all the same.
  uint32_t shards_took = 0;
};

struct PullOptions {
  bool averaged = false;      // read the Polyak-averaged copy
  bool record_backup = true;  // let DC-ASGD tables remember what this client read
};

struct PushOptions {
  bool delta = false;  // values are parameter deltas, not gradients
  // With delta: the deltas set the table's initial values (a model file's weights), which
  // the table's clip_norm leaves whole (kFlagSeed).
  bool seed = false;
  // Both non-zero: the push goes out as (sender, seq) instead of this client's own id and
  // next sequence number, so any client sending the same one-off push (e.g. several
  // workers seeding a table) gets it applied exactly once.
  uint64_t sender = 0;
  uint64_t seq = 0;
  // When set, each shard's reply carries the parameters the push wrote, read right after
  // it was applied (so at the reply's version or newer), and they are written here:
  // spec.size() floats for a dense push, n * dim (row i for key i) for a sparse one. It
  // must stay valid until the Ticket completes. Saves the pull that would read them back.
  // DC-ASGD tables record no backup for these values: pull before computing on them.
  float* updated = nullptr;
};

// One table's part of PsClient::PushDenseBatch.
struct DensePush {
  std::string table;
  Frame values;  // spec.size() floats, shared (zero copy) like PushDense's Frame overload
  VersionVector base;
  PushReply* reply = nullptr;  // optional; filled as PushDense fills it
  PushOptions opts;            // delta and updated; a fixed (sender, seq) goes alone
};

// One sparse table's part of PsClient::PushBatch: PushSparse's arguments, owned.
struct SparsePush {
  std::string table;
  std::vector<uint64_t> keys;
  std::vector<float> values;  // keys.size() * dim, row i for key i
  VersionVector base;
  PushReply* reply = nullptr;  // optional; filled as PushSparse fills it
  PushOptions opts;            // delta and updated; a fixed (sender, seq) goes alone
};

// A shard's answer to a watch (docs/protocol.md, "21 · watch").
struct WatchReply {
  std::map<std::string, uint64_t> versions;  // each table watched: its version there now
  // Sparse tables whose version changed: the keys pushed since the version watched, or,
  // in all_keys, the tables whose changed keys the shard no longer knows.
  std::map<std::string, std::vector<uint64_t>> keys;
  std::set<std::string> all_keys;
  // The shard's incarnation, new at every start ("" from a shard too old to send one).
  std::string incarnation;
};

// The completion of an asynchronous call. Copyable; all copies share the result.
class Ticket {
 public:
  struct State;
  Ticket() = default;
  explicit Ticket(std::shared_ptr<State> s) : state_(std::move(s)) {}
  // Blocks until the call completed (success, error or deadline). Idempotent.
  Status Wait() const;
  bool Ready() const;

 private:
  std::shared_ptr<State> state_;
};

class PsClient {
 public:
  using Callback = std::function<void(const Status&)>;

  static StatusOr<std::unique_ptr<PsClient>> Connect(PsClientOptions options);
  virtual ~PsClient() = default;

  virtual uint64_t sender_id() const = 0;
  virtual size_t num_shards() const = 0;

  // Creates the table on every shard (idempotent for an equal spec).
  virtual Status CreateTable(const TableSpec& spec) = 0;
  // Learns the spec of a table created elsewhere (needed before dense calls).
  virtual StatusOr<TableSpec> OpenTable(const std::string& name) = 0;
  // Each shard's table_info answer, in shard order: the spec's wire map and that
  // shard's "stat.*" figures (docs/protocol.md, "table_info").
  virtual StatusOr<std::vector<std::map<std::string, std::string>>> TableInfo(
      const std::string& name) = 0;
  // Waits until every shard answers a ping, or the timeout passes. kFailedPrecondition
  // (at once) when a shard says it is not the one at its position of the list, or the
  // list's length is not the shard count (the shards were given in the wrong order).
  virtual Status WaitForShards(std::chrono::milliseconds timeout) = 0;
  // Asks every shard to write a checkpoint now.
  virtual Status Checkpoint() = 0;

  // REQUIRES for all calls below: `out`, `versions` and `reply` stay valid until the
  // Ticket completes; input arrays are copied before the call returns (retries may send
  // them after a timed-out Ticket is gone). `out` has spec.size() floats (dense) or
  // n * dim floats (sparse); `versions` and `reply` may be null. `done` (optional) runs
  // on a client thread when complete.
  virtual Ticket PullDense(const std::string& table, float* out, VersionVector* versions,
                           PullOptions opts = {}, Callback done = nullptr) = 0;
  virtual Ticket PushDense(const std::string& table, const float* values, const VersionVector& base,
                           PushReply* reply, PushOptions opts = {}, Callback done = nullptr) = 0;
  // Zero-copy push: `values` (spec.size() floats) is shared, not copied.
  virtual Ticket PushDense(const std::string& table, Frame values, const VersionVector& base,
                           PushReply* reply, PushOptions opts = {}, Callback done = nullptr) = 0;
  virtual Ticket PullSparse(const std::string& table, const uint64_t* keys, size_t n, float* out,
                            VersionVector* versions, PullOptions opts = {},
                            Callback done = nullptr) = 0;
  virtual Ticket PushSparse(const std::string& table, const uint64_t* keys, size_t n,
                            const float* values, const VersionVector& base, PushReply* reply,
                            PushOptions opts = {}, Callback done = nullptr) = 0;
  // Zero-copy sparse push: `keys` (n uint64) and `values` (n * dim floats) are shared,
  // not copied, with one shard; with several they are split into per-shard copies.
  virtual Ticket PushSparse(const std::string& table, Frame keys, Frame values,
                            const VersionVector& base, PushReply* reply, PushOptions opts = {},
                            Callback done = nullptr) = 0;
  // Pushes several dense tables with one push_batch message per shard, where PushDense
  // sends one message per table and shard. Each table's push is still a push of its own,
  // applied exactly once (own seq, version and staleness, in its reply). Not for tables
  // in block bound mode, whose replies are held (INVALID_ARGUMENT: push them alone). The
  // Ticket fails when some table's push failed on some shard, with the first error
  // naming the table; the other tables' pushes may have been applied.
  virtual Ticket PushDenseBatch(std::vector<DensePush> pushes, Callback done = nullptr) = 0;
  // The same with sparse tables too: each shard gets one push_batch of every dense
  // table's slices and of the rows of each sparse table it owns (a shard owning no row
  // of any table and holding no dense element gets nothing).
  virtual Ticket PushBatch(std::vector<DensePush> dense, std::vector<SparsePush> sparse,
                           Callback done = nullptr) = 0;
  // Waits at shard `shard` (its primary, when replicated) until a table of `known`
  // (name -> version held) has another version there, or `wait` passes; `reply` gets
  // the answer. The call's deadline is `wait` plus the client timeout.
  virtual Ticket Watch(size_t shard, const std::map<std::string, uint64_t>& known,
                       std::chrono::milliseconds wait, WatchReply* reply,
                       Callback done = nullptr) = 0;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_PS_CLIENT_H_
