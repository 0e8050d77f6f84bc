#include "common/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace onlineps {

Status WriteFileAtomic(const std::string& path, std::string_view bytes, bool sync, mode_t mode) {
  const std::string tmp = path + ".tmp";
  // A temporary file left by a crash would keep its own mode through O_TRUNC: start anew.
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Unavailable("cannot create " + tmp + ": " + std::strerror(errno));
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return Unavailable("cannot write " + tmp + ": " + err);
    }
    off += static_cast<size_t>(n);
  }
  const bool synced = !sync || ::fsync(fd) == 0;
  const int sync_errno = errno;
  if (::close(fd) != 0 || !synced) {
    ::unlink(tmp.c_str());
    return Unavailable("cannot flush " + tmp + ": " + std::strerror(synced ? errno : sync_errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    return Unavailable("cannot rename " + tmp + " to " + path + ": " + err);
  }
  if (!sync) return Status::Ok();
  // The rename is durable only once the directory entry is on disk.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

}  // namespace onlineps
