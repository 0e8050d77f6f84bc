#include "worker/body_scan.h"

#include <string>
#include <string_view>
#include <vector>

namespace onlineps::worker {
namespace {

// One open container: how many child values (map: keys and values) it has and has read.
struct Open {
  bool map = false;
  uint64_t items = 0, read = 0;
  std::string_view key;  // map: the key of the value being read
};

// Where the value being read sits, as the worker's messages name fields:
// "examples[3].text". `at_key`: a key of the innermost map is being read.
std::string PathOf(const std::vector<Open>& open, bool at_key) {
  std::string path;
  for (size_t k = 0; k < open.size(); ++k) {
    const Open& o = open[k];
    if (at_key && k + 1 == open.size()) break;
    if (o.map) {
      path += (path.empty() ? "" : ".") + std::string(o.key.substr(0, 64));
    } else {
      path += "[" + std::to_string(o.read) + "]";
    }
  }
  return path.empty() ? "body" : path;
}

uint64_t BigEndian(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int k = 0; k < bytes; ++k) v = v << 8 | p[k];
  return v;
}

// The value at p[0..n): its encoded size (header and payload) and kind. False when it is
// truncated or not msgpack.
struct Value {
  uint64_t size = 1;   // bytes, header included
  uint64_t items = 0;  // container: child values
  uint64_t str = 0;    // string: payload bytes
  bool container = false, map = false, string = false, number = false;
};

bool ReadValue(const uint8_t* p, size_t n, Value* v) {
  const uint8_t b = p[0];
  int len_bytes = 0;  // a length field after the type byte
  uint64_t extra = 0;
  if (b <= 0x7f || b >= 0xe0) {
    v->number = true;
  } else if (b == 0xc0 || b == 0xc2 || b == 0xc3) {
  } else if ((b & 0xf0) == 0x80 || (b & 0xf0) == 0x90) {
    v->container = true;
    v->map = (b & 0xf0) == 0x80;
    v->items = (b & 0x0f) * (v->map ? 2 : 1);
  } else if ((b & 0xe0) == 0xa0) {
    v->string = true;
    v->str = b & 0x1f;
    v->size = 1 + v->str;
  } else if (b == 0xd9 || b == 0xda || b == 0xdb) {
    v->string = true;
    len_bytes = b == 0xd9 ? 1 : b == 0xda ? 2 : 4;
  } else if (b == 0xc4 || b == 0xc5 || b == 0xc6) {
    len_bytes = b == 0xc4 ? 1 : b == 0xc5 ? 2 : 4;
  } else if (b == 0xc7 || b == 0xc8 || b == 0xc9) {
    len_bytes = b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4;
    extra = 1;  // the ext type
  } else if (b == 0xca || b == 0xcb || (b >= 0xcc && b <= 0xd3)) {
    static constexpr uint8_t kFixed[] = {4, 8, 1, 2, 4, 8, 1, 2, 4, 8};
    v->number = true;
    v->size = 1 + kFixed[b - 0xca];
  } else if (b >= 0xd4 && b <= 0xd8) {
    v->size = 2 + (uint64_t{1} << (b - 0xd4));
  } else if (b >= 0xdc && b <= 0xdf) {
    const int bytes = (b & 1) ? 4 : 2;
    if (n < 1 + static_cast<size_t>(bytes)) return false;
    v->container = true;
    v->map = b >= 0xde;
    v->size = 1 + bytes;
    v->items = BigEndian(p + 1, bytes) * (v->map ? 2 : 1);
  } else {
    return false;  // 0xc1: never used
  }
  if (len_bytes > 0) {
    if (n < 1 + static_cast<size_t>(len_bytes)) return false;
    const uint64_t len = BigEndian(p + 1, len_bytes);
    if (v->string) v->str = len;
    v->size = 1 + len_bytes + extra + len;
  }
  return v->size <= n;
}

}  // namespace

Status ScanBody(const uint8_t* p, size_t n, const RequestLimits& limits,
                std::string_view* session) {
  const uint64_t max_numbers = limits.MaxBodyNumbers(), max_others = limits.MaxBodyOtherValues();
  uint64_t numbers = 0, others = 0;
  std::vector<Open> open;
  size_t i = 0;
  while (i < n) {
    Value v;
    if (!ReadValue(p + i, n - i, &v)) return Status::Ok();  // the decoder names the error
    const bool is_key = !open.empty() && open.back().map && open.back().read % 2 == 0;
    if (v.string && v.str > limits.max_text_bytes) {
      const std::string where =
          is_key ? "a key of " + PathOf(open, /*at_key=*/true) : PathOf(open, /*at_key=*/false);
      return CheckTextBytes(v.str, where, limits);
    }
    if (v.number ? ++numbers > max_numbers : ++others > max_others) {
      return v.number ? TooLarge("body has more than " + std::to_string(max_numbers) +
                                 " numbers; at most (--max-batch + 1) x (--max-features + 1)")
                      : TooLarge("body has more than " + std::to_string(max_others) +
                                 " maps, arrays, strings and keys; at most 16 per example of "
                                 "--max-batch, plus 256");
    }
    const auto* str = reinterpret_cast<const char*>(p + i + v.size - v.str);
    if (is_key) {
      open.back().key = v.string ? std::string_view(str, static_cast<size_t>(v.str)) : "";
    } else if (session != nullptr && v.string && open.size() == 1 && open[0].map &&
               open[0].key == "session") {
      *session = std::string_view(str, static_cast<size_t>(v.str));
    }
    i += v.size;
    if (v.container && v.items > 0) {
      open.push_back(Open{v.map, v.items, 0, {}});
      continue;
    }
    // The value is complete: count it in its container, closing those it completes.
    while (!open.empty() && ++open.back().read == open.back().items) open.pop_back();
    if (open.empty()) return Status::Ok();  // the body (its first value) is complete
  }
  return Status::Ok();
}

}  // namespace onlineps::worker
