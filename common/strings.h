// Small string helpers shared by the HTTP layer and the file readers.
#ifndef ONLINEPS_COMMON_STRINGS_H_
#define ONLINEPS_COMMON_STRINGS_H_

#include <string>

namespace onlineps {

// `s` without leading and trailing spaces, tabs, CRs and LFs.
inline std::string Trim(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r\n") + 1 - first);
}

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_STRINGS_H_
