#include "common/sha256.h"

#include <sodium.h>

namespace onlineps {

std::string Sha256Hex(std::string_view bytes) {
  // libsodium asks for sodium_init before any other call; it is idempotent and
  // thread-safe, and SHA-256 does not depend on its outcome.
  static const int init = sodium_init();
  (void)init;
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(digest, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * sizeof digest);
  for (unsigned char b : digest) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

}  // namespace onlineps
