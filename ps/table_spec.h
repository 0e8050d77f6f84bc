// TableSpec: everything a shard needs to create a table, identical on every shard.
// Travels in the "spec" map of a CreateTable header (string -> string) and is stored in
// checkpoints. Value type; thread-compatible.
#ifndef ONLINEPS_PS_TABLE_SPEC_H_
#define ONLINEPS_PS_TABLE_SPEC_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "ps/update_rule.h"

namespace onlineps::ps {

enum class TableKind { kDense, kSparse };

// How a bounded-staleness table treats a push that is out of bound.
enum class BoundMode {
  kReject,  // push with tau > max_staleness is refused with STALE; nothing applied
  kBlock,   // SSP: applied at once, reply held while the sender is > s pushes ahead
};

struct TableSpec {
  std::string name;
  TableKind kind = TableKind::kDense;
  std::vector<uint64_t> shape;  // dense: tensor shape (product = size)
  uint32_t dim = 0;             // sparse: floats per row

  std::string optimizer = "sgd";
  Params optimizer_params;  // wire keys "opt.<name>"
  std::string staleness = "none";
  Params staleness_params;  // wire keys "stl.<name>"

  int64_t max_staleness = -1;  // -1: unbounded
  BoundMode bound_mode = BoundMode::kReject;
  uint64_t block_timeout_ms = 10000;  // block mode: a silent sender stops counting after this

  bool polyak = false;          // keep a Polyak-averaged copy that pulls may ask for
  uint64_t polyak_start = 0;    // t0: average over steps after this version
  uint32_t accumulate = 1;      // apply once per K pushes (1: every push)
  bool accumulate_mean = true;  // apply sum/K (true) or the plain sum (false)
  double delta_scale = 1.0;     // parameter-delta pushes: w += delta_scale * delta
  double clip_norm = 0.0;       // scale a push's values on a shard to this L2 norm (0: off)

  std::string init = "zeros";  // zeros | constant | uniform | normal
  double init_value = 0.0;     // constant: the value; uniform: half-width; normal: stddev
  uint64_t seed = 0;

  uint32_t admit_after = 0;      // sparse: create a row on its N-th touch (0/1: first)
  uint64_t ttl_ms = 0;           // sparse: drop rows untouched this long (0: never)
  uint64_t max_rows = 0;         // sparse: memory cap per shard, LRU eviction (0: none)
  uint32_t dc_max_backups = 64;  // DC-ASGD: workers whose pulled copy is kept (LRU)

  // The frozen part of the model this table belongs to ("sha256:<hex>" of the frozen
  // parameters a worker loads from its model file; "" for a model with none). A table
  // learned on top of one backbone means nothing on another: create_table refuses a
  // spec whose base differs from the table's (FAILED_PRECONDITION naming both).
  std::string base;

  uint64_t size() const;  // dense: product of shape
  bool operator==(const TableSpec& o) const;
};

// Block bound mode with a bound: the SSP clock may hold a push's reply until slower
// senders catch up, so such a push is answered on its own (never inside push_batch).
inline bool HoldsReplies(const TableSpec& s) {
  return s.max_staleness >= 0 && s.bound_mode == BoundMode::kBlock;
}

// DC-ASGD (staleness dc_*): a pull records the copy it read as the sender's backup, which
// the sender's next push is compensated against.
inline bool RecordsPullBackups(const TableSpec& s) { return s.staleness.rfind("dc_", 0) == 0; }

// The caps of a sparse table (admit_after, ttl_ms, max_rows) bound its memory; they do
// not change what a row means. create_table of an existing table succeeds when only its
// caps differ: the table keeps its own (they are fixed at creation).
bool EqualExceptCaps(const TableSpec& a, const TableSpec& b);
// "max_rows=N ttl_ms=N admit_after=N".
std::string DescribeCaps(const TableSpec& spec);
// Each wire field in which `asked` differs from `have`, as "key=have (asked value)",
// comma-separated ("(none)" for a field one of them does not hold); "" when equal.
std::string DescribeSpecDifference(const TableSpec& have, const TableSpec& asked);
// "none" for a table with no frozen base, else the base itself.
std::string DescribeBase(const std::string& base);

// Encodes to / decodes from the wire map. Decode validates every field and the
// optimizer and policy names and parameters (kInvalidArgument naming the field).
std::map<std::string, std::string> EncodeSpec(const TableSpec& spec);
StatusOr<TableSpec> DecodeSpec(const std::map<std::string, std::string>& map);

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_TABLE_SPEC_H_
