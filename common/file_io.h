// Whole-file writes that a crash cannot tear.
#ifndef ONLINEPS_COMMON_FILE_IO_H_
#define ONLINEPS_COMMON_FILE_IO_H_

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace onlineps {

// Writes `bytes` to path + ".tmp" and renames it over `path`: a reader sees the old file
// or the new one, never part of one. With `sync`, the file and then its directory are
// flushed to disk before returning (the write survives a host crash, not only a process
// crash). The new file has `mode` less the umask, whatever an old file or a leftover
// temporary file had. The temporary file is removed on failure. Callers serialize writes
// of one path.
Status WriteFileAtomic(const std::string& path, std::string_view bytes, bool sync,
                       mode_t mode = 0644);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_FILE_IO_H_
