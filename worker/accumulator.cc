#include "worker/accumulator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "ps/optimizers.h"

namespace onlineps::worker {
namespace {

// Staleness is measured from the oldest parameters any summed gradient was computed
// on, so each shard keeps the smallest base. An empty vector carries no versions and
// must not pull the minimum down to zero.
void MergeBase(const ps::VersionVector& in, ps::VersionVector* acc) {
  if (in.empty()) return;
  if (acc->empty()) {
    *acc = in;
    return;
  }
  const size_t common = std::min(in.size(), acc->size());
  for (size_t s = 0; s < common; ++s) (*acc)[s] = std::min((*acc)[s], in[s]);
  // A shard only one side knows about: the other side adds no information.
  if (in.size() > acc->size()) acc->insert(acc->end(), in.begin() + common, in.end());
}

}  // namespace

Accumulator::Accumulator(size_t size, uint64_t examples, int64_t max_ms)
    : size_(size), examples_(examples), max_ms_(max_ms) {}

std::optional<Accumulator::Batch> Accumulator::Add(const std::vector<float>& grad,
                                                   const ps::VersionVector& base, uint64_t examples,
                                                   int64_t now_ms) {
  if (grad.size() != size_) {
    // A caller bug: summing a differently shaped gradient would corrupt the push.
    std::fprintf(stderr, "Accumulator::Add: gradient has %zu floats, expected %zu\n", grad.size(),
                 size_);
    std::abort();
  }
  MutexLock lock(&mu_);
  if (cur_.calls == 0) {
    cur_.sum.assign(size_, 0.0f);  // allocated lazily: an idle parameter holds no buffer
    cur_.base = base;
    first_ms_ = now_ms;
  } else {
    MergeBase(base, &cur_.base);
  }
  // Saturated, as the shards' own accumulation is: gradients each finite (CheckFinite) may
  // sum past the float range, and a push holding Inf is refused for good (NON_FINITE),
  // losing every learn answered "accumulated" in it.
  for (size_t i = 0; i < size_; ++i) cur_.sum[i] = ps::internal::Saturate(cur_.sum[i] + grad[i]);
  cur_.examples += examples;
  cur_.calls += 1;
  const bool full = cur_.examples >= examples_;
  const bool old = max_ms_ > 0 && now_ms - first_ms_ >= max_ms_;
  if (full || old) return TakeLocked();
  return std::nullopt;
}

std::optional<Accumulator::Batch> Accumulator::TakeIfDue(int64_t now_ms, bool force) {
  MutexLock lock(&mu_);
  if (cur_.calls == 0) return std::nullopt;
  const bool old = max_ms_ > 0 && now_ms - first_ms_ >= max_ms_;
  if (!force && !old) return std::nullopt;
  return TakeLocked();
}

uint64_t Accumulator::pending_examples() const {
  MutexLock lock(&mu_);
  return cur_.examples;
}

std::optional<Accumulator::Batch> Accumulator::TakeLocked() {
  Batch out = std::move(cur_);
  cur_ = Batch{};
  first_ms_ = 0;
  return out;
}

}  // namespace onlineps::worker
