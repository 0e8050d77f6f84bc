// MemoryBudget: the bytes of table state a shard may hold (--max-memory-mb), and the
// cgroup memory limit its default is derived from. The count is the tables' own
// TableStats::memory_bytes, summed (Measure), plus what was admitted since the last sum
// (Add): deterministic, unlike the RSS. Thread-safe.
#ifndef ONLINEPS_PS_MEMORY_BUDGET_H_
#define ONLINEPS_PS_MEMORY_BUDGET_H_

#include <atomic>
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
  // The last sum plus what was admitted since.
  uint64_t used() const { return measured_.load() + admitted_.load(); }
  // Whether `bytes` more stay within the limit.
  bool Fits(uint64_t bytes) const {
    const uint64_t u = used();
    return u <= limit_ && bytes <= limit_ - u;
  }
  // Counts bytes admitted (a push's new rows, a created table) until the next Measure.
  void Add(uint64_t bytes) { admitted_.fetch_add(bytes); }
  // Something was admitted since the last Measure (which may then count less).
  bool stale() const { return admitted_.load() != 0; }
  // Replaces the count by `sum()`, the tables' memory_bytes now: what was admitted
  // before the call is in it. Blocks while another Measure runs.
  void Measure(const std::function<uint64_t()>& sum);

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> measured_{0};
  std::atomic<uint64_t> admitted_{0};
  Mutex measure_mu_;  // one Measure at a time: each takes back only what it saw admitted
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_MEMORY_BUDGET_H_
