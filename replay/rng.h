// Rng: xoshiro256** seeded through splitmix64, with uniform, normal and bounded
// integer draws written here (no std::*_distribution), so a seed gives the same
// stream with every standard library. Deterministic for a seed; not thread-safe.
#ifndef ONLINEPS_REPLAY_RNG_H_
#define ONLINEPS_REPLAY_RNG_H_

#include <cmath>
#include <cstdint>

namespace onlineps::replay {

class Rng {
 public:
  explicit Rng(uint64_t seed = 1) {
    for (uint64_t& word : s_) word = SplitMix64(seed);
  }

  // The next 64 raw bits.
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform on [0, 1) from the top 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform();  // (0, 1]: log is finite
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 6.283185307179586476925 * u2;  // 2 pi
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

  // Uniform on {0, ..., n-1}, unbiased (rejects the short last block). REQUIRES: n > 0.
  uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % n;
    }
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t SplitMix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_RNG_H_
