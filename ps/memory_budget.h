// MemoryBudget: the bytes of table state a shard may hold (--max-memory-mb), and the
// cgroup memory limit its default is derived from. The count is the tables' own
// TableStats::memory_bytes, summed (Measure), plus what was admitted since the last sum
// (Add, Settle), plus what updates being applied reserved (TryReserve): deterministic,
// unlike the RSS. Thread-safe.
#ifndef ONLINEPS_PS_MEMORY_BUDGET_H_
#define ONLINEPS_PS_MEMORY_BUDGET_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace onlineps::ps {

// The limit a cgroup memory file sets: cgroup v2 memory.max ("max" or bytes) or v1
// memory.limit_in_bytes (bytes; v1 writes a number near 2^63 for none). nullopt: no
// limit. Errors: kNotFound (no such file), kInvalidArgument (not a limit, quoted).
StatusOr<std::optional<uint64_t>> ReadCgroupMemoryLimit(const std::string& path);

// The budget in force and where it came from, for the start-up log line.
struct MemoryBudgetChoice {
  uint64_t bytes = 0;  // 0: no budget
  std::string source;
};
// `flag_mb` > 0: that many MiB; 0: none; -1: half the limit of the first of
// `cgroup_files` that sets one (a checkpoint may copy a dense table whole, so state at
// half the limit still fits beside its copy), else none.
MemoryBudgetChoice ChooseMemoryBudget(int64_t flag_mb,
                                      const std::vector<std::string>& cgroup_files);
// The cgroup v2 then v1 files of this process's memory limit.
std::vector<std::string> DefaultCgroupMemoryFiles();

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}

  bool enabled() const { return limit_ != 0; }
  uint64_t limit() const { return limit_; }
  // The last sum, plus what was admitted since, plus what is reserved.
  uint64_t used() const;
  // Whether `bytes` more stay within the limit.
  bool Fits(uint64_t bytes) const;
  // Reserves `bytes` when they fit beside everything counted and reserved (checked and
  // taken at once: updates applied together never pass the limit together); false,
  // reserving nothing, otherwise. Each reservation is ended by one Settle.
  bool TryReserve(uint64_t bytes);
  // Ends a reservation of `reserved` bytes: `admitted` of them (0: the update was not
  // applied) are counted until the next Measure, the rest released.
  void Settle(uint64_t reserved, uint64_t admitted);
  // Counts bytes admitted without a reservation (a backup applying its primary's log)
  // until the next Measure.
  void Add(uint64_t bytes);
  // Something was admitted since the last Measure (which may then count less).
  bool stale() const;
  // Replaces the count by `sum()`, the tables' memory_bytes now: what was admitted
  // before the call is in it (reservations are not: their updates settle later). Blocks
  // while another Measure runs.
  void Measure(const std::function<uint64_t()>& sum);

 private:
  const uint64_t limit_;
  Mutex measure_mu_ ACQUIRED_BEFORE(mu_);  // one Measure at a time: each takes back
                                           // only what it saw admitted
  mutable Mutex mu_;
  uint64_t measured_ GUARDED_BY(mu_) = 0;
  uint64_t admitted_ GUARDED_BY(mu_) = 0;
  uint64_t reserved_ GUARDED_BY(mu_) = 0;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_MEMORY_BUDGET_H_
