#include "mcp_bridge/state_dir.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "common/file_io.h"
#include "common/hash.h"
#include "common/sha256.h"

namespace onlineps::bridge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kSuffix[] = ".json";
constexpr size_t kMaxRecordBytes = 1 << 20;  // a context is at most a few hundred KB
constexpr mode_t kFileMode = 0600;
constexpr mode_t kDirMode = 0700;

bool IsHash(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// How files were named before hashing: the key's hex (a long key kept a prefix and a
// 64-bit FNV-1a of the whole key). Only to check the records being converted.
std::string LegacyFileName(const std::string& key) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : key) {
    hex += kHex[c >> 4];
    hex += kHex[c & 15];
  }
  if (hex.size() > 160) {
    // Not FNV's offset basis (its last digit was lost), but what the old names used.
    const uint64_t h = Fnv1a64(key, 1469598103934665603ULL);
    hex.resize(128);
    hex += '-';
    for (int i = 60; i >= 0; i -= 4) hex += kHex[(h >> i) & 15];
  }
  return hex + kSuffix;
}

// A file name in a log line: old names hold a key, so only its start.
std::string Shown(const fs::path& p) {
  const std::string name = p.filename().string();
  return (p.parent_path() / (name.size() > 16 ? name.substr(0, 16) + "..." : name)).string();
}

std::string Octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

Status PathError(const std::string& dir, const std::string& what) {
  return InvalidArgument("--state-dir " + dir + ": " + what);
}

// DIR itself may be a volume's root that this user does not own (Kubernetes makes it
// root's, writable through fsGroup): then the kind folders keep others out.
Status OpenTop(const std::string& path) {
  fs::path top = fs::path(path).lexically_normal();
  if (!top.has_filename()) top = top.parent_path();  // "dir/"
  std::error_code ec;
  if (top.has_parent_path()) fs::create_directories(top.parent_path(), ec);  // errors show below
  if (::mkdir(top.c_str(), kDirMode) != 0 && errno != EEXIST) {
    return PathError(path, std::string("cannot create it: ") + std::strerror(errno));
  }
  struct stat st;
  if (::stat(top.c_str(), &st) != 0) return PathError(path, std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return PathError(path, "not a directory");
  if ((st.st_mode & 077) == 0) return Status::Ok();
  if (st.st_uid == ::geteuid()) {
    if (::chmod(top.c_str(), kDirMode) != 0) {
      return PathError(path, std::string("cannot set it to 0700: ") + std::strerror(errno));
    }
    spdlog::warn("state: --state-dir {} was {}, open to other users: set to 0700", path,
                 Octal(st.st_mode));
    return Status::Ok();
  }
  if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
    return PathError(path, "it is " + Octal(st.st_mode) + " and belongs to uid " +
                               std::to_string(st.st_uid) +
                               ": anyone may replace what is in it; use a directory of this user");
  }
  spdlog::warn(
      "state: --state-dir {} is {} and belongs to uid {}, not this user: left as it is; the "
      "records are in its 0700 folders",
      path, Octal(st.st_mode), st.st_uid);
  return Status::Ok();
}

Status OpenKind(const std::string& path, const fs::path& dir) {
  if (::mkdir(dir.c_str(), kDirMode) != 0 && errno != EEXIST) {
    return PathError(path, "cannot create " + dir.string() + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0)
    return PathError(path, dir.string() + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return PathError(path, dir.string() + " is not a directory");
  if (st.st_uid != ::geteuid()) {
    return PathError(path, dir.string() + " belongs to uid " + std::to_string(st.st_uid) +
                               ", not to this user (uid " + std::to_string(::geteuid()) +
                               "): it could read the records");
  }
  if (st.st_mode & 077) {
    if (::chmod(dir.c_str(), kDirMode) != 0) {
      return PathError(path, "cannot set " + dir.string() + " to 0700: " + std::strerror(errno));
    }
    spdlog::warn("state: {} was {}, open to other users: set to 0700", dir.string(),
                 Octal(st.st_mode));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return PathError(path, dir.string() + " is not writable: " + std::strerror(errno));
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".tmp") fs::remove(e.path(), ec);  // a crash mid-write
  }
  return Status::Ok();
}

int64_t AgeMs(const std::string& file) {
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) return 0;
  const int64_t mtime_ms =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  return std::max<int64_t>(0, now_ms - mtime_ms);
}

// The file's JSON object, or why there is none.
std::string ReadObject(const fs::path& p, json* value) {
  // Never through a link, never blocking (a FIFO), and never more than the limit: the
  // size is checked before anything is read.
  const int fd = ::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open it: ") + std::strerror(errno);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return "it is not a regular file";
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxRecordBytes) {
    ::close(fd);
    return "it is larger than " + std::to_string(kMaxRecordBytes) + " bytes";
  }
  std::string text(static_cast<size_t>(st.st_size) + 1, '\0');  // one more: it grew
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return "cannot read it";
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got > kMaxRecordBytes) {  // grew past the limit since fstat
    return "it is larger than " + std::to_string(kMaxRecordBytes) + " bytes";
  }
  text.resize(got);
  *value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value->is_discarded() || !value->is_object()) return "it is not a JSON object";
  return "";
}

// Whether a name is the hex of text, as names were before hashing. A session id's hex has
// a hash's length; 32 bytes of a hash are all printable once in about 10^14.
bool IsHexOfText(const std::string& name) {
  if (name.size() % 2 != 0 || name.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return false;
  }
  for (size_t i = 0; i < name.size(); i += 2) {
    const int byte = std::stoi(name.substr(i, 2), nullptr, 16);
    if (byte < 0x20 || byte > 0x7e) return false;
  }
  return true;
}

// Keeps an unreadable record for inspection; a file of the old format may hold a key in
// its name, so that one goes.
void SetAside(const fs::path& p, const std::string& problem) {
  std::error_code ec;
  const std::string name = p.stem().string();
  if (IsHash(name) && !IsHexOfText(name)) {
    fs::path bad = p;
    bad += ".bad";
    fs::rename(p, bad, ec);
    spdlog::warn("state: skipping {}: {} (moved to {})", p.string(), problem, bad.string());
  } else {
    fs::remove(p, ec);
    spdlog::warn("state: removed {}: {}", Shown(p), problem);
  }
}

}  // namespace

StatusOr<std::unique_ptr<StateDir>> StateDir::Open(StateDirOptions options,
                                                   const std::vector<std::string>& kinds) {
  if (options.path.empty()) return InvalidArgument("--state-dir: empty path");
  ONLINEPS_RETURN_IF_ERROR(OpenTop(options.path));
  // One bridge per directory: two would each rewrite the other's sessions and contexts.
  auto lock =
      FileLock::Acquire((fs::path(options.path) / "lock").string(), "--state-dir " + options.path);
  if (!lock.ok()) return lock.status();
  for (const std::string& kind : kinds) {
    ONLINEPS_RETURN_IF_ERROR(OpenKind(options.path, fs::path(options.path) / kind));
  }
  return std::unique_ptr<StateDir>(new StateDir(std::move(options), std::move(*lock)));
}

std::string StateDir::HashOf(const std::string& key) { return Sha256Hex(key); }

std::string StateDir::FileOf(const std::string& kind, const std::string& hash) const {
  return (fs::path(options_.path) / kind / (hash + kSuffix)).string();
}

std::string StateDir::Convert(const std::string& kind, const std::string& file, json* value) {
  const json key = (*value)["key"];
  if (!key.is_string() || LegacyFileName(key) != fs::path(file).filename().string()) {
    ::unlink(file.c_str());  // not kept aside: it holds a key
    spdlog::warn("state: removed {}: it holds a \"key\" that does not match its name", Shown(file));
    return "";
  }
  value->erase("key");
  const std::string hash = HashOf(key);
  struct stat st;
  const bool timed = ::stat(file.c_str(), &st) == 0;
  if (Status s = Put(kind, hash, *value); !s.ok()) {
    spdlog::warn("state: cannot convert {} (left for the next start): {}", Shown(file),
                 s.ToString());
    return "";
  }
  if (timed) {  // the idle limit goes on from the last use
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    ::utimensat(AT_FDCWD, FileOf(kind, hash).c_str(), times, 0);
  }
  ::unlink(file.c_str());  // lost in a host crash: converted again at the next start
  return hash;
}

std::vector<StateDir::Record> StateDir::Load(const std::string& kind) {
  std::vector<fs::path> files;  // listed first: converting adds files
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(options_.path) / kind, ec)) {
    if (e.path().extension() == kSuffix) files.push_back(e.path());
  }
  std::unordered_map<std::string, Record> records;  // a converted file may be listed too
  size_t converted = 0;
  for (const fs::path& p : files) {
    Record r;
    const std::string problem = ReadObject(p, &r.value);
    if (problem.empty() && r.value.contains("key")) {
      r.hash = Convert(kind, p.string(), &r.value);
      if (r.hash.empty()) continue;
      ++converted;
    } else if (!problem.empty() || !IsHash(p.stem().string())) {
      SetAside(p, problem.empty() ? "it is not named by a record hash" : problem);
      continue;
    } else {
      r.hash = p.stem().string();
    }
    r.age_ms = AgeMs(FileOf(kind, r.hash));
    records[r.hash] = std::move(r);
  }
  if (converted > 0) {
    spdlog::info("state: converted {} records in {}/ to hashed file names (an older bridge's)",
                 converted, kind);
  }
  std::vector<Record> out;
  out.reserve(records.size());
  for (auto& [hash, r] : records) out.push_back(std::move(r));
  std::sort(out.begin(), out.end(),
            [](const Record& a, const Record& b) { return a.age_ms < b.age_ms; });
  return out;
}

Status StateDir::Put(const std::string& kind, const std::string& hash, const json& value) {
  if (!IsHash(hash)) return InvalidArgument("state: a record is named by its key's hash");
  const std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kMaxRecordBytes) {
    // Load would set it aside: refused now rather than lost at the next start.
    return InvalidArgument("the record would be " + std::to_string(text.size()) +
                           " bytes, over the " + std::to_string(kMaxRecordBytes) +
                           " a restart reads (saving state under --state-dir " + options_.path +
                           ")");
  }
  Status s = WriteFileAtomic(FileOf(kind, hash), text, options_.fsync, kFileMode);
  if (!s.ok()) return s.WithContext("saving state under --state-dir " + options_.path);
  return s;
}

bool StateDir::Touch(const std::string& kind, const std::string& hash) {
  return IsHash(hash) && ::utimensat(AT_FDCWD, FileOf(kind, hash).c_str(), nullptr, 0) == 0;
}

void StateDir::Remove(const std::string& kind, const std::string& hash) {
  if (!IsHash(hash)) return;
  const std::string p = FileOf(kind, hash);
  if (::unlink(p.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("state: cannot remove {}: {}", p, std::strerror(errno));
  }
}

}  // namespace onlineps::bridge
