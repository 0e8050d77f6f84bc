#include "ps/optimizers.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "ps/cpu_clones.h"

namespace onlineps::ps {

using internal::ForEachBlock;
using internal::kBlock;
using internal::SaturateBlock;
using internal::SaturateToFloat;
using internal::SqrtBlock;

// Every kernel below takes its arrays as __restrict block parameters: that is what lets
// GCC drop the aliasing checks, which its -O2 cost model would otherwise refuse to emit.
// Per-call constants are computed in double once and narrowed to float, so the inner
// loops are pure float arithmetic. What they store is saturated to the float range
// (internal::SaturateBlock, a max and a min per 4 floats, applied to whole blocks so that
// the loops stay vectorized), and so are the products that could otherwise meet a zero
// or an opposite infinity (Inf * 0, Inf - Inf: NaN).

namespace {

// The plain step on its own, so it can have an AVX2 copy (a virtual function cannot).
__attribute__((flatten)) ONLINEPS_AVX2_CLONES void SgdStep(float* w, const float* g, size_t n,
                                                           float step) {
  ForEachBlock(
      n,
      [step](float* __restrict wb, const float* __restrict gb) {
        for (size_t j = 0; j < kBlock; ++j) wb[j] -= step * gb[j];
        SaturateBlock(wb);
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
        for (size_t j = 0; j < kBlock; ++j) acc[j] += gb[j] * gb[j];
        SaturateBlock(acc);
        SqrtBlock(acc, root);
        for (size_t j = 0; j < kBlock; ++j) wb[j] -= step * gb[j] / (root[j] + eps);
        SaturateBlock(wb);
      },
      w, state[0], g);
}

void Ftrl::Apply(float* w, float* const* state, const float* g, size_t n,
                 const ApplyArgs& args) const {
  // The step's scale weighs its gradient (s·g), so that a scaled-down (stale) push moves
  // the weights less, never more: scaling alpha for one step instead would break the
  // running sum of sigma (sqrt(n)/alpha) that z keeps, and the next unscaled step would
  // then move w by the difference. A zero or negative scale leaves everything untouched.
  if (!(args.lr_scale > 0.0f)) return;
  const float scale = args.lr_scale;
  const float inv_alpha = SaturateToFloat(1.0 / options_.alpha);
  const float beta = static_cast<float>(options_.beta);
  const float l1 = static_cast<float>(options_.l1);
  const float l2 = static_cast<float>(options_.l2);
  ForEachBlock(
      n,
      [=](float* __restrict wb, float* __restrict z, float* __restrict nb,
          const float* __restrict gb) {
        float gs[kBlock], n_new[kBlock], root_old[kBlock], root_new[kBlock], sigma[kBlock],
            zg[kBlock], sw[kBlock], denom[kBlock];
        for (size_t j = 0; j < kBlock; ++j) gs[j] = gb[j] * scale;
        for (size_t j = 0; j < kBlock; ++j) n_new[j] = nb[j] + gs[j] * gs[j];
        SaturateBlock(n_new);
        SqrtBlock(nb, root_old);
        SqrtBlock(n_new, root_new);
        for (size_t j = 0; j < kBlock; ++j) sigma[j] = (root_new[j] - root_old[j]) * inv_alpha;
        SaturateBlock(sigma);
        for (size_t j = 0; j < kBlock; ++j) {
          zg[j] = z[j] + gs[j];
          sw[j] = sigma[j] * wb[j];
          denom[j] = (beta + root_new[j]) * inv_alpha;
        }
        SaturateBlock(zg);
        SaturateBlock(sw);
        SaturateBlock(denom);
        for (size_t j = 0; j < kBlock; ++j) {
          z[j] = zg[j] - sw[j];
          nb[j] = n_new[j];
          denom[j] += l2;
        }
        SaturateBlock(z);
        SaturateBlock(denom);
        for (size_t j = 0; j < kBlock; ++j) {
          // Soft threshold without a branch: clamp(z) - z is -(z - sgn(z) l1) outside the
          // L1 ball and exactly +0 inside it. The denominator is 0 only when beta = l2 = 0
          // and n = 0, where the numerator is 0 too; the floor turns that 0/0 into 0.
          const float shrunk = std::clamp(z[j], -l1, l1) - z[j];
          wb[j] = shrunk / std::max(denom[j], FLT_MIN);
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
        float v_hat[kBlock], root[kBlock], sm[kBlock];
        for (size_t j = 0; j < kBlock; ++j) {
          m[j] = b1 * m[j] + one_minus_b1 * gb[j];
          v[j] = b2 * v[j] + one_minus_b2 * gb[j] * gb[j];
        }
        SaturateBlock(m);
        SaturateBlock(v);
        for (size_t j = 0; j < kBlock; ++j) {
          v_hat[j] = v[j] * inv_correction2;
          sm[j] = step * m[j];
        }
        SaturateBlock(v_hat);
        SaturateBlock(sm);
        SqrtBlock(v_hat, root);
        for (size_t j = 0; j < kBlock; ++j) wb[j] -= sm[j] / (root[j] + eps);
        SaturateBlock(wb);
      },
      w, state[0], state[1], g);
}

}  // namespace onlineps::ps
