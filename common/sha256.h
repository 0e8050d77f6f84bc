// SHA-256 (FIPS 180-4) through libsodium, the one copy in the tree: record keys in the
// bridge's state directory, file hashes in trace headers and dataset manifests.
// Sha256 is a thread-compatible incremental hasher; the free functions are thread-safe.
#ifndef ONLINEPS_COMMON_SHA256_H_
#define ONLINEPS_COMMON_SHA256_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

struct crypto_hash_sha256_state;  // libsodium's, from <sodium.h>

namespace onlineps {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  void Update(const void* data, size_t n);
  // The digest as 64 lower-case hex digits. REQUIRES: called once; the hasher is spent after.
  std::string HexDigest();

 private:
  std::unique_ptr<crypto_hash_sha256_state> state_;  // opaque: <sodium.h> stays in the .cc
};

// The SHA-256 digest of `bytes` (or of `n` bytes at `data`) as 64 lowercase hex digits.
std::string Sha256Hex(std::string_view bytes);
std::string Sha256Hex(const void* data, size_t n);
// Hex SHA-256 of the file's bytes; kNotFound if it cannot be opened, kDataLoss on a read error.
StatusOr<std::string> FileSha256(const std::string& path);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_SHA256_H_
