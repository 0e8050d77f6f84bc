#include "mcp_bridge/state_dir.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/file_io.h"

namespace onlineps::bridge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kSuffix[] = ".json";
constexpr size_t kMaxRecordBytes = 1 << 20;  // a context is at most a few hundred KB

// Keys hold '/' and ':' (identity/kind:name); file names hold hex. Long keys keep a
// prefix and add a 64-bit hash of the whole key.
std::string FileName(const std::string& key) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : key) {
    hex += kHex[c >> 4];
    hex += kHex[c & 15];
  }
  if (hex.size() > 160) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
    hex.resize(128);
    hex += '-';
    for (int i = 60; i >= 0; i -= 4) hex += kHex[(h >> i) & 15];
  }
  return hex + kSuffix;
}

int64_t AgeMs(const fs::path& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0) return 0;
  const int64_t mtime_ms =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  return std::max<int64_t>(0, now_ms - mtime_ms);
}

}  // namespace

StatusOr<std::unique_ptr<StateDir>> StateDir::Open(StateDirOptions options,
                                                   const std::vector<std::string>& kinds) {
  if (options.path.empty()) return InvalidArgument("--state-dir: empty path");
  std::error_code ec;
  for (const std::string& kind : kinds) {
    const fs::path dir = fs::path(options.path) / kind;
    fs::create_directories(dir, ec);
    if (ec) {
      return InvalidArgument("--state-dir " + options.path + ": cannot create " + dir.string() +
                             ": " + ec.message());
    }
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      return InvalidArgument("--state-dir " + options.path + ": " + dir.string() +
                             " is not writable: " + std::strerror(errno));
    }
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".tmp") fs::remove(e.path(), ec);  // a crash mid-write
    }
  }
  return std::unique_ptr<StateDir>(new StateDir(std::move(options)));
}

std::string StateDir::FileOf(const std::string& kind, const std::string& key) const {
  return (fs::path(options_.path) / kind / FileName(key)).string();
}

std::vector<StateDir::Record> StateDir::Load(const std::string& kind) {
  std::vector<Record> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(options_.path) / kind, ec)) {
    const fs::path p = e.path();
    if (p.extension() != kSuffix) continue;
    std::string problem;
    Record r;
    std::ifstream in(p, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) {
      problem = "cannot read it";
    } else if (text.str().size() > kMaxRecordBytes) {
      problem = "it is larger than " + std::to_string(kMaxRecordBytes) + " bytes";
    } else {
      r.value = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
      if (r.value.is_discarded() || !r.value.is_object()) {
        problem = "it is not a JSON object";
      } else if (!r.value.contains("key") || !r.value["key"].is_string()) {
        problem = "it has no \"key\" string";
      } else {
        r.key = r.value["key"];
        if (FileName(r.key) != p.filename().string()) problem = "its key does not match its name";
      }
    }
    if (!problem.empty()) {
      fs::path bad = p;
      bad += ".bad";
      fs::rename(p, bad, ec);
      spdlog::warn("state: skipping {}: {} (moved to {})", p.string(), problem, bad.string());
      continue;
    }
    r.age_ms = AgeMs(p);
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(),
            [](const Record& a, const Record& b) { return a.age_ms < b.age_ms; });
  return out;
}

Status StateDir::Put(const std::string& kind, const std::string& key, json value) {
  value["key"] = key;
  Status s =
      WriteFileAtomic(FileOf(kind, key), value.dump(-1, ' ', false, json::error_handler_t::replace),
                      options_.fsync);
  if (!s.ok()) return s.WithContext("saving state under --state-dir " + options_.path);
  return s;
}

bool StateDir::Touch(const std::string& kind, const std::string& key) {
  return ::utimensat(AT_FDCWD, FileOf(kind, key).c_str(), nullptr, 0) == 0;
}

void StateDir::Remove(const std::string& kind, const std::string& key) {
  const std::string p = FileOf(kind, key);
  if (::unlink(p.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("state: cannot remove {}: {}", p, std::strerror(errno));
  }
}

}  // namespace onlineps::bridge
