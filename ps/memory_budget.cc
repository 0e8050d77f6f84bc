#include "ps/memory_budget.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <sstream>

namespace onlineps::ps {

namespace {
// cgroup v1 writes LONG_MAX rounded down to the page size for "no limit"; anything at
// or above 2^62 bytes (4 EiB) is no limit on a real machine.
constexpr uint64_t kNoLimitFrom = uint64_t{1} << 62;
}  // namespace

StatusOr<std::optional<uint64_t>> ReadCgroupMemoryLimit(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read " + path);
  std::string text;
  std::getline(in, text);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) {
    text.pop_back();
  }
  if (text == "max") return std::optional<uint64_t>();
  uint64_t bytes = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), bytes);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return InvalidArgument(path + " holds '" + text.substr(0, 64) +
                           "', not a memory limit (a number of bytes or 'max')");
  }
  if (bytes >= kNoLimitFrom) return std::optional<uint64_t>();
  return std::optional<uint64_t>(bytes);
}

std::vector<std::string> DefaultCgroupMemoryFiles() {
  return {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
}

MemoryBudgetChoice ChooseMemoryBudget(int64_t flag_mb,
                                      const std::vector<std::string>& cgroup_files) {
  if (flag_mb > 0) {
    return {static_cast<uint64_t>(flag_mb) << 20, "--max-memory-mb " + std::to_string(flag_mb)};
  }
  if (flag_mb == 0) return {0, "--max-memory-mb 0"};
  std::ostringstream why;
  for (const std::string& f : cgroup_files) {
    StatusOr<std::optional<uint64_t>> limit = ReadCgroupMemoryLimit(f);
    if (limit.ok() && limit->has_value()) {
      return {**limit / 2,
              "half the cgroup memory limit of " + std::to_string(**limit) + " bytes in " + f};
    }
    why << (why.tellp() > 0 ? "; " : "")
        << (limit.ok() ? f + " sets no limit" : limit.status().message());
  }
  return {0, "no cgroup memory limit (" + why.str() + ")"};
}

uint64_t MemoryBudget::used() const {
  MutexLock lock(&mu_);
  return measured_ + admitted_ + reserved_;
}

bool MemoryBudget::Fits(uint64_t bytes) const {
  const uint64_t u = used();
  return u <= limit_ && bytes <= limit_ - u;
}

bool MemoryBudget::TryReserve(uint64_t bytes) {
  MutexLock lock(&mu_);
  const uint64_t u = measured_ + admitted_ + reserved_;
  if (u > limit_ || bytes > limit_ - u) return false;
  reserved_ += bytes;
  return true;
}

void MemoryBudget::Settle(uint64_t reserved, uint64_t admitted) {
  MutexLock lock(&mu_);
  reserved_ -= std::min(reserved, reserved_);
  admitted_ += admitted;
}

void MemoryBudget::Add(uint64_t bytes) {
  MutexLock lock(&mu_);
  admitted_ += bytes;
}

bool MemoryBudget::stale() const {
  MutexLock lock(&mu_);
  return admitted_ != 0;
}

void MemoryBudget::Measure(const std::function<uint64_t()>& sum) {
  MutexLock serial(&measure_mu_);
  uint64_t before = 0;
  {
    MutexLock lock(&mu_);
    before = admitted_;
  }
  // Without mu_: the sum takes every table's locks, and updates settle meanwhile. An
  // update settled after `before` was read stays counted, even if the sum has its rows
  // too (counted twice until the next Measure, never missed).
  const uint64_t now = sum();
  MutexLock lock(&mu_);
  measured_ = now;
  admitted_ -= before;
}

}  // namespace onlineps::ps
