#include "common/build_info.h"

#include "common/build_commit.h"  // generated into the build tree

namespace onlineps {

const char* BuildVersion() { return ONLINEPS_VERSION; }
const char* BuildCommit() { return ONLINEPS_COMMIT; }

}  // namespace onlineps
