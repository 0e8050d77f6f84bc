// SHA-256 (FIPS 180-4), for the file hashes recorded in trace headers and manifests.
// Sha256 is a thread-compatible incremental hasher; the free functions are thread-safe.
#ifndef ONLINEPS_REPLAY_SHA256_H_
#define ONLINEPS_REPLAY_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace onlineps::replay {

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t n);
  // The digest as 64 lower-case hex digits. REQUIRES: called once; the hasher is spent after.
  std::string HexDigest();

 private:
  void Block(const uint8_t* p);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

// Hex SHA-256 of `n` bytes at `data`.
std::string Sha256Hex(const void* data, size_t n);
// Hex SHA-256 of the file's bytes; kNotFound if it cannot be opened, kDataLoss on a read error.
StatusOr<std::string> FileSha256(const std::string& path);

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_SHA256_H_
