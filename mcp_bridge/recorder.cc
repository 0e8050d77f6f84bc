#include "mcp_bridge/recorder.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

namespace onlineps::bridge {

using nlohmann::json;

namespace {

int64_t SteadyUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t UnixUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string RunId() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

}  // namespace

StatusOr<std::unique_ptr<Recorder>> Recorder::Open(const std::string& path, uint64_t max_bytes,
                                                   const json& header_fields) {
  // 0600 whatever the umask, and never through a symbolic link: the trace holds every
  // call's arguments (contexts included), and a link planted at the path would have the
  // bridge overwrite whatever it points to.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Unavailable("--record " + path + ": " + std::strerror(errno) +
                       (errno == ELOOP ? " (it is a symbolic link; give the file itself)" : ""));
  }
  if (::fchmod(fd, 0600) != 0) {  // an existing file keeps its mode through O_CREAT
    const int err = errno;
    ::close(fd);
    return Unavailable("--record " + path + ": cannot make it 0600: " + std::strerror(err));
  }
  std::FILE* f = ::fdopen(fd, "w");
  if (!f) {
    const int err = errno;
    ::close(fd);
    return Unavailable("--record " + path + ": " + std::strerror(err));
  }
  std::unique_ptr<Recorder> r(new Recorder(f, path, max_bytes));
  json header = header_fields.is_object() ? header_fields : json::object();
  header["kind"] = "header";
  header["format"] = "onlineps-trace";
  header["format_version"] = 1;
  header["run_id"] = RunId();
  header["source"] = "mcp_bridge";
  header["clock"] = {{"t_us", "microseconds since start_unix_us (monotonic)"},
                     {"latency_us", "microseconds"},
                     {"wait_us", "microseconds"},
                     {"run_us", "microseconds"}};
  header["start_unix_us"] = UnixUs();
  MutexLock lock(&r->mu_);
  // replace: a worker's labels and table names are bytes the bridge did not check as UTF-8.
  if (!r->WriteLine(header.dump(-1, ' ', false, json::error_handler_t::replace))) {
    return Unavailable("--record " + path + ": write failed");
  }
  return r;
}

Recorder::Recorder(std::FILE* f, std::string path, uint64_t max_bytes)
    : path_(std::move(path)), max_bytes_(max_bytes), file_(f), start_us_(SteadyUs()) {}

Recorder::~Recorder() {
  MutexLock lock(&mu_);
  if (file_) std::fclose(file_);
}

bool Recorder::WriteLine(const std::string& line) {
  if (!file_) return false;
  if (bytes_ + line.size() + 1 > max_bytes_) {
    spdlog::warn("recorder: {} reached --record-max-bytes ({}); recording stopped", path_,
                 max_bytes_);
    std::fclose(file_);
    file_ = nullptr;
    return false;
  }
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() ||
      std::fputc('\n', file_) == EOF || std::fflush(file_) != 0) {
    spdlog::error("recorder: writing {} failed ({}); recording stopped", path_,
                  std::strerror(errno));
    std::fclose(file_);
    file_ = nullptr;
    return false;
  }
  bytes_ += line.size() + 1;
  return true;
}

void Recorder::Record(const TraceRecord& r) {
  json rec = {{"kind", "call"},
              {"t_us", (r.end_steady_us ? r.end_steady_us : SteadyUs()) - start_us_},
              {"session", r.session},
              {"tool", r.tool},
              {"arguments", r.arguments},
              {"is_error", r.is_error},
              {"summary", r.summary},
              {"worker", r.worker},
              {"version", r.version},
              {"tau", r.tau},
              {"latency_us", r.latency_us},
              {"wait_us", r.wait_us},
              {"run_us", r.run_us}};
  MutexLock lock(&mu_);
  if (!file_) return;
  rec["seq"] = ++seq_;
  WriteLine(rec.dump(-1, ' ', false, json::error_handler_t::replace));
}

uint64_t Recorder::records() const {
  MutexLock lock(&mu_);
  return seq_;
}

}  // namespace onlineps::bridge
