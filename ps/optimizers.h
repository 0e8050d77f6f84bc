// The server-side optimizers behind CreateOptimizer: Sgd, Adagrad, Ftrl, Adam. Each is
// immutable after construction and thread-safe. REQUIRES of every Apply: w, each state
// slot and g are distinct, non-overlapping arrays of n floats. Construct them through
// CreateOptimizer, which validates the options; direct construction trusts them.
#ifndef ONLINEPS_PS_OPTIMIZERS_H_
#define ONLINEPS_PS_OPTIMIZERS_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <string_view>
#include <type_traits>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "ps/update_rule.h"

namespace onlineps::ps {

// w -= lr * lr_scale * g. No state.
struct SgdOptions {
  double lr = 0.01;
};

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const SgdOptions& options) : options_(options) {}
  std::string_view name() const override { return "sgd"; }
  int state_slots() const override { return 0; }
  void Apply(float* w, float* const* state, const float* g, size_t n,
             const ApplyArgs& args) const override;
  double lr() const override { return options_.lr; }

 private:
  const SgdOptions options_;
};

// G += g*g; w -= lr * lr_scale * g / (sqrt(G) + eps). Slot 0: G, starting at
// initial_accumulator.
struct AdagradOptions {
  double lr = 0.01;
  double eps = 1e-10;
  double initial_accumulator = 0.0;
};

class Adagrad final : public Optimizer {
 public:
  explicit Adagrad(const AdagradOptions& options) : options_(options) {}
  std::string_view name() const override { return "adagrad"; }
  int state_slots() const override { return 1; }
  float InitialState(int slot) const override;
  void Apply(float* w, float* const* state, const float* g, size_t n,
             const ApplyArgs& args) const override;
  double lr() const override { return options_.lr; }

 private:
  const AdagradOptions options_;
};

// FTRL-Proximal (McMahan et al. 2013), per coordinate. Slot 0: z, slot 1: n. A step
// with lr_scale s weighs its gradient, s * g (scaling alpha for one step would break the
// running sum of sigma that z keeps); s <= 0 (or NaN) leaves w, z and n untouched. lr()
// is alpha.
struct FtrlOptions {
  double alpha = 0.1;
  double beta = 1.0;
  double l1 = 0.0;
  double l2 = 0.0;
};

class Ftrl final : public Optimizer {
 public:
  explicit Ftrl(const FtrlOptions& options) : options_(options) {}
  std::string_view name() const override { return "ftrl"; }
  int state_slots() const override { return 2; }
  void Apply(float* w, float* const* state, const float* g, size_t n,
             const ApplyArgs& args) const override;
  double lr() const override { return options_.alpha; }

 private:
  const FtrlOptions options_;
};

// Adam with bias correction at t = args.step (0 is treated as 1). Slot 0: m, slot 1: v.
struct AdamOptions {
  double lr = 0.001;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

class Adam final : public Optimizer {
 public:
  explicit Adam(const AdamOptions& options) : options_(options) {}
  std::string_view name() const override { return "adam"; }
  int state_slots() const override { return 2; }
  void Apply(float* w, float* const* state, const float* g, size_t n,
             const ApplyArgs& args) const override;
  double lr() const override { return options_.lr; }

 private:
  const AdamOptions options_;
};

// Loop helpers shared by the kernels (optimizers.cc, staleness_policies.cc) and the
// tables' own loops (delta pushes, sums, Polyak averages); not part of the update-rule API.
namespace internal {

// Elements per kernel block. GCC -O2 (very-cheap cost model) vectorizes only loops
// whose trip count is a known multiple of the vector width, hence fixed-size blocks.
inline constexpr size_t kBlock = 8;

// x clamped to the float range: +-Inf becomes +-FLT_MAX, NaN stays NaN (never hidden).
// Every value stored in a table, and every product that could meet a zero or an opposite
// infinity, is saturated, so a finite push never leaves Inf or NaN in a table: a step
// past the range saturates instead (e.g. Adagrad's accumulator after a gradient above
// 1.8e19). This scalar form serves the tables' own loops (delta pushes, sums, Polyak
// averages); the kernels use SaturateBlock.
inline float Saturate(float x) { return std::min(std::max(x, -FLT_MAX), FLT_MAX); }
// Saturate on one block in place, for the kernels (optimizers.cc, staleness_policies.cc):
// GCC turns the scalar form into compares and blends and stops vectorizing the longer
// kernels; the SSE form is one max and one min per 4 floats. A NaN (which no finite input
// yields) becomes -FLT_MAX here.
inline void SaturateBlock(float* __restrict x) {
#if defined(__SSE__)
  const __m128 lo = _mm_set1_ps(-FLT_MAX), hi = _mm_set1_ps(FLT_MAX);
  _mm_storeu_ps(x, _mm_min_ps(_mm_max_ps(_mm_loadu_ps(x), lo), hi));
  _mm_storeu_ps(x + 4, _mm_min_ps(_mm_max_ps(_mm_loadu_ps(x + 4), lo), hi));
#else
  for (size_t j = 0; j < kBlock; ++j) x[j] = Saturate(x[j]);
#endif
}
// The same for a per-call constant computed in double, narrowed to float.
inline float SaturateToFloat(double x) {
  return static_cast<float>(std::min(std::max(x, -double{FLT_MAX}), double{FLT_MAX}));
}

// out[j] = sqrt(in[j]) for one block. std::sqrt may set errno, which keeps GCC from
// vectorizing it without -fno-math-errno; the SSE intrinsic has no such path.
inline void SqrtBlock(const float* __restrict in, float* __restrict out) {
#if defined(__SSE__)
  _mm_storeu_ps(out, _mm_sqrt_ps(_mm_loadu_ps(in)));
  _mm_storeu_ps(out + 4, _mm_sqrt_ps(_mm_loadu_ps(in + 4)));
#else
  for (size_t j = 0; j < kBlock; ++j) out[j] = std::sqrt(in[j]);
#endif
}

// A zero-padded block-sized copy of the last rest (< kBlock) elements of an array;
// written back on destruction unless the array is const.
template <typename T>
class PaddedTail {
 public:
  PaddedTail(T* src, size_t rest) : src_(src), rest_(rest) {
    for (size_t j = 0; j < rest; ++j) buf_[j] = src[j];
  }
  ~PaddedTail() {
    if constexpr (!std::is_const_v<T>) {
      for (size_t j = 0; j < rest_; ++j) src_[j] = buf_[j];
    }
  }
  PaddedTail(const PaddedTail&) = delete;
  PaddedTail& operator=(const PaddedTail&) = delete;
  float* data() { return buf_; }

 private:
  T* const src_;
  const size_t rest_;
  float buf_[kBlock] = {};
};

// Runs block(p + i...) for each full block of n elements, then once on zero-padded
// copies of the tail, so every element goes through the same (vectorized) block code.
// block must be correct for any element independently; padded lanes are discarded.
template <typename Block, typename... T>
void ForEachBlock(size_t n, const Block& block, T*... arrays) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) block((arrays + i)...);
  if (i == n) return;
  auto run_padded = [&block](auto&&... tails) { block(tails.data()...); };
  run_padded(PaddedTail<T>(arrays + i, n - i)...);
}

}  // namespace internal
}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_OPTIMIZERS_H_
