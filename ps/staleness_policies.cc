#include "ps/staleness_policies.h"

#include <algorithm>

#include "ps/optimizers.h"

namespace onlineps::ps {

using internal::ForEachBlock;
using internal::kBlock;
using internal::SaturateBlock;
using internal::SqrtBlock;

float LrOverTau::LrScale(uint64_t tau) const {
  // A fresh gradient (tau 0) gets the full rate rather than a division by zero.
  return 1.0f / static_cast<float>(std::max<uint64_t>(tau, 1));
}

// The product is written lambda * g * g * (w - w_bak), left to right, so that lambda = 0
// yields exactly +-0 and g + 0 == g bit for bit: compensation off means no change at all.
// Its factors are saturated to the float range before they meet (an overflowed g * g
// times a zero w - w_bak would be NaN), and so is the compensated gradient; on whole
// blocks (internal::SaturateBlock), so that the loops stay vectorized.
namespace {
// g += lambda[j] * g * g * (w - bak) for one block, `lambda` per element.
inline void CompensateBlock(float* __restrict gb, const float* __restrict lambda,
                            const float* __restrict wb, const float* __restrict bak) {
  float p[kBlock], d[kBlock];
  for (size_t j = 0; j < kBlock; ++j) {
    p[j] = lambda[j] * gb[j] * gb[j];
    d[j] = wb[j] - bak[j];
  }
  SaturateBlock(p);
  SaturateBlock(d);
  for (size_t j = 0; j < kBlock; ++j) p[j] *= d[j];
  SaturateBlock(p);
  for (size_t j = 0; j < kBlock; ++j) gb[j] += p[j];
  SaturateBlock(gb);
}
}  // namespace

void DcConstant::Compensate(float* g, const float* w, const float* w_bak, float* const* /*state*/,
                            size_t n) const {
  const float lambda = static_cast<float>(options_.lambda);
  ForEachBlock(
      n,
      [lambda](float* __restrict gb, const float* __restrict wb, const float* __restrict bak) {
        float l[kBlock];
        for (size_t j = 0; j < kBlock; ++j) l[j] = lambda;
        CompensateBlock(gb, l, wb, bak);
      },
      g, w, w_bak);
}

void DcAdaptive::Compensate(float* g, const float* w, const float* w_bak, float* const* state,
                            size_t n) const {
  const float lambda0 = static_cast<float>(options_.lambda0);
  const float m = static_cast<float>(options_.m);
  const float one_minus_m = static_cast<float>(1.0 - options_.m);
  const float eps = static_cast<float>(options_.eps);
  ForEachBlock(
      n,
      [=](float* __restrict gb, float* __restrict ms, const float* __restrict wb,
          const float* __restrict bak) {
        float shifted[kBlock], root[kBlock], lambda_t[kBlock];
        for (size_t j = 0; j < kBlock; ++j) ms[j] = m * ms[j] + one_minus_m * gb[j] * gb[j];
        SaturateBlock(ms);
        for (size_t j = 0; j < kBlock; ++j) shifted[j] = ms[j] + eps;
        SaturateBlock(shifted);
        SqrtBlock(shifted, root);
        for (size_t j = 0; j < kBlock; ++j) lambda_t[j] = lambda0 / root[j];
        SaturateBlock(lambda_t);
        CompensateBlock(gb, lambda_t, wb, bak);
      },
      g, state[0], w, w_bak);
}

}  // namespace onlineps::ps
