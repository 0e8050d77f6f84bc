#include "ps/optimizers.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "ps/cpu_clones.h"

namespace onlineps::ps {

using internal::ForEachBlock;
using internal::kBlock;
using internal::Saturate;
using internal::SaturateToFloat;
using internal::SqrtBlock;

// Every kernel below takes its arrays as __restrict block parameters: that is what lets
// GCC drop the aliasing checks, which its -O2 cost model would otherwise refuse to emit.
// Per-call constants are computed in double once and narrowed to float, so the inner
// loops are pure float arithmetic. What they store is saturated to the float range
// (internal::Saturate), and so are the products that could otherwise meet a zero or an
// opposite infinity (Inf * 0, Inf - Inf: NaN).

namespace {

// The plain step on its own, so it can have an AVX2 copy (a virtual function cannot).
__attribute__((flatten)) ONLINEPS_AVX2_CLONES void SgdStep(float* w, const float* g, size_t n,
                                                           float step) {
  ForEachBlock(
      n,
      [step](float* __restrict wb, const float* __restrict gb) {
        for (size_t j = 0; j < kBlock; ++j) wb[j] -= step * gb[j];
        internal::SaturateBlock(wb);
      },
      w, g);
}

}  // namespace

void Sgd::Apply(float* w, float* const* /*state*/, const float* g, size_t n,
                const ApplyArgs& args) const {
  SgdStep(w, g, n, SaturateToFloat(options_.lr * args.lr_scale));
}

float Adagrad::InitialState(int slot) const {
  return static_cast<float>(options_.initial_accumulator);
}

void Adagrad::Apply(float* w, float* const* state, const float* g, size_t n,
                    const ApplyArgs& args) const {
  const float step = SaturateToFloat(options_.lr * args.lr_scale);
  const float eps = static_cast<float>(options_.eps);
  ForEachBlock(
      n,
      [step, eps](float* __restrict wb, float* __restrict acc, const float* __restrict gb) {
        float root[kBlock];
        for (size_t j = 0; j < kBlock; ++j) acc[j] = Saturate(acc[j] + gb[j] * gb[j]);
        SqrtBlock(acc, root);
        for (size_t j = 0; j < kBlock; ++j)
          wb[j] = Saturate(wb[j] - step * gb[j] / (root[j] + eps));
      },
      w, state[0], g);
}

void Ftrl::Apply(float* w, float* const* state, const float* g, size_t n,
                 const ApplyArgs& args) const {
  // A zero or negative scale would make 1/alpha infinite or flip the sign of the step.
  if (!(args.lr_scale > 0.0f)) return;
  const float inv_alpha = SaturateToFloat(1.0 / (options_.alpha * args.lr_scale));
  const float beta = static_cast<float>(options_.beta);
  const float l1 = static_cast<float>(options_.l1);
  const float l2 = static_cast<float>(options_.l2);
  ForEachBlock(
      n,
      [=](float* __restrict wb, float* __restrict z, float* __restrict nb,
          const float* __restrict gb) {
        float n_new[kBlock], root_old[kBlock], root_new[kBlock];
        for (size_t j = 0; j < kBlock; ++j) n_new[j] = Saturate(nb[j] + gb[j] * gb[j]);
        SqrtBlock(nb, root_old);
        SqrtBlock(n_new, root_new);
        for (size_t j = 0; j < kBlock; ++j) {
          const float sigma = Saturate((root_new[j] - root_old[j]) * inv_alpha);
          const float zj = Saturate(Saturate(z[j] + gb[j]) - Saturate(sigma * wb[j]));
          z[j] = zj;
          nb[j] = n_new[j];
          // Soft threshold without a branch: clamp(z) - z is -(z - sgn(z) l1) outside the
          // L1 ball and exactly +0 inside it. The denominator is 0 only when beta = l2 = 0
          // and n = 0, where the numerator is 0 too; the floor turns that 0/0 into 0.
          const float shrunk = std::clamp(zj, -l1, l1) - zj;
          const float denom = Saturate(Saturate((beta + root_new[j]) * inv_alpha) + l2);
          wb[j] = shrunk / std::max(denom, FLT_MIN);
        }
      },
      w, state[0], state[1], g);
}

void Adam::Apply(float* w, float* const* state, const float* g, size_t n,
                 const ApplyArgs& args) const {
  // step 0 would divide by a zero bias correction; the contract says steps start at 1.
  const double t = static_cast<double>(std::max<uint64_t>(args.step, 1));
  const double correction1 = 1.0 - std::pow(options_.beta1, t);
  const double correction2 = 1.0 - std::pow(options_.beta2, t);
  const float step = SaturateToFloat(options_.lr * args.lr_scale / correction1);
  const float inv_correction2 = SaturateToFloat(1.0 / correction2);
  const float b1 = static_cast<float>(options_.beta1);
  const float b2 = static_cast<float>(options_.beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - options_.beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - options_.beta2);
  const float eps = static_cast<float>(options_.eps);
  ForEachBlock(
      n,
      [=](float* __restrict wb, float* __restrict m, float* __restrict v,
          const float* __restrict gb) {
        float v_hat[kBlock], root[kBlock];
        for (size_t j = 0; j < kBlock; ++j) {
          m[j] = Saturate(b1 * m[j] + one_minus_b1 * gb[j]);
          v[j] = Saturate(b2 * v[j] + one_minus_b2 * gb[j] * gb[j]);
          v_hat[j] = Saturate(v[j] * inv_correction2);
        }
        SqrtBlock(v_hat, root);
        for (size_t j = 0; j < kBlock; ++j) {
          wb[j] = Saturate(wb[j] - Saturate(step * m[j]) / (root[j] + eps));
        }
      },
      w, state[0], state[1], g);
}

}  // namespace onlineps::ps
