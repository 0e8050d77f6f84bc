// SHA-256 (FIPS 180-4), through libsodium.
#ifndef ONLINEPS_COMMON_SHA256_H_
#define ONLINEPS_COMMON_SHA256_H_

#include <string>
#include <string_view>

namespace onlineps {

// The SHA-256 digest of `bytes` as 64 lowercase hex digits. Thread-safe; never fails.
std::string Sha256Hex(std::string_view bytes);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_SHA256_H_
