#include "common/sha256.h"

#include <sodium.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace onlineps {
namespace {

std::string Hex(const unsigned char (&digest)[crypto_hash_sha256_BYTES]) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * crypto_hash_sha256_BYTES);
  for (unsigned char b : digest) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

}  // namespace

Sha256::Sha256() : state_(std::make_unique<crypto_hash_sha256_state>()) {
  // libsodium asks for sodium_init before any other call; it is idempotent and
  // thread-safe, and SHA-256 does not depend on its outcome.
  static const int init = sodium_init();
  (void)init;
  crypto_hash_sha256_init(state_.get());
}

Sha256::~Sha256() = default;

void Sha256::Update(const void* data, size_t n) {
  crypto_hash_sha256_update(state_.get(), static_cast<const unsigned char*>(data), n);
}

std::string Sha256::HexDigest() {
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256_final(state_.get(), digest);
  return Hex(digest);
}

std::string Sha256Hex(const void* data, size_t n) {
  Sha256 s;
  s.Update(data, n);
  return s.HexDigest();
}

std::string Sha256Hex(std::string_view bytes) { return Sha256Hex(bytes.data(), bytes.size()); }

StatusOr<std::string> FileSha256(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) return NotFound(path + ": " + std::strerror(errno));
  Sha256 s;
  std::vector<char> buf(1 << 16);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) s.Update(buf.data(), n);
  if (std::ferror(f.get())) return DataLoss(path + ": read error: " + std::strerror(errno));
  return s.HexDigest();
}

}  // namespace onlineps
