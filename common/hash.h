// Non-cryptographic hashes, one copy for the whole tree: 64-bit FNV-1a and the
// splitmix64 finalizer. Stable across processes, builds and machines: they name files,
// place keys on shards and checked old checkpoints, so they never change. Pure; thread-safe.
#ifndef ONLINEPS_COMMON_HASH_H_
#define ONLINEPS_COMMON_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace onlineps {

inline constexpr uint64_t kFnv64Offset = 0xcbf29ce484222325ULL;
inline constexpr uint64_t kFnv64Prime = 0x100000001b3ULL;

// One FNV-1a step: folds `byte` into `h`.
constexpr uint64_t Fnv1a64Step(uint64_t h, unsigned char byte) { return (h ^ byte) * kFnv64Prime; }

// 64-bit FNV-1a of `bytes`, unmixed (the low bits are weak: mix before taking a range).
constexpr uint64_t Fnv1a64(std::string_view bytes, uint64_t h = kFnv64Offset) {
  for (char c : bytes) h = Fnv1a64Step(h, static_cast<unsigned char>(c));
  return h;
}

// A bijective 64-bit mixer (splitmix64 finalizer).
constexpr uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// FNV-1a of a string, mixed: a well-spread 64-bit hash of a name.
constexpr uint64_t HashString(std::string_view s) { return Mix64(Fnv1a64(s)); }

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_HASH_H_
