#include "common/admin_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/build_info.h"
#include "common/mutex.h"
#include "common/process_metrics.h"

namespace onlineps {
namespace {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// Keep in step with project(VERSION) in the top-level CMakeLists.txt.
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4";
constexpr char kTextContentType[] = "text/plain";
constexpr int kListenBacklog = 511;
constexpr int kMaxEvents = 64;
constexpr int kMaxAcceptsPerWake = 64;  // a connect flood cannot starve open connections
constexpr size_t kReadChunk = 4096;
// After a response that ends the connection, how long and how much input is drained.
constexpr auto kLingerTime = std::chrono::milliseconds(500);
constexpr size_t kMaxLingerBytes = 64 * 1024;
constexpr uint64_t kListenId = 0;  // epoll ids; connections count up from kFirstId
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kFirstId = 2;

std::string ErrnoText(int error) {
  return std::error_code(error, std::system_category()).message();
}

// ---- HTTP/1.1 request parsing (RFC 9112): GET/HEAD without a body is all we serve.

struct Request {
  std::string_view method;
  std::string_view path;  // without query or fragment
  int minor_version = 1;  // HTTP/1.<minor>
  bool keep_alive = true;
  bool has_body = false;
};

struct Parsed {
  enum Kind { kIncomplete, kRequest, kError } kind = kIncomplete;
  int error_status = 0;  // kError: 400, 431 or 505
  size_t length = 0;     // kRequest: bytes of the request line and headers
  Request request;       // kRequest: views into the parsed buffer
};

Parsed Error(int status) {
  Parsed p;
  p.kind = Parsed::kError;
  p.error_status = status;
  return p;
}

bool IsTokenChar(char c) {
  static constexpr std::string_view kSymbols = "!#$%&'*+-.^_`|~";
  return std::isalnum(static_cast<unsigned char>(c)) || kSymbols.find(c) != std::string_view::npos;
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar);
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string_view ChompCr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

// Offset just past the blank line that ends the headers, or npos. `scan_from` keeps
// where the first incomplete line starts, so a request trickling in is scanned once.
size_t FindHeadersEnd(std::string_view in, size_t* scan_from) {
  size_t pos = *scan_from;
  for (;;) {
    size_t nl = in.find('\n', pos);
    if (nl == std::string_view::npos) {
      *scan_from = pos;
      return std::string_view::npos;
    }
    if (pos > 0 && ChompCr(in.substr(pos, nl - pos)).empty()) return nl + 1;
    pos = nl + 1;
  }
}

// False once the bytes cannot begin a request line (e.g. a TLS handshake), so garbage
// is answered at once instead of at the deadline.
bool StartsLikeRequest(std::string_view in) {
  for (char c : in) {
    if (c == ' ') return true;
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// Path of an origin-form ("/metrics?x") or absolute-form ("http://h/metrics") target.
std::optional<std::string_view> TargetPath(std::string_view target) {
  if (target.front() != '/') {
    size_t scheme_end = target.find("://");
    if (target == "*") return target;
    if (scheme_end == std::string_view::npos ||
        !(EqualsIgnoreCase(target.substr(0, scheme_end), "http") ||
          EqualsIgnoreCase(target.substr(0, scheme_end), "https"))) {
      return std::nullopt;
    }
    size_t slash = target.find('/', scheme_end + 3);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  return target.substr(0, target.find_first_of("?#"));
}

// 0, or the status that answers a bad request line.
int ParseRequestLine(std::string_view line, Request* r) {
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return 400;
  }
  r->method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  bool bad_char = std::any_of(target.begin(), target.end(), [](char c) {
    return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f;
  });
  if (!IsToken(r->method) || target.empty() || bad_char) return 400;
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || !std::isdigit(version[5]) ||
      version[6] != '.' || !std::isdigit(version[7])) {
    return 400;
  }
  if (version[5] != '1') return 505;
  r->minor_version = version[7] == '0' ? 0 : 1;
  std::optional<std::string_view> path = TargetPath(target);
  if (!path) return 400;
  r->path = *path;
  return 0;
}

struct HeaderFacts {
  int hosts = 0;
  bool close = false;
  bool keep_alive = false;
  bool chunked_or_coded = false;  // any Transfer-Encoding
  std::optional<std::string_view> content_length;
};

// 0, or the status that answers a bad header line.
int NoteHeader(std::string_view line, HeaderFacts* f) {
  if (line.front() == ' ' || line.front() == '\t') return 400;  // obsolete line folding
  size_t colon = line.find(':');
  if (colon == std::string_view::npos || !IsToken(line.substr(0, colon))) return 400;
  std::string_view name = line.substr(0, colon);
  std::string_view value = TrimOws(line.substr(colon + 1));
  if (value.find_first_of(std::string_view("\r\0", 2)) != std::string_view::npos) return 400;
  if (EqualsIgnoreCase(name, "host")) {
    ++f->hosts;
  } else if (EqualsIgnoreCase(name, "connection")) {
    while (!value.empty()) {
      size_t comma = std::min(value.find(','), value.size());
      std::string_view option = TrimOws(value.substr(0, comma));
      f->close |= EqualsIgnoreCase(option, "close");
      f->keep_alive |= EqualsIgnoreCase(option, "keep-alive");
      value.remove_prefix(std::min(comma + 1, value.size()));
    }
  } else if (EqualsIgnoreCase(name, "content-length")) {
    bool digits = !value.empty() && value.find_first_not_of("0123456789") == std::string_view::npos;
    if (!digits || (f->content_length && *f->content_length != value)) return 400;
    f->content_length = value;
  } else if (EqualsIgnoreCase(name, "transfer-encoding")) {
    f->chunked_or_coded = true;
  }
  return 0;
}

// 0, or the status that answers bad headers. `block` holds the lines after the request line.
int ParseHeaders(std::string_view block, Request* r) {
  HeaderFacts f;
  for (;;) {
    size_t nl = block.find('\n');
    std::string_view line = ChompCr(block.substr(0, nl));
    if (line.empty()) break;
    if (int status = NoteHeader(line, &f)) return status;
    block.remove_prefix(nl + 1);
  }
  // RFC 9112 3.2: exactly one Host in HTTP/1.1; both framings at once is how requests
  // are smuggled past proxies.
  if (f.hosts > 1 || (r->minor_version == 1 && f.hosts == 0)) return 400;
  if (f.chunked_or_coded && f.content_length) return 400;
  r->has_body =
      f.chunked_or_coded ||
      (f.content_length && f.content_length->find_first_not_of('0') != std::string_view::npos);
  r->keep_alive = r->minor_version == 1 ? !f.close : f.keep_alive && !f.close;
  return 0;
}

Parsed ParseRequest(std::string_view in, size_t* scan_from, size_t max_header_bytes) {
  size_t end = FindHeadersEnd(in, scan_from);
  if (end == std::string_view::npos) {
    if (!StartsLikeRequest(in)) return Error(400);
    return in.size() > max_header_bytes ? Error(431) : Parsed{};
  }
  if (end > max_header_bytes) return Error(431);
  size_t nl = in.find('\n');
  Parsed p;
  if (int status = ParseRequestLine(ChompCr(in.substr(0, nl)), &p.request)) return Error(status);
  if (int status = ParseHeaders(in.substr(nl + 1, end - nl - 1), &p.request)) return Error(status);
  p.kind = Parsed::kRequest;
  p.length = end;
  return p;
}

// ---- Responses.

struct Response {
  int status = 200;
  std::string_view content_type = kTextContentType;
  std::string body;
  bool allow = false;  // 405: name the methods served
  bool close = false;  // the request's framing cannot be trusted past this response
};

Response Text(int status, std::string body) {
  Response res;
  res.status = status;
  res.body = std::move(body);
  return res;
}

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string ErrorBody(int status) {
  std::string body(ReasonPhrase(status));
  std::transform(body.begin(), body.end(), body.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return body + "\n";
}

// RFC 9110 6.6.1: an origin server with a clock sends Date.
std::string HttpDate() {
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[64];
  return std::string(text, std::strftime(text, sizeof(text), "%a, %d %b %Y %H:%M:%S GMT", &utc));
}

std::string Serialize(const Response& res, bool head, bool keep_alive, int minor_version) {
  std::string out = "HTTP/1.1 " + std::to_string(res.status) + " ";
  out.append(ReasonPhrase(res.status)).append("\r\nDate: ").append(HttpDate());
  out.append("\r\nContent-Type: ").append(res.content_type);
  out += "\r\nContent-Length: " + std::to_string(res.body.size()) + "\r\n";
  if (res.allow) out += "Allow: GET, HEAD\r\n";
  if (!keep_alive) {
    out += "Connection: close\r\n";
  } else if (minor_version == 0) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  if (!head) out += res.body;
  return out;
}

// ---- The server's own metrics.

// What a connection waits for; the first three end in a counted timeout.
enum Phase { kRequest, kIdle, kWrite, kLinger };
constexpr std::array<const char*, 3> kTimeoutReasons = {"request_deadline", "idle_timeout",
                                                        "write_deadline"};
enum Refusal { kPerAddress, kTotal, kFdLimit };
constexpr std::array<const char*, 3> kRefusalReasons = {"per_address_limit", "total_limit",
                                                        "fd_limit"};
constexpr std::array<int, 9> kStatuses = {200, 400, 404, 405, 413, 431, 500, 503, 505};

void RegisterBuildInfo(prometheus::Registry& registry) {
  try {
    prometheus::BuildGauge()
        .Name("onlineps_build_info")
        .Help("onlineps build metadata; the value is always 1")
        .Register(registry)
        .Add({{"version", BuildVersion()}, {"commit", BuildCommit()}})
        .Set(1);
  } catch (const std::exception& e) {  // a clashing family already in a shared registry
    spdlog::warn("admin server: cannot register onlineps_build_info: {}", e.what());
  }
}

// Families are shared by every server on one registry; all series exist from the start
// so that rate() and alerts see a 0 before the first event.
class AdminMetrics {
 public:
  explicit AdminMetrics(prometheus::Registry& registry) {
    try {
      Register(registry);
    } catch (const std::exception& e) {
      spdlog::warn("admin server: cannot register onlineps_admin_* metrics: {}", e.what());
      fallback_ = std::make_unique<prometheus::Registry>();
      Register(*fallback_);
    }
  }

  void Refused(Refusal why) { refused_[why]->Increment(); }
  void TimedOut(Phase phase) { timed_out_[phase]->Increment(); }
  void Opened() { open_->Increment(); }
  void Closed() { open_->Decrement(); }
  void Responded(int status) {
    auto it = responses_.find(status);
    if (it != responses_.end()) it->second->Increment();
  }

 private:
  void Register(prometheus::Registry& registry) {
    auto& refused = prometheus::BuildCounter()
                        .Name("onlineps_admin_connections_refused_total")
                        .Help("Admin connections closed at accept: a connection cap was reached")
                        .Register(registry);
    for (size_t i = 0; i < refused_.size(); ++i) {
      refused_[i] = &refused.Add({{"reason", kRefusalReasons[i]}});
    }
    auto& timed_out = prometheus::BuildCounter()
                          .Name("onlineps_admin_connections_timed_out_total")
                          .Help("Admin connections closed for a request, idle or write deadline")
                          .Register(registry);
    for (size_t i = 0; i < timed_out_.size(); ++i) {
      timed_out_[i] = &timed_out.Add({{"reason", kTimeoutReasons[i]}});
    }
    auto& responses = prometheus::BuildCounter()
                          .Name("onlineps_admin_requests_total")
                          .Help("Admin HTTP requests answered, by status code")
                          .Register(registry);
    for (int status : kStatuses) {
      responses_[status] = &responses.Add({{"code", std::to_string(status)}});
    }
    open_ = &prometheus::BuildGauge()
                 .Name("onlineps_admin_open_connections")
                 .Help("Admin HTTP connections open now")
                 .Register(registry)
                 .Add({});
  }

  std::unique_ptr<prometheus::Registry> fallback_;  // only when the shared one clashes
  std::array<prometheus::Counter*, 3> refused_{};
  std::array<prometheus::Counter*, 3> timed_out_{};
  std::map<int, prometheus::Counter*> responses_;
  prometheus::Gauge* open_ = nullptr;
};

// ---- Sockets.

// Per-address caps count an IPv6 client by its /64: one host usually owns a whole one.
std::string ClientKey(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    in6_addr a = reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr;
    if (!IN6_IS_ADDR_V4MAPPED(&a)) std::memset(a.s6_addr + 8, 0, 8);
    inet_ntop(AF_INET6, &a, text, sizeof(text));
  }
  return text;
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6&>(addr).sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in&>(addr).sin_port);
}

// SO_REUSEADDR allows a quick restart over TIME_WAIT sockets; no SO_REUSEPORT, which
// would let a second process bind the same port and silently take half the scrapes.
StatusOr<int> ListenOn(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const std::string where = host + ":" + std::to_string(port);
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints,
                       &found);
  if (rc != 0) return Unavailable("admin server cannot resolve " + where + ": " + gai_strerror(rc));
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, kListenBacklog) != 0) {
      error = ErrnoText(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return Unavailable("admin server cannot bind " + where + ": " + error);
  return fd;
}

Status CheckOptions(const AdminServerOptions& o) {
  if (o.request_deadline.count() <= 0 || o.idle_timeout.count() <= 0 ||
      o.write_deadline.count() <= 0) {
    return InvalidArgument("admin server deadlines and timeouts must be > 0");
  }
  if (o.max_connections == 0 || o.max_connections_per_address == 0 || o.max_header_bytes == 0) {
    return InvalidArgument("admin server connection caps and max_header_bytes must be > 0");
  }
  return Status::Ok();
}

Status RunCheck(const std::function<Status()>& check) {
  try {
    return check();
  } catch (const std::exception& e) {  // no exception may escape into the I/O loop
    return Internal(std::string("ready check threw: ") + e.what());
  }
}

struct Connection {
  uint64_t id = 0;
  int fd = -1;
  std::string client;  // ClientKey of the peer
  Phase phase = kRequest;
  TimePoint deadline;
  uint32_t events = 0;  // what epoll watches for
  std::string in;       // bytes of requests not answered yet
  size_t scan_from = 0;
  bool peer_closed = false;
  std::string out;  // the response being written
  size_t sent = 0;
  bool close_after_write = false;
  size_t drained = 0;  // input discarded while lingering
};

}  // namespace

class AdminServer::Impl {
 public:
  Impl(std::shared_ptr<prometheus::Registry> registry, AdminServerOptions options)
      : registry_(registry ? std::move(registry) : std::make_shared<prometheus::Registry>()),
        options_(options),
        metrics_(*registry_) {
    RegisterBuildInfo(*registry_);
  }
  ~Impl() { CloseFds(); }

  StatusOr<int> Start(const std::string& host, int port);
  void Stop();

  void SetReadyCheck(std::function<Status()> check) {
    MutexLock lock(&mu_);
    ready_check_ = std::move(check);
  }

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  Status SetUpLoop();
  void CloseFds();
  void Loop();
  int NextTimeoutMs() const;
  void Accept();
  void Admit(int fd, const sockaddr_storage& addr);
  void Refuse(int fd, Refusal why);
  void ShedAtFdLimit();
  void OnEvent(uint64_t id);
  bool ReadInput(Connection& c);
  bool Flush(Connection& c);
  void Serve(Connection& c);
  void Linger(Connection& c);
  void Drain(Connection& c);
  void Respond(Connection& c, const Parsed& parsed);
  Response Route(const Request& r);
  Response Metrics() const;
  Response Ready();
  void SetPhase(Connection& c, Phase phase);
  void Watch(Connection& c, uint32_t events);
  void Close(Connection& c);
  void ExpireDeadlines();

  std::chrono::milliseconds Limit(Phase phase) const {
    switch (phase) {
      case kRequest:
        return options_.request_deadline;
      case kIdle:
        return options_.idle_timeout;
      case kWrite:
        return options_.write_deadline;
      case kLinger:
        return kLingerTime;
    }
    return kLingerTime;
  }

  // Immutable after construction.
  const std::shared_ptr<prometheus::Registry> registry_;
  const AdminServerOptions options_;
  AdminMetrics metrics_;

  // Set by Start, closed by Stop (owning thread); used by the I/O thread in between.
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int spare_fd_ = -1;  // given up to shed a connection when out of descriptors
  bool started_ = false;
  std::thread thread_;

  // I/O thread only.
  uint64_t next_id_ = kFirstId;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::unordered_map<std::string, size_t> open_per_client_;
  std::set<std::pair<TimePoint, uint64_t>> deadlines_;  // one per connection

  Mutex mu_;
  std::function<Status()> ready_check_ GUARDED_BY(mu_);
};

StatusOr<int> AdminServer::Impl::Start(const std::string& host, int port) {
  if (started_) return FailedPrecondition("admin server already started");
  if (port < 0 || port > 65535) {
    return InvalidArgument("admin port must be in [0, 65535], got " + std::to_string(port));
  }
  ONLINEPS_RETURN_IF_ERROR(CheckOptions(options_));
  StatusOr<int> fd = ListenOn(host, port);
  if (!fd.ok()) return fd.status();
  listen_fd_ = *fd;
  if (Status st = SetUpLoop(); !st.ok()) {
    CloseFds();
    return st;
  }
  started_ = true;
  thread_ = std::thread([this] {
    try {
      Loop();
    } catch (const std::exception& e) {  // e.g. bad_alloc: stop serving, keep the process
      spdlog::error("admin server stopped: {}", e.what());
    }
  });
  return BoundPort(listen_fd_);
}

Status AdminServer::Impl::SetUpLoop() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return Internal("admin server: epoll_create1: " + ErrnoText(errno));
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Internal("admin server: eventfd: " + ErrnoText(errno));
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  for (auto [fd, id] : {std::pair<int, uint64_t>{listen_fd_, kListenId}, {wake_fd_, kWakeId}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return Internal("admin server: epoll_ctl: " + ErrnoText(errno));
    }
  }
  return Status::Ok();
}

void AdminServer::Impl::CloseFds() {
  for (int* fd : {&listen_fd_, &epoll_fd_, &wake_fd_, &spare_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void AdminServer::Impl::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("admin server: cannot wake the I/O thread: {}", ErrnoText(errno));
  }
  thread_.join();
  while (!connections_.empty()) Close(*connections_.begin()->second);
  CloseFds();
}

void AdminServer::Impl::Loop() {
  std::array<epoll_event, kMaxEvents> events;
  for (;;) {
    int n = epoll_wait(epoll_fd_, events.data(), kMaxEvents, NextTimeoutMs());
    if (n < 0 && errno != EINTR) {
      spdlog::error("admin server stopped: epoll_wait: {}", ErrnoText(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kWakeId) return;
      if (id == kListenId) {
        Accept();
      } else {
        OnEvent(id);
      }
    }
    ExpireDeadlines();
  }
}

int AdminServer::Impl::NextTimeoutMs() const {
  if (deadlines_.empty()) return -1;
  auto wait = deadlines_.begin()->first - Clock::now();
  if (wait.count() <= 0) return 0;
  // Rounded up: waking before the deadline would spin until it passes.
  return static_cast<int>(std::min<int64_t>(
      std::chrono::ceil<std::chrono::milliseconds>(wait).count(), 24 * 3600 * 1000));
}

void AdminServer::Impl::ExpireDeadlines() {
  const TimePoint now = Clock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    auto it = connections_.find(deadlines_.begin()->second);
    if (it == connections_.end()) {  // cannot happen: Close erases the deadline
      deadlines_.erase(deadlines_.begin());
      continue;
    }
    if (it->second->phase != kLinger) metrics_.TimedOut(it->second->phase);
    Close(*it->second);
  }
}

void AdminServer::Impl::Accept() {
  for (int i = 0; i < kMaxAcceptsPerWake; ++i) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd =
        accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      Admit(fd, addr);
    } else if (errno == EMFILE || errno == ENFILE) {
      ShedAtFdLimit();
    } else if (errno != EINTR && errno != ECONNABORTED) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        spdlog::warn("admin server: accept: {}", ErrnoText(errno));
      }
      return;
    }
  }
}

void AdminServer::Impl::Admit(int fd, const sockaddr_storage& addr) {
  std::string client = ClientKey(addr);
  if (connections_.size() >= options_.max_connections) return Refuse(fd, kTotal);
  auto open = open_per_client_.find(client);
  if (open != open_per_client_.end() && open->second >= options_.max_connections_per_address) {
    return Refuse(fd, kPerAddress);
  }
  // Pipelined responses are written back to back; Nagle would hold the second for the
  // client's delayed ACK.
  int yes = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  auto c = std::make_unique<Connection>();
  c->id = next_id_++;
  c->fd = fd;
  c->events = EPOLLIN;
  epoll_event ev{};
  ev.events = c->events;
  ev.data.u64 = c->id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    spdlog::warn("admin server: epoll_ctl: {}", ErrnoText(errno));
    close(fd);
    return;
  }
  ++open_per_client_[client];
  c->client = std::move(client);
  metrics_.Opened();
  SetPhase(*c, kRequest);  // the request deadline runs from accept
  connections_.emplace(c->id, std::move(c));
}

void AdminServer::Impl::Refuse(int fd, Refusal why) {
  metrics_.Refused(why);  // before the client can see the answer
  const std::string res = Serialize(Text(503, "too many connections\n"), false, false, 1);
  // Best effort: a fresh socket's buffer holds it, unless the client is gone already.
  (void)send(fd, res.data(), res.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
}

// Out of descriptors, a pending connection keeps the listening socket readable and would
// spin the loop: the spare descriptor makes room to accept it and close it.
void AdminServer::Impl::ShedAtFdLimit() {
  if (spare_fd_ >= 0) close(spare_fd_);
  int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) close(fd);
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  metrics_.Refused(kFdLimit);
}

void AdminServer::Impl::OnEvent(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;  // closed earlier in this batch
  Connection& c = *it->second;
  if (c.phase == kLinger) return Drain(c);
  if (c.out.empty() && !ReadInput(c)) return Close(c);
  Serve(c);
}

// Reads what the socket holds, up to one byte past the header cap (enough to answer
// 431). False when the connection failed.
bool AdminServer::Impl::ReadInput(Connection& c) {
  char buf[kReadChunk];
  while (!c.peer_closed && c.in.size() <= options_.max_header_bytes) {
    size_t room = options_.max_header_bytes + 1 - c.in.size();
    ssize_t n = recv(c.fd, buf, std::min(room, sizeof(buf)), 0);
    if (n > 0) {
      if (c.phase == kIdle) SetPhase(c, kRequest);  // a new request's first byte
      c.in.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      c.peer_closed = true;
    } else if (errno != EINTR) {
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
  }
  return true;
}

bool AdminServer::Impl::Flush(Connection& c) {
  while (c.sent < c.out.size()) {
    ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n >= 0) {
      c.sent += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
  }
  return true;
}

// Answers the buffered requests in order, one at a time: the next one is parsed only
// once the last response is fully sent, so a pipelining client that does not read holds
// one response, and reading stops until it drains.
void AdminServer::Impl::Serve(Connection& c) {
  for (;;) {
    if (!c.out.empty()) {
      if (!Flush(c)) return Close(c);
      if (c.sent < c.out.size()) return Watch(c, EPOLLOUT);
      std::string().swap(c.out);  // an idle connection keeps no /metrics copy
      c.sent = 0;
      if (c.close_after_write) return Linger(c);
      SetPhase(c, c.in.empty() ? kIdle : kRequest);
    }
    if (c.scan_from == 0) {  // RFC 9112 2.2: ignore blank lines before a request
      c.in.erase(0, std::min(c.in.find_first_not_of("\r\n"), c.in.size()));
    }
    Parsed parsed;
    if (!c.in.empty()) parsed = ParseRequest(c.in, &c.scan_from, options_.max_header_bytes);
    if (parsed.kind == Parsed::kIncomplete) {
      if (c.peer_closed) return Close(c);
      return Watch(c, EPOLLIN);
    }
    Respond(c, parsed);
  }
}

// Closing with unread input makes the kernel send RST, which can destroy the response
// before the client reads it; so half-close and drain for a moment first, as nginx's
// lingering_close and Go's net/http do.
void AdminServer::Impl::Linger(Connection& c) {
  if (c.peer_closed) return Close(c);
  shutdown(c.fd, SHUT_WR);
  std::string().swap(c.in);
  SetPhase(c, kLinger);
  Watch(c, EPOLLIN);
}

void AdminServer::Impl::Drain(Connection& c) {
  char buf[kReadChunk];
  for (;;) {
    ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0 && c.drained + static_cast<size_t>(n) <= kMaxLingerBytes) {
      c.drained += static_cast<size_t>(n);
    } else if (n >= 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
      return Close(c);  // EOF, an error, or a client that keeps sending
    } else if (errno != EINTR) {
      return;
    }
  }
}

void AdminServer::Impl::Respond(Connection& c, const Parsed& parsed) {
  Response res;
  bool head = false;
  bool keep_alive = false;
  int minor_version = 1;
  if (parsed.kind == Parsed::kError) {
    res = Text(parsed.error_status, ErrorBody(parsed.error_status));
  } else {
    const Request& r = parsed.request;
    res = Route(r);
    head = r.method == "HEAD";
    keep_alive = r.keep_alive && !res.close;
    minor_version = r.minor_version;
  }
  c.out = Serialize(res, head, keep_alive, minor_version);
  c.close_after_write = !keep_alive;
  // After an error the rest of the input cannot be framed: drop it.
  c.in.erase(0, keep_alive ? parsed.length : c.in.size());
  c.scan_from = 0;
  metrics_.Responded(res.status);
  SetPhase(c, kWrite);
}

Response AdminServer::Impl::Route(const Request& r) {
  if (r.method != "GET" && r.method != "HEAD") {
    Response res = Text(405, ErrorBody(405));
    res.allow = true;
    res.close = r.has_body;  // the body is not read, so nothing after it can be framed
    return res;
  }
  if (r.has_body) {
    Response res = Text(413, "no endpoint takes a request body\n");
    res.close = true;
    return res;
  }
  if (r.path == "/livez" || r.path == "/healthz") return Text(200, "ok\n");
  if (r.path == "/readyz") return Ready();
  if (r.path == "/metrics") return Metrics();
  return Text(404, ErrorBody(404));
}

Response AdminServer::Impl::Metrics() const {
  try {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    for (auto& f : ProcessFamilies(SampleProcess())) families.push_back(std::move(f));
    Response res = Text(200, prometheus::TextSerializer().Serialize(families));
    res.content_type = kMetricsContentType;
    return res;
  } catch (const std::exception& e) {
    return Text(500, std::string("metrics: ") + e.what() + "\n");
  }
}

Response AdminServer::Impl::Ready() {
  std::function<Status()> check;
  {
    MutexLock lock(&mu_);
    check = ready_check_;  // run it unlocked: a slow check must not block SetReadyCheck
  }
  Status status = check ? RunCheck(check) : Status::Ok();
  if (status.ok()) return Text(200, "ready\n");
  return Text(503, status.ToString() + "\n");
}

void AdminServer::Impl::SetPhase(Connection& c, Phase phase) {
  deadlines_.erase({c.deadline, c.id});
  c.phase = phase;
  c.deadline = Clock::now() + Limit(phase);
  deadlines_.emplace(c.deadline, c.id);
}

void AdminServer::Impl::Watch(Connection& c, uint32_t events) {
  if (c.events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = c.id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) != 0) return Close(c);
  c.events = events;
}

// Invalidates `c`.
void AdminServer::Impl::Close(Connection& c) {
  deadlines_.erase({c.deadline, c.id});
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
  auto open = open_per_client_.find(c.client);
  if (open != open_per_client_.end() && --open->second == 0) open_per_client_.erase(open);
  metrics_.Closed();
  connections_.erase(c.id);
}

AdminServer::AdminServer(std::shared_ptr<prometheus::Registry> registry, AdminServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(registry), options)) {}

AdminServer::~AdminServer() { Stop(); }

StatusOr<int> AdminServer::Start(const std::string& host, int port) {
  return impl_->Start(host, port);
}

void AdminServer::Stop() { impl_->Stop(); }

void AdminServer::SetReadyCheck(std::function<Status()> check) {
  impl_->SetReadyCheck(std::move(check));
}

const std::shared_ptr<prometheus::Registry>& AdminServer::registry() const {
  return impl_->registry();
}

}  // namespace onlineps
