// What this binary is: the version and the commit it was built from (cmake/build_commit.cmake
// writes the commit at build time), for --version, logs and onlineps_build_info.
#ifndef ONLINEPS_COMMON_BUILD_INFO_H_
#define ONLINEPS_COMMON_BUILD_INFO_H_

namespace onlineps {

// "0.1.0": the project version of CMakeLists.txt.
const char* BuildVersion();
// A 12-digit commit, with "-dirty" when tracked files had changes, or "unknown" (a build
// outside git without ONLINEPS_COMMIT set).
const char* BuildCommit();

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_BUILD_INFO_H_
