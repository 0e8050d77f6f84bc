// How deeply a JSON text nests, without parsing it. nlohmann::json copies and prints
// values recursively, so a message of a few hundred KB of '[' would overflow the stack of
// the thread handling it: readers of network and file input refuse deeper texts first.
#ifndef ONLINEPS_COMMON_JSON_DEPTH_H_
#define ONLINEPS_COMMON_JSON_DEPTH_H_

#include <cstddef>
#include <string_view>

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

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_JSON_DEPTH_H_
