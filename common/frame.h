// Frame: one part of a multipart message. Owns its bytes through a shared holder so
// transports can hand buffers to ZeroMQ and back without copying. Immutable once
// built; cheap to copy (shares the holder). Thread-compatible.
#ifndef ONLINEPS_COMMON_FRAME_H_
#define ONLINEPS_COMMON_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace onlineps {

class Frame {
 public:
  Frame() = default;

  // Takes ownership of `s` without copying its bytes.
  static Frame FromString(std::string s) {
    auto h = std::make_shared<std::string>(std::move(s));
    return Frame(h, h->data(), h->size());
  }
  // Takes ownership of a vector of trivially copyable T without copying.
  template <typename T>
  static Frame FromVector(std::vector<T> v) {
    auto h = std::make_shared<std::vector<T>>(std::move(v));
    return Frame(h, reinterpret_cast<const char*>(h->data()), h->size() * sizeof(T));
  }
  static Frame Copy(const void* data, size_t size) {
    return FromString(std::string(static_cast<const char*>(data), size));
  }
  // Shares ownership of an arbitrary holder whose bytes are [data, data+size).
  Frame(std::shared_ptr<const void> holder, const char* data, size_t size)
      : holder_(std::move(holder)), data_(data), size_(size) {}

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::string ToString() const { return std::string(data_, size_); }
  const std::shared_ptr<const void>& holder() const { return holder_; }

  // Number of T elements, or -1 when size() is not a multiple of sizeof(T).
  template <typename T>
  int64_t CountOf() const {
    return size_ % sizeof(T) == 0 ? static_cast<int64_t>(size_ / sizeof(T)) : -1;
  }
  // Pointer to the bytes as T. The transports guarantee 8-byte alignment of payload
  // frames they deliver (they copy in the rare case the network buffer is not aligned).
  template <typename T>
  const T* As() const {
    return reinterpret_cast<const T*>(data_);
  }

 private:
  std::shared_ptr<const void> holder_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

using Frames = std::vector<Frame>;

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_FRAME_H_
