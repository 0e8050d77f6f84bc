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
// crash); a directory that cannot be synced is an error, although `path` already holds
// the new file. The new file has `mode` less the umask, whatever an old file or a leftover
// temporary file had. The temporary file is removed on failure. Callers serialize writes
// of one path.
Status WriteFileAtomic(const std::string& path, std::string_view bytes, bool sync,
                       mode_t mode = 0644);

// WriteFileAtomic in pieces, for files too large to hold in memory: construct (creates
// path + ".tmp"), Write as often as needed, then Commit. The first error sticks and is
// returned by every later call; without a successful Commit the destructor removes the
// temporary file and `path` is untouched. Not thread-safe.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path, mode_t mode = 0644);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  Status Write(std::string_view bytes);
  // Closes the file and renames it over `path`; with `sync`, flushes file and directory
  // (an error when the directory cannot be flushed, with `path` already renamed).
  Status Commit(bool sync);
  uint64_t bytes_written() const { return written_; }

 private:
  const std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  Status status_;
};

// Warns (spdlog) when others than the owner and group may read or write the file at
// `path`, naming `what` (e.g. "--tokens-file"): for files that hold secrets. Kubernetes
// Secret volumes mounted with defaultMode 0440 pass; a 0644 key file does not.
void WarnIfOpenToOthers(const std::string& path, const std::string& what);

// An exclusive advisory lock (flock) on `path`, created 0600 when missing, held until the
// object is destroyed or the process exits (the kernel drops it then, kill -9 included).
// Acquire fails with kFailedPrecondition when another process holds it, naming `what`
// (e.g. "checkpoint directory /data"), and with kUnavailable when the file cannot be
// created or opened for writing (a read-only or missing directory).
class FileLock {
 public:
  static StatusOr<FileLock> Acquire(const std::string& path, const std::string& what);
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_FILE_IO_H_
