// How deeply a JSON text nests, without parsing it. nlohmann::json copies and prints
// values recursively, so a message of a few hundred KB of '[' would overflow the stack of
// the thread handling it: readers of network and file input refuse deeper texts first.
#ifndef ONLINEPS_COMMON_JSON_DEPTH_H_
#define ONLINEPS_COMMON_JSON_DEPTH_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace onlineps {

// Whether `text` nests arrays or objects deeper than `max_depth` (a scan that builds
// nothing; for invalid JSON, an estimate).
inline bool NestsDeeperThan(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

// What ScanMsgpack found of a msgpack value.
enum class MsgpackScan {
  kOk,          // within max_depth, or invalid in a way the decoder refuses cheaply
  kTooDeep,     // nests deeper than max_depth
  kOverclaims,  // its arrays and maps claim more elements than it has bytes (never valid:
                // every element takes a byte), which a decoder allocating claims up front
                // would hold for each open container at once
};

// A scan of the first msgpack value in p[0, n) that builds nothing: how deep it nests
// (nlohmann::json::from_msgpack parses recursively, one stack frame per level, from one
// byte per level) and whether its containers claim more elements than it has bytes.
// Other invalid or truncated input: kOk (the decoder refuses it).
inline MsgpackScan ScanMsgpack(const uint8_t* p, size_t n, size_t max_depth) {
  auto be = [&](size_t at, int bytes) {
    uint64_t v = 0;
    for (int k = 0; k < bytes; ++k) v = v << 8 | p[at + k];
    return v;
  };
  std::vector<uint64_t> left;  // items still to read in each open container
  uint64_t claimed = 0;        // elements claimed by every container so far
  size_t i = 0;
  while (i < n) {
    const uint8_t b = p[i];
    uint64_t size = 1, items = 0;  // header + payload bytes; child values
    bool container = false;
    int len_bytes = 0;   // a length field of 1, 2 or 4 bytes after the type byte
    uint64_t extra = 0;  // fixed bytes besides the type byte and the length field
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
      size = 1;
    } else if ((b & 0xf0) == 0x80 || (b & 0xf0) == 0x90) {
      container = true;
      items = (b & 0x0f) * ((b & 0xf0) == 0x80 ? 2 : 1);
    } else if ((b & 0xe0) == 0xa0) {
      size = 1 + (b & 0x1f);
    } else if (b == 0xc4 || b == 0xc5 || b == 0xc6 || b == 0xd9 || b == 0xda || b == 0xdb) {
      len_bytes = (b == 0xc4 || b == 0xd9) ? 1 : (b == 0xc5 || b == 0xda) ? 2 : 4;
    } else if (b == 0xc7 || b == 0xc8 || b == 0xc9) {
      len_bytes = b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4;
      extra = 1;  // the ext type
    } else if (b == 0xca || b == 0xcb || (b >= 0xcc && b <= 0xd3)) {
      static constexpr uint8_t kFixed[] = {4, 8, 1, 2, 4, 8, 1, 2, 4, 8};
      size = 1 + kFixed[b - 0xca];
    } else if (b >= 0xd4 && b <= 0xd8) {
      size = 2 + (uint64_t{1} << (b - 0xd4));
    } else if (b >= 0xdc && b <= 0xdf) {
      if (i + 1 + ((b & 1) ? 4 : 2) > n) return MsgpackScan::kOk;
      container = true;
      size = 1 + ((b & 1) ? 4 : 2);
      items = be(i + 1, (b & 1) ? 4 : 2) * (b >= 0xde ? 2 : 1);
    } else {
      return MsgpackScan::kOk;  // 0xc1: never used
    }
    if (len_bytes > 0) {
      if (i + 1 + len_bytes > n) return MsgpackScan::kOk;
      size = 1 + len_bytes + extra + be(i + 1, len_bytes);
    }
    if (size > n - i) return MsgpackScan::kOk;
    i += size;
    if (container) {
      if (left.size() + 1 > max_depth) return MsgpackScan::kTooDeep;
      claimed += items;
      if (claimed > n) return MsgpackScan::kOverclaims;
      if (items > 0) {
        left.push_back(items);
        continue;
      }
    }
    while (!left.empty() && --left.back() == 0) left.pop_back();
    if (left.empty()) return MsgpackScan::kOk;  // the first value is complete
  }
  return MsgpackScan::kOk;
}

// Whether the first msgpack value in p[0, n) nests deeper than max_depth (ScanMsgpack).
inline bool MsgpackNestsDeeperThan(const uint8_t* p, size_t n, size_t max_depth) {
  return ScanMsgpack(p, n, max_depth) == MsgpackScan::kTooDeep;
}

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_JSON_DEPTH_H_
