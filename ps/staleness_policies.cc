#include "ps/staleness_policies.h"

#include <algorithm>

#include "ps/optimizers.h"

namespace onlineps::ps {

using internal::ForEachBlock;
using internal::kBlock;
using internal::Saturate;
using internal::SqrtBlock;

float LrOverTau::LrScale(uint64_t tau) const {
  // A fresh gradient (tau 0) gets the full rate rather than a division by zero.
  return 1.0f / static_cast<float>(std::max<uint64_t>(tau, 1));
}

// The product is written lambda * g * g * (w - w_bak), left to right, so that lambda = 0
// yields exactly +-0 and g + 0 == g bit for bit: compensation off means no change at all.
// Its factors are saturated to the float range before they meet (an overflowed g * g
// times a zero w - w_bak would be NaN), and so is the compensated gradient.
namespace {
inline float Compensated(float g, float lambda, float w, float bak) {
  return Saturate(g + Saturate(Saturate(lambda * g * g) * Saturate(w - bak)));
}
}  // namespace

void DcConstant::Compensate(float* g, const float* w, const float* w_bak, float* const* /*state*/,
                            size_t n) const {
  const float lambda = static_cast<float>(options_.lambda);
  ForEachBlock(
      n,
      [lambda](float* __restrict gb, const float* __restrict wb, const float* __restrict bak) {
        for (size_t j = 0; j < kBlock; ++j) gb[j] = Compensated(gb[j], lambda, wb[j], bak[j]);
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
        float shifted[kBlock], root[kBlock];
        for (size_t j = 0; j < kBlock; ++j) {
          ms[j] = Saturate(m * ms[j] + one_minus_m * gb[j] * gb[j]);
          shifted[j] = Saturate(ms[j] + eps);
        }
        SqrtBlock(shifted, root);
        for (size_t j = 0; j < kBlock; ++j) {
          gb[j] = Compensated(gb[j], Saturate(lambda0 / root[j]), wb[j], bak[j]);
        }
      },
      g, state[0], w, w_bak);
}

}  // namespace onlineps::ps
