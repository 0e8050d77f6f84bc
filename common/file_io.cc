#include "common/file_io.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace onlineps {

Status WriteFileAtomic(const std::string& path, std::string_view bytes, bool sync, mode_t mode) {
  AtomicFileWriter file(path, mode);
  ONLINEPS_RETURN_IF_ERROR(file.Write(bytes));
  return file.Commit(sync);
}

AtomicFileWriter::AtomicFileWriter(std::string path, mode_t mode)
    : path_(std::move(path)), tmp_(path_ + ".tmp") {
  // A temporary file left by a crash would keep its own mode through O_TRUNC: start anew.
  ::unlink(tmp_.c_str());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd_ < 0) status_ = Unavailable("cannot create " + tmp_ + ": " + std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

Status AtomicFileWriter::Write(std::string_view bytes) {
  size_t off = 0;
  while (status_.ok() && off < bytes.size()) {
    ssize_t n = ::write(fd_, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status_ = Unavailable("cannot write " + tmp_ + ": " + std::strerror(errno));
    } else {
      off += static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
    }
  }
  return status_;
}

Status AtomicFileWriter::Commit(bool sync) {
  ONLINEPS_RETURN_IF_ERROR(status_);
  const bool synced = !sync || ::fsync(fd_) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!closed || !synced) {
    ::unlink(tmp_.c_str());
    return status_ = Unavailable("cannot flush " + tmp_ + ": " +
                                 std::strerror(synced ? errno : sync_errno));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp_.c_str());
    return status_ = Unavailable("cannot rename " + tmp_ + " to " + path_ + ": " + err);
  }
  if (!sync) return Status::Ok();
  // The rename is durable only once the directory entry is on disk.
  // Reported, not ignored: the file is in place, but a host crash may bring back the old
  // one, so a caller must not count it as safely written.
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool dir_synced = dfd >= 0 && ::fsync(dfd) == 0;
  const int dir_errno = errno;
  if (dfd >= 0) ::close(dfd);
  if (!dir_synced) {
    return status_ = Unavailable("wrote " + path_ + " but cannot sync its directory " + dir + ": " +
                                 std::strerror(dir_errno) +
                                 " (a host crash may bring back the file it replaced)");
  }
  return Status::Ok();
}

StatusOr<FileLock> FileLock::Acquire(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Unavailable("cannot create the lock file " + path + " in the " + what + ": " +
                       std::strerror(errno));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return FailedPrecondition("another process is using the " + what + " (it holds " + path +
                                "): two processes writing the same files lose one's data");
    }
    return Unavailable("cannot lock " + path + ": " + std::strerror(err));
  }
  return FileLock(fd);
}

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

void WarnIfOpenToOthers(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 007) == 0) return;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  spdlog::warn(
      "{} {} is mode {}: other users of this host can {} it; it holds secrets, make "
      "it 0600 (or 0640)",
      what, path, mode, (st.st_mode & 002) ? "change" : "read");
}

}  // namespace onlineps
