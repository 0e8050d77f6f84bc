// Little-endian byte writer and bounds-checked reader for checkpoint files.
// The reader never reads past its buffer: a truncated or corrupt file yields
// kDataLoss naming what could not be read. Not thread-safe.
#ifndef ONLINEPS_COMMON_BYTES_H_
#define ONLINEPS_COMMON_BYTES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/status.h"

namespace onlineps {

class ByteWriter {
 public:
  ByteWriter() = default;
  // A writer that hands its buffer to `spill` (which empties it) whenever it reaches
  // `spill_bytes`, so that a large output streams through a small buffer.
  ByteWriter(std::function<void(std::string*)> spill, size_t spill_bytes)
      : spill_(std::move(spill)), spill_bytes_(spill_bytes) {}

  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    Append(&v, sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    Append(s.data(), s.size());
  }
  template <typename T>
  void PutArray(const T* data, size_t n) {
    Put<uint64_t>(n);
    Append(data, n * sizeof(T));
  }
  void Append(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    if (spill_ && buf_.size() >= spill_bytes_) spill_(&buf_);
  }
  std::string& buffer() { return buf_; }

 private:
  std::string buf_;
  std::function<void(std::string*)> spill_;
  size_t spill_bytes_ = 0;
};

class ByteReader {
 public:
  ByteReader(const char* data, size_t size) : p_(data), end_(data + size) {}

  template <typename T>
  Status Get(T* v, const char* what) {
    return Read(v, sizeof(T), what);
  }
  Status GetString(std::string* s, const char* what) {
    uint64_t n = 0;
    ONLINEPS_RETURN_IF_ERROR(Get(&n, what));
    if (n > Remaining()) return Truncated(what);
    s->assign(p_, n);
    p_ += n;
    return Status::Ok();
  }
  // Reads an array written by PutArray; `expected` (if not SIZE_MAX) must match.
  template <typename T>
  Status GetArray(std::vector<T>* out, const char* what, size_t expected = SIZE_MAX) {
    uint64_t n = 0;
    ONLINEPS_RETURN_IF_ERROR(Get(&n, what));
    if (expected != SIZE_MAX && n != expected) {
      return DataLoss(std::string(what) + ": " + std::to_string(n) + " elements, expected " +
                      std::to_string(expected));
    }
    if (n > Remaining() / sizeof(T)) return Truncated(what);
    out->resize(n);
    return Read(out->data(), n * sizeof(T), what);
  }
  Status GetBytes(void* dst, size_t n, const char* what) { return Read(dst, n, what); }
  size_t Remaining() const { return static_cast<size_t>(end_ - p_); }
  // Calls `release(p)` each time reading has moved `every` bytes past the last call, p
  // being the first byte not yet read: a reader of a mapped file drops what it has read.
  void SetReleaseHook(std::function<void(const char*)> release, size_t every) {
    release_ = std::move(release);
    release_every_ = every;
    next_release_ = p_ + std::min(every, Remaining());
  }

 private:
  Status Read(void* dst, size_t n, const char* what) {
    if (n > Remaining()) return Truncated(what);
    std::memcpy(dst, p_, n);
    p_ += n;
    if (release_ && p_ >= next_release_) {
      release_(p_);
      next_release_ = p_ + std::min(release_every_, Remaining());
    }
    return Status::Ok();
  }
  static Status Truncated(const char* what) {
    return DataLoss(std::string("truncated while reading ") + what);
  }
  const char* p_;
  const char* end_;
  std::function<void(const char*)> release_;
  size_t release_every_ = 0;
  const char* next_release_ = nullptr;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_BYTES_H_
