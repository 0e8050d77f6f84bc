#include "worker/msgpack_json.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace onlineps::worker {

namespace {

using json = nlohmann::json;

// A recursive-descent reader straight into the JSON value: no intermediate tree, so a
// body's peak memory is the value's (a body of a million numbers parsed through
// msgpack-c's objects first held both: +24 MiB). Types as from_msgpack gives them: uint
// formats unsigned, int formats signed, float32 widened, bin and ext binary.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n, size_t max_depth)
      : p_(p), end_(p + n), begin_(p), max_depth_(max_depth) {}

  Status Value(json* out, size_t depth) {
    if (depth > max_depth_) {
      return Malformed("nests deeper than " + std::to_string(max_depth_) + " levels");
    }
    uint8_t b = 0;
    ONLINEPS_RETURN_IF_ERROR(Byte(&b));
    if (b <= 0x7f) return Set(out, uint64_t{b});
    if (b >= 0xe0) return Set(out, int64_t{static_cast<int8_t>(b)});
    if (b >= 0x80 && b <= 0x8f) return Map(b & 0x0f, out, depth);
    if (b >= 0x90 && b <= 0x9f) return Array(b & 0x0f, out, depth);
    if (uint64_t len; StrLen(b, &len)) return Str(len, out);
    switch (b) {
      case 0xc0:
        *out = nullptr;
        return Status::Ok();
      case 0xc2:
        *out = false;
        return Status::Ok();
      case 0xc3:
        *out = true;
        return Status::Ok();
      case 0xc4:
        return Bin(Len<uint8_t>(), out);
      case 0xc5:
        return Bin(Len<uint16_t>(), out);
      case 0xc6:
        return Bin(Len<uint32_t>(), out);
      case 0xc7:
        return Ext(Len<uint8_t>(), out);
      case 0xc8:
        return Ext(Len<uint16_t>(), out);
      case 0xc9:
        return Ext(Len<uint32_t>(), out);
      case 0xca: {
        uint32_t u = 0;
        ONLINEPS_RETURN_IF_ERROR(Big(&u));
        float f;
        std::memcpy(&f, &u, sizeof(f));
        return Set(out, static_cast<double>(f));
      }
      case 0xcb: {
        uint64_t u = 0;
        ONLINEPS_RETURN_IF_ERROR(Big(&u));
        double d;
        std::memcpy(&d, &u, sizeof(d));
        return Set(out, d);
      }
      case 0xcc:
        return Unsigned<uint8_t>(out);
      case 0xcd:
        return Unsigned<uint16_t>(out);
      case 0xce:
        return Unsigned<uint32_t>(out);
      case 0xcf:
        return Unsigned<uint64_t>(out);
      case 0xd0:
        return Signed<uint8_t, int8_t>(out);
      case 0xd1:
        return Signed<uint16_t, int16_t>(out);
      case 0xd2:
        return Signed<uint32_t, int32_t>(out);
      case 0xd3:
        return Signed<uint64_t, int64_t>(out);
      case 0xd4:
        return Ext(1, out);
      case 0xd5:
        return Ext(2, out);
      case 0xd6:
        return Ext(4, out);
      case 0xd7:
        return Ext(8, out);
      case 0xd8:
        return Ext(16, out);
      case 0xdc:
        return Array(Len<uint16_t>(), out, depth);
      case 0xdd:
        return Array(Len<uint32_t>(), out, depth);
      case 0xde:
        return Map(Len<uint16_t>(), out, depth);
      case 0xdf:
        return Map(Len<uint32_t>(), out, depth);
      default:
        return Malformed("byte 0x" + Hex(b) + " at offset " + std::to_string(Offset() - 1) +
                         " starts no msgpack value");
    }
  }

  size_t left() const { return static_cast<size_t>(end_ - p_); }

 private:
  // A length field; a missing one reads as a length past the end (so Need fails).
  template <typename T>
  uint64_t Len() {
    T v = 0;
    return Big(&v).ok() ? uint64_t{v} : ~uint64_t{0};
  }

  template <typename T>
  Status Big(T* v) {
    if (left() < sizeof(T)) return Truncated();
    uint64_t x = 0;
    for (size_t i = 0; i < sizeof(T); ++i) x = (x << 8) | p_[i];
    p_ += sizeof(T);
    *v = static_cast<T>(x);
    return Status::Ok();
  }

  Status Byte(uint8_t* b) {
    if (left() < 1) return Truncated();
    *b = *p_++;
    return Status::Ok();
  }

  template <typename U>
  Status Unsigned(json* out) {
    U v = 0;
    ONLINEPS_RETURN_IF_ERROR(Big(&v));
    return Set(out, uint64_t{v});
  }

  template <typename U, typename S>
  Status Signed(json* out) {
    U v = 0;
    ONLINEPS_RETURN_IF_ERROR(Big(&v));
    return Set(out, int64_t{static_cast<S>(v)});
  }

  template <typename T>
  static Status Set(json* out, T v) {
    *out = v;
    return Status::Ok();
  }

  Status Need(uint64_t n) { return left() < n ? Truncated() : Status::Ok(); }

  // The next n bytes, at *at.
  Status Take(uint64_t n, const uint8_t** at) {
    ONLINEPS_RETURN_IF_ERROR(Need(n));
    *at = p_;
    p_ += n;
    return Status::Ok();
  }

  // Whether `b` starts a string (fixstr, str8, str16, str32); its length in *len (read
  // after `b`; past the end when missing).
  bool StrLen(uint8_t b, uint64_t* len) {
    if (b >= 0xa0 && b <= 0xbf) {
      *len = b & 0x1f;
    } else if (b == 0xd9) {
      *len = Len<uint8_t>();
    } else if (b == 0xda) {
      *len = Len<uint16_t>();
    } else if (b == 0xdb) {
      *len = Len<uint32_t>();
    } else {
      return false;
    }
    return true;
  }

  Status ReadStr(uint64_t n, std::string* s) {
    const uint8_t* at = nullptr;
    ONLINEPS_RETURN_IF_ERROR(Take(n, &at));
    s->assign(reinterpret_cast<const char*>(at), n);
    return Status::Ok();
  }

  Status Str(uint64_t n, json* out) {
    std::string s;
    ONLINEPS_RETURN_IF_ERROR(ReadStr(n, &s));
    *out = std::move(s);
    return Status::Ok();
  }

  Status Bin(uint64_t n, json* out) {
    const uint8_t* at = nullptr;
    ONLINEPS_RETURN_IF_ERROR(Take(n, &at));
    *out = json::binary(std::vector<uint8_t>(at, at + n));  // one memcpy
    return Status::Ok();
  }

  Status Ext(uint64_t n, json* out) {
    uint8_t type = 0;
    ONLINEPS_RETURN_IF_ERROR(Byte(&type));
    const uint8_t* at = nullptr;
    ONLINEPS_RETURN_IF_ERROR(Take(n, &at));
    *out = json::binary(std::vector<uint8_t>(at, at + n), type);
    return Status::Ok();
  }

  Status Array(uint64_t n, json* out, size_t depth) {
    ONLINEPS_RETURN_IF_ERROR(Need(n));  // every element takes a byte at least
    *out = json::array();
    auto& a = out->get_ref<json::array_t&>();
    // Grown as elements are read, not sized by the count: nested arrays each claiming
    // the bytes left after them (then a bad byte) held 16 bytes per claimed element at
    // every level at once, 64 x 16 per body byte.
    a.reserve(std::min<uint64_t>(n, kReserve));
    for (uint64_t i = 0; i < n; ++i) {
      ONLINEPS_RETURN_IF_ERROR(Value(&a.emplace_back(), depth + 1));
    }
    return Status::Ok();
  }

  Status Map(uint64_t n, json* out, size_t depth) {
    ONLINEPS_RETURN_IF_ERROR(Need(n > left() / 2 ? ~uint64_t{0} : 2 * n));  // 2 bytes a pair
    *out = json::object();
    for (uint64_t i = 0; i < n; ++i) {
      uint8_t b = 0;
      ONLINEPS_RETURN_IF_ERROR(Byte(&b));
      uint64_t len;
      if (!StrLen(b, &len)) {
        return Malformed("a map key at offset " + std::to_string(Offset() - 1) +
                         " is not a string");
      }
      std::string key;
      ONLINEPS_RETURN_IF_ERROR(ReadStr(len, &key));
      ONLINEPS_RETURN_IF_ERROR(Value(&(*out)[std::move(key)], depth + 1));  // a repeat: last wins
    }
    return Status::Ok();
  }

  size_t Offset() const { return static_cast<size_t>(p_ - begin_); }

  Status Truncated() const {
    return Malformed("cut short at offset " + std::to_string(Offset()) + " (not valid msgpack)");
  }

  static std::string Hex(uint8_t b) {
    const char* d = "0123456789abcdef";
    return {d[b >> 4], d[b & 15]};
  }

  // Elements an array reserves before reading them (a features array: 4096 values).
  static constexpr uint64_t kReserve = 4096;

  const uint8_t* p_;
  const uint8_t* end_;
  const uint8_t* const begin_;
  const size_t max_depth_;
};

}  // namespace

StatusOr<json> MsgpackToJson(const uint8_t* data, size_t size, size_t max_depth) {
  if (size == 0) return Malformed("no msgpack value (0 bytes)");
  Reader r(data, size, max_depth);
  json out;
  ONLINEPS_RETURN_IF_ERROR(r.Value(&out, 0));
  if (r.left() != 0) {
    return Malformed(std::to_string(r.left()) + " bytes after the msgpack value");
  }
  return out;
}

}  // namespace onlineps::worker
