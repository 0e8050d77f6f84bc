// Monotonic time in milliseconds since an arbitrary start; never goes backwards.
#ifndef ONLINEPS_COMMON_CLOCK_H_
#define ONLINEPS_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace onlineps {

inline uint64_t NowMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_CLOCK_H_
