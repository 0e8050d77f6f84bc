#include "common/zmq_transport.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "common/inline_request.h"

// libzmq calls getpid() each time a socket's thread and a ZeroMQ I/O thread signal each
// other (a check for use after fork), several times per message, and glibc (since 2.25)
// makes every call a system call. On this project's paravirtualized machines that was 4%
// of a learn's CPU in the worker and shard processes (perf, 2026-12-06). Every program
// that links this file defines getpid itself, so libzmq and all other callers in the
// process get it from a cache, which the child of a fork() refreshes before returning
// (pthread_atfork). A child made by vfork or clone shares or bypasses it and must exec
// (or _exit) without asking, as posix_spawn's does.
namespace {
std::atomic<pid_t> g_cached_pid{0};

pid_t PidFromKernel() { return static_cast<pid_t>(::syscall(SYS_getpid)); }

void RefreshCachedPid() { g_cached_pid.store(PidFromKernel(), std::memory_order_relaxed); }

// Before main (and before any thread): the cache, and its refresh in fork children.
const bool g_pid_cache_ready = [] {
  RefreshCachedPid();
  return ::pthread_atfork(nullptr, nullptr, &RefreshCachedPid) == 0;
}();
}  // namespace

extern "C" pid_t getpid(void) noexcept {
  const pid_t pid = g_cached_pid.load(std::memory_order_relaxed);
  return pid != 0 && g_pid_cache_ready ? pid : PidFromKernel();
}

namespace onlineps {
Status FromZmqError(const std::string& what, const zmq::error_t& e) {
  std::string message = what + ": " + e.what();
  switch (e.num()) {
    case EINVAL:
    case EPROTONOSUPPORT:
    case ENOCOMPATPROTO:
      return InvalidArgument(std::move(message));
    case EADDRINUSE:
      return AlreadyExists(std::move(message));
    default:
      return Unavailable(std::move(message));
  }
}

namespace {

// Messages moved per socket per poll round, so a flood on one socket cannot starve
// the other direction.
constexpr size_t kBatch = 256;
// Poll wakes at least this often and then reads every socket, even if a wake-up was
// lost (it never should be: see Readable).
constexpr std::chrono::milliseconds kPollFallback{200};
// How long a stopped server's ROUTER keeps sending the replies queued before Stop.
constexpr int kStopLingerMs = 5000;
// Most frames in one message: each costs ~100 bytes of memory whatever its size (an
// empty frame is 2 bytes on the wire), so a message of millions of empty frames would
// take gigabytes. The frames of a longer message past this many are read and dropped.
constexpr size_t kMaxFramesPerMessage = 4096;

// One object per process, made on first use and never destroyed. A forked child gets its
// own: ZeroMQ contexts (and the threads behind them) do not survive fork().
template <typename T>
T& PerProcess() {
  static Mutex mu;
  static T* object = nullptr;
  static pid_t owner = 0;
  MutexLock lock(&mu);
  if (object == nullptr || owner != getpid()) {
    owner = getpid();
    object = new T();  // the parent's copy is left alone: its threads are not in this child
  }
  return *object;
}

// One context for the whole process, so inproc:// endpoints connect across transports.
// Never destroyed: zmq_ctx_term would block exit on any socket still open.
zmq::context_t& SharedContext() { return PerProcess<zmq::context_t>(); }

std::string NextPipeName(const char* kind) {
  static std::atomic<uint64_t> counter{0};
  return std::string("inproc://onlineps-") + kind + "-" + std::to_string(counter.fetch_add(1));
}

void LogError(const char* where, const std::exception& e) {
  std::fprintf(stderr, "onlineps: zmq transport: %s: %s\n", where, e.what());
}

// Hands the frame's bytes to ZeroMQ without copying; ZeroMQ keeps the holder alive
// until the bytes are written (the free function runs on whichever thread lets go last).
zmq::message_t ToMessage(const Frame& frame) {
  if (frame.empty()) return zmq::message_t();
  auto hint = std::make_unique<std::shared_ptr<const void>>(frame.holder());
  auto free_holder = [](void*, void* h) { delete static_cast<std::shared_ptr<const void>*>(h); };
  zmq::message_t message(const_cast<char*>(frame.data()), frame.size(), free_holder, hint.get());
  hint.release();  // owned by `message` now
  return message;
}

// The parts of one message: the frames, not copied, after an optional routing part (a
// ROUTER's peer identity).
std::vector<zmq::message_t> ToParts(const std::string* route, const Frames& frames) {
  std::vector<zmq::message_t> parts;
  parts.reserve(frames.size() + 1);
  if (route != nullptr) parts.emplace_back(route->data(), route->size());
  for (const Frame& frame : frames) parts.push_back(ToMessage(frame));
  return parts;
}

Frame AlignedCopy(const void* data, size_t size) {
  auto words = std::make_shared<std::vector<uint64_t>>((size + 7) / 8);
  std::memcpy(words->data(), data, size);
  return Frame(words, reinterpret_cast<const char*>(words->data()), size);
}

// Wraps a received message without copying, except when the decoder left it at an
// unaligned offset of its batch buffer: Frame::As<T> promises 8-byte alignment.
Frame ToFrame(zmq::message_t&& message) {
  if (message.size() == 0) return Frame();
  auto holder = std::make_shared<zmq::message_t>(std::move(message));
  if (reinterpret_cast<uintptr_t>(holder->data()) % 8 != 0) {
    return AlignedCopy(holder->data(), holder->size());
  }
  return Frame(holder, holder->data<char>(), holder->size());
}

// Receives one whole multipart message without blocking; false when none is waiting.
// Parts past `max_parts` are read and dropped.
bool RecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* parts,
                   size_t max_parts = SIZE_MAX) {
  parts->clear();
  bool more = true;
  while (more) {
    zmq::message_t part;
    if (!socket.recv(part, zmq::recv_flags::dontwait)) return !parts->empty();
    more = part.more();
    if (parts->size() < max_parts) parts->push_back(std::move(part));
  }
  return true;
}

// Sends parts[first..] as one message without blocking; false when the socket is at
// its high-water mark. Only the first part can hit it (ZeroMQ counts whole messages).
bool SendParts(zmq::socket_t& socket, std::vector<zmq::message_t>* parts, size_t first) {
  for (size_t i = first; i < parts->size(); ++i) {
    auto flags = zmq::send_flags::dontwait;
    if (i + 1 < parts->size()) flags = flags | zmq::send_flags::sndmore;
    if (!socket.send((*parts)[i], flags)) return false;
  }
  return true;
}

// Whether a message waits on `socket`. Processes the socket's pending commands, so a
// caller that finds one must make sure the I/O thread reads it (ZmqWakeup).
bool Readable(zmq::socket_t& socket) {
  return (socket.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
}

void ApplyNetworkOptions(zmq::socket_t& socket, const TransportOptions& options) {
  socket.set(zmq::sockopt::sndhwm, options.send_hwm);
  socket.set(zmq::sockopt::rcvhwm, options.recv_hwm);
  socket.set(zmq::sockopt::linger, static_cast<int>(options.linger.count()));
  const bool fits = options.max_message_bytes <= uint64_t{std::numeric_limits<int64_t>::max()};
  socket.set(zmq::sockopt::maxmsgsize, fits ? static_cast<int64_t>(options.max_message_bytes) : -1);
}

// Runs one round of an I/O loop so that nothing unwinds the thread; returns whether the
// loop goes on. Errors are logged, and the loop survives them unless it was exiting.
template <typename Round>
bool RunGuarded(const char* where, bool exiting, Round round) {
  try {
    return round();
  } catch (const zmq::error_t& e) {
    LogError(where, e);
    return !exiting && e.num() != ETERM;
  } catch (const std::exception& e) {  // e.g. bad_alloc
    LogError(where, e);
    return !exiting;
  } catch (...) {
    std::fprintf(stderr, "onlineps: zmq transport: %s: unknown exception\n", where);
    return !exiting;
  }
}

// The process's ZAP handler (ZeroMQ RFC 27): ZeroMQ asks it about every CURVE client
// before the handshake completes. A server with an allow list registers it under its
// own ZAP domain; a CURVE server without one uses the empty domain, where every client
// that completed the key exchange is accepted. Started on first use, never stopped (like
// the shared context).
class ZapHandler {
 public:
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;
  static ZapHandler& Get() { return PerProcess<ZapHandler>(); }
  std::string Register(const std::vector<std::string>& allowed) {
    MutexLock lock(&mu_);
    const std::string domain = "onlineps-" + std::to_string(next_++);
    domains_[domain] = std::set<std::string>(allowed.begin(), allowed.end());
    return domain;
  }
  void Unregister(const std::string& domain) {
    MutexLock lock(&mu_);
    domains_.erase(domain);
  }

 private:
  template <typename T>
  friend T& PerProcess();
  ZapHandler() {
    // Bound before any CURVE socket exists, so no handshake can skip it.
    rep_ = zmq::socket_t(SharedContext(), zmq::socket_type::rep);
    rep_.set(zmq::sockopt::linger, 0);
    rep_.bind("inproc://zeromq.zap.01");
    std::thread([this] { Loop(); }).detach();
  }

  void Loop() {
    while (true) {
      std::vector<zmq::message_t> req;
      try {
        do {
          req.emplace_back();
          if (!rep_.recv(req.back())) req.pop_back();
        } while (!req.empty() && req.back().more());
        if (req.empty()) continue;
        while (req.size() < 6) req.emplace_back();  // malformed: refused, but REP must reply
        const std::string domain = req[2].to_string(), address = req[3].to_string();
        const std::string mechanism = req[5].to_string();
        std::string key;
        if (mechanism == "CURVE" && req.size() >= 7 && req[6].size() == 32) {
          char z85[41];
          zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
          key = z85;
        }
        const bool ok = Allowed(domain, mechanism, key);
        if (!ok) Refused(address, key);
        const char* code = ok ? "200" : "400";
        const char* text = ok ? "OK" : "client key not allowed";
        rep_.send(zmq::buffer(std::string("1.0")), zmq::send_flags::sndmore);
        rep_.send(req[1], zmq::send_flags::sndmore);
        rep_.send(zmq::buffer(code, 3), zmq::send_flags::sndmore);
        rep_.send(zmq::buffer(text, std::strlen(text)), zmq::send_flags::sndmore);
        // The user id is the client's key: messages from it carry it as "User-Id", so a
        // server can tell which key sent a request (Incoming::client_key).
        rep_.send(zmq::buffer(ok ? key : std::string()), zmq::send_flags::sndmore);
        rep_.send(zmq::message_t(), zmq::send_flags::none);
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) return;
        LogError("zap handler", e);
      }
    }
  }

  bool Allowed(const std::string& domain, const std::string& mechanism, const std::string& key) {
    if (mechanism != "CURVE") return mechanism == "NULL";
    if (domain.empty()) return true;  // a CURVE server without an allow list
    MutexLock lock(&mu_);
    auto it = domains_.find(domain);
    return it != domains_.end() && it->second.count(key) > 0;
  }

  // Bounded: the first 10 refusals, then every 1000th.
  void Refused(const std::string& address, const std::string& key) {
    const uint64_t n = ++refused_;
    if (n <= 10 || n % 1000 == 0) {
      spdlog::warn("refused a CURVE client from {} with key {} (not in --curve-allow; {} refused)",
                   address, key.empty() ? "?" : key, n);
    }
  }

  zmq::socket_t rep_;
  Mutex mu_;
  std::map<std::string, std::set<std::string>> domains_;
  uint64_t next_ = 0;
  std::atomic<uint64_t> refused_{0};
};

// CURVE on a network socket; throws zmq::error_t. Returns the ZAP domain registered.
std::string ApplyCurve(zmq::socket_t& socket, const CurveOptions& c, bool server) {
  if (!c.enabled()) return "";
  if (server) {
    ZapHandler& zap = ZapHandler::Get();
    socket.set(zmq::sockopt::curve_server, true);
    socket.set(zmq::sockopt::curve_secretkey, c.secret_key);
    if (c.allowed_clients.empty()) return "";
    const std::string domain = zap.Register(c.allowed_clients);
    socket.set(zmq::sockopt::zap_domain, domain);
    return domain;
  }
  socket.set(zmq::sockopt::curve_serverkey, c.server_public_key);
  socket.set(zmq::sockopt::curve_publickey, c.public_key);
  socket.set(zmq::sockopt::curve_secretkey, c.secret_key);
  return "";
}

void CloseQuietly(zmq::socket_t* socket) {
  try {
    socket->close();
  } catch (const zmq::error_t& e) {
    LogError("close", e);
  }
}

}  // namespace

ZmqWakeup::ZmqWakeup() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) throw zmq::error_t();
}

ZmqWakeup::~ZmqWakeup() { close(fd_); }

void ZmqWakeup::Wake() {
  const uint64_t one = 1;
  // Fails only when the counter is near 2^64 - 1: the I/O thread is then awake anyway.
  (void)!write(fd_, &one, sizeof(one));
}

void ZmqWakeup::Drain() {
  uint64_t count;
  (void)!read(fd_, &count, sizeof(count));
}

// ---------------------------------------------------------------------------- server

ZmqServerTransport::ZmqServerTransport(const TransportOptions& options) : options_(options) {}

ZmqServerTransport::~ZmqServerTransport() { Stop(); }

uint64_t ZmqServerTransport::dropped() const { return pool_ ? pool_->dropped() : 0; }

StatusOr<std::string> ZmqServerTransport::Start(const std::string& endpoint, Handler handler) {
  MutexLock lock(&lifecycle_mu_);
  if (state_ != State::kNew) return FailedPrecondition("server transport already started");
  if (!handler) return InvalidArgument("server transport needs a handler");
  // Binding on the caller's thread reports bind errors directly; the I/O thread then
  // reads the socket under router_.mu (the mutex is the barrier ZeroMQ asks for).
  StatusOr<std::string> bound = BindSockets(endpoint);
  if (!bound.ok()) return bound.status();
  pool_ = std::make_unique<HandlerPool<Incoming>>(
      "zmq server", options_.handler_threads, options_.max_queue_per_thread, std::move(handler));
  {
    MutexLock send_lock(&router_.mu);
    router_.open = true;
  }
  io_thread_ = std::thread(&ZmqServerTransport::IoLoop, this);
  state_ = State::kRunning;
  return bound;
}

StatusOr<std::string> ZmqServerTransport::BindSockets(const std::string& endpoint) {
  MutexLock lock(&router_.mu);
  zmq::socket_t& router = router_.socket;
  try {
    wakeup_ = std::make_unique<ZmqWakeup>();
    router = zmq::socket_t(SharedContext(), zmq::socket_type::router);
    ApplyNetworkOptions(router, options_);
    router.set(zmq::sockopt::router_mandatory, options_.report_unsent ? 1 : 0);
    zap_domain_ = ApplyCurve(router, options_.curve, /*server=*/true);
    router.bind(endpoint);
    router_.fd = static_cast<int>(router.get(zmq::sockopt::fd));
    return router.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    CloseQuietly(&router);
    if (!zap_domain_.empty()) ZapHandler::Get().Unregister(zap_domain_);
    zap_domain_.clear();
    return FromZmqError("bind " + endpoint, e);
  }
}

Status ZmqServerTransport::Send(const std::string& peer, Frames frames) {
  if (peer.empty()) return InvalidArgument("Send: empty peer identity");
  if (frames.empty()) return InvalidArgument("Send: no frames");
  bool readable = false, sent = true;
  try {
    std::vector<zmq::message_t> parts = ToParts(&peer, frames);
    MutexLock lock(&router_.mu);
    if (!router_.open) return Unavailable("server transport is stopped");
    // Without report_unsent the ROUTER drops what it cannot route (an unknown peer, or
    // one send_hwm behind); with it, the first refuses with EHOSTUNREACH, the second
    // with EAGAIN.
    sent = SendParts(router_.socket, &parts, 0);
    readable = Readable(router_.socket);
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return Unavailable("Send: the peer is no longer connected");
    return FromZmqError("Send", e);
  }
  if (readable) wakeup_->Wake();
  if (!sent) {
    return ResourceExhausted("Send: the peer has " + std::to_string(options_.send_hwm) +
                             " replies unread (send high-water mark)");
  }
  return Status::Ok();
}

void ZmqServerTransport::Stop() {
  MutexLock lock(&lifecycle_mu_);
  const bool running = state_ == State::kRunning;
  state_ = State::kStopped;
  if (!running) return;
  receiving_.store(false, std::memory_order_release);
  wakeup_->Wake();
  pool_->Close();  // handlers finish their queues; their replies still go out
  {
    MutexLock send_lock(&router_.mu);
    router_.open = false;
  }
  exit_.store(true, std::memory_order_release);
  wakeup_->Wake();
  io_thread_.join();
  if (!zap_domain_.empty()) ZapHandler::Get().Unregister(zap_domain_);
}

void ZmqServerTransport::IoLoop() {
  zmq::pollitem_t items[] = {{nullptr, wakeup_->fd(), ZMQ_POLLIN, 0},
                             {nullptr, router_.fd, ZMQ_POLLIN, 0}};
  while (true) {
    const bool exiting = exit_.load(std::memory_order_acquire);
    const bool receiving = receiving_.load(std::memory_order_acquire);
    if (exiting) break;
    const bool more = RunGuarded("server I/O thread", exiting, [&] {
      items[0].revents = items[1].revents = 0;
      zmq::poll(items, receiving ? 2 : 1, kPollFallback);
      if (items[0].revents & ZMQ_POLLIN) wakeup_->Drain();
      // Also after a bare wake-up: a Send may have left a request readable.
      if (receiving) DispatchRequests();
      return true;
    });
    if (!more) break;
  }
  // With linger > 0 the shared context keeps flushing the ROUTER in the background: the
  // replies of the requests handled while stopping must still get out (transport.h).
  MutexLock lock(&router_.mu);
  router_.open = false;
  try {
    router_.socket.set(zmq::sockopt::linger,
                       std::max(static_cast<int>(options_.linger.count()), kStopLingerMs));
  } catch (const zmq::error_t& e) {
    LogError("set linger", e);
  }
  CloseQuietly(&router_.socket);
}

void ZmqServerTransport::DispatchRequests() {
  // Read under the lock, handled without it (an inline handler's reply takes it).
  std::vector<std::vector<zmq::message_t>> batch;
  bool readable = false;
  {
    MutexLock lock(&router_.mu);
    std::vector<zmq::message_t> parts;
    // Frames past the cap are dropped: no op reads that many (extra frames are ignored,
    // docs/protocol.md), and a push_batch holds at most 1 + 3 x 1024.
    while (batch.size() < kBatch &&
           RecvMultipart(router_.socket, &parts, kMaxFramesPerMessage + 1)) {
      if (parts.size() >= 2) batch.push_back(std::move(parts));  // else no body: nothing to do
    }
    readable = Readable(router_.socket);
  }
  if (readable) wakeup_->Wake();  // more than a batch: the next poll returns at once
  for (auto& parts : batch) {
    Incoming in;
    in.peer.assign(parts[0].data<char>(), parts[0].size());
    if (options_.curve.enabled()) {
      const char* user = zmq_msg_gets(parts[1].handle(), "User-Id");
      if (user != nullptr) in.client_key = user;
    }
    in.frames.reserve(parts.size() - 1);
    for (size_t j = 1; j < parts.size(); ++j) in.frames.push_back(ToFrame(std::move(parts[j])));
    const size_t key = std::hash<std::string>{}(in.peer);
    if (RunInlineIfIdle(pool_.get(), key, options_.inline_max_bytes, in)) continue;
    pool_->Submit(key, std::move(in));  // when full, dropped and counted by the pool
  }
}

// ---------------------------------------------------------------------------- client

ZmqClientTransport::ZmqClientTransport(const TransportOptions& options) : options_(options) {}

ZmqClientTransport::~ZmqClientTransport() { Close(); }

Status ZmqClientTransport::Connect(const std::vector<std::string>& endpoints, Handler handler) {
  MutexLock lock(&lifecycle_mu_);
  if (state_ != State::kNew) return FailedPrecondition("client transport already connected");
  if (!handler) return InvalidArgument("client transport needs a handler");
  ONLINEPS_RETURN_IF_ERROR(ConnectSockets(endpoints));
  handler_ = std::move(handler);
  for (auto& dealer : dealers_) {
    MutexLock send_lock(&dealer->mu);
    dealer->open = true;
  }
  num_servers_.store(dealers_.size(), std::memory_order_release);
  io_thread_ = std::thread(&ZmqClientTransport::IoLoop, this);
  state_ = State::kRunning;
  return Status::Ok();
}

Status ZmqClientTransport::ConnectSockets(const std::vector<std::string>& endpoints) {
  if (options_.curve.enabled() && options_.curve.server_public_key.empty()) {
    return InvalidArgument(
        "CURVE is on (--curve-cert) but the servers' public key is not "
        "given (--curve-server-key)");
  }
  std::string current = "client wake-up eventfd";
  try {
    wakeup_ = std::make_unique<ZmqWakeup>();
    for (const std::string& endpoint : endpoints) {
      current = "connect " + endpoint;
      dealers_.push_back(std::make_unique<LockedSocket>());
      LockedSocket& d = *dealers_.back();
      MutexLock lock(&d.mu);
      // No ZMQ_IMMEDIATE: requests to a server that is not up yet wait for it.
      d.socket = zmq::socket_t(SharedContext(), zmq::socket_type::dealer);
      ApplyNetworkOptions(d.socket, options_);
      ApplyCurve(d.socket, options_.curve, /*server=*/false);
      if (options_.on_disconnect) {
        // ZeroMQ reports the dealer's connection events on an inproc PAIR.
        const std::string monitor = NextPipeName("monitor");
        if (zmq_socket_monitor(d.socket.handle(), monitor.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) {
          throw zmq::error_t();
        }
        monitors_.emplace_back(SharedContext(), zmq::socket_type::pair);
        monitors_.back().set(zmq::sockopt::linger, 0);
        monitors_.back().connect(monitor);
      }
      d.socket.connect(endpoint);
      d.fd = static_cast<int>(d.socket.get(zmq::sockopt::fd));
    }
    return Status::Ok();
  } catch (const zmq::error_t& e) {
    CloseSockets();
    dealers_.clear();
    return FromZmqError(current, e);
  }
}

void ZmqClientTransport::CloseSockets() {
  for (auto& dealer : dealers_) {
    MutexLock lock(&dealer->mu);
    dealer->open = false;
    if (!monitors_.empty()) (void)zmq_socket_monitor(dealer->socket.handle(), nullptr, 0);
  }
  for (auto& monitor : monitors_) CloseQuietly(&monitor);
  monitors_.clear();
  // With linger > 0 the shared context keeps flushing the DEALERs in the background.
  for (auto& dealer : dealers_) {
    MutexLock lock(&dealer->mu);
    CloseQuietly(&dealer->socket);
  }
}

Status ZmqClientTransport::Send(size_t index, Frames frames) {
  if (frames.empty()) return InvalidArgument("Send: no frames");
  const size_t servers = num_servers_.load(std::memory_order_acquire);
  if (index >= servers) {
    if (servers == 0) return Unavailable("client transport is not connected");
    return InvalidArgument("Send: server index " + std::to_string(index) + " out of range (" +
                           std::to_string(servers) + " servers)");
  }
  LockedSocket& d = *dealers_[index];
  bool readable = false;
  try {
    std::vector<zmq::message_t> parts = ToParts(nullptr, frames);
    MutexLock lock(&d.mu);
    if (!d.open) return Unavailable("client transport is closed");
    if (!SendParts(d.socket, &parts, 0)) dropped_.fetch_add(1, std::memory_order_relaxed);
    readable = Readable(d.socket);
  } catch (const zmq::error_t& e) {
    return FromZmqError("Send", e);
  }
  if (readable) wakeup_->Wake();
  return Status::Ok();
}

void ZmqClientTransport::Close() {
  MutexLock lock(&lifecycle_mu_);
  const bool running = state_ == State::kRunning;
  state_ = State::kClosed;
  if (!running) return;
  for (auto& dealer : dealers_) {
    MutexLock send_lock(&dealer->mu);
    dealer->open = false;
  }
  exit_.store(true, std::memory_order_release);
  wakeup_->Wake();
  io_thread_.join();
}

void ZmqClientTransport::IoLoop() {
  std::vector<zmq::pollitem_t> items;
  items.push_back({nullptr, wakeup_->fd(), ZMQ_POLLIN, 0});
  for (auto& dealer : dealers_) items.push_back({nullptr, dealer->fd, ZMQ_POLLIN, 0});
  for (auto& monitor : monitors_) items.push_back({monitor.handle(), 0, ZMQ_POLLIN, 0});
  while (!exit_.load(std::memory_order_acquire)) {
    const bool more = RunGuarded("client I/O thread", false, [&] {
      for (auto& item : items) item.revents = 0;
      const int ready = zmq::poll(items.data(), items.size(), kPollFallback);
      const bool woken = items[0].revents & ZMQ_POLLIN;
      if (woken) wakeup_->Drain();
      // After a wake-up (a Send may have left a reply readable) or the fallback timeout,
      // every dealer is read.
      for (size_t i = 0; i < dealers_.size(); ++i) {
        if (woken || ready == 0 || (items[i + 1].revents & ZMQ_POLLIN)) DeliverReplies(i);
      }
      for (size_t i = 0; i < monitors_.size(); ++i) {
        if (items[1 + dealers_.size() + i].revents & ZMQ_POLLIN) ReadMonitor(i);
      }
      return true;
    });
    if (!more) break;
  }
  CloseSockets();
}

// One monitor event (two frames: event id and value, then the endpoint).
void ZmqClientTransport::ReadMonitor(size_t index) {
  std::vector<zmq::message_t> parts;
  while (RecvMultipart(monitors_[index], &parts)) {
    if (parts.empty() || parts[0].size() < sizeof(uint16_t)) continue;
    uint16_t event;
    std::memcpy(&event, parts[0].data(), sizeof(event));
    if (event != ZMQ_EVENT_DISCONNECTED) continue;
    try {
      options_.on_disconnect(index);
    } catch (const std::exception& e) {
      LogError("client on_disconnect threw", e);
    }
  }
}

void ZmqClientTransport::DeliverReplies(size_t index) {
  // Read under the lock, delivered without it (a handler may Send).
  LockedSocket& d = *dealers_[index];
  std::vector<Frames> batch;
  bool readable = false;
  {
    MutexLock lock(&d.mu);
    std::vector<zmq::message_t> parts;
    while (d.open && batch.size() < kBatch && RecvMultipart(d.socket, &parts)) {
      Frames frames;
      frames.reserve(parts.size());
      for (auto& part : parts) frames.push_back(ToFrame(std::move(part)));
      batch.push_back(std::move(frames));
    }
    readable = d.open && Readable(d.socket);
  }
  if (readable) wakeup_->Wake();  // more than a batch: the next poll returns at once
  for (Frames& frames : batch) {
    try {
      handler_(index, std::move(frames));
    } catch (const std::exception& e) {
      LogError("client handler threw", e);
    } catch (...) {
      std::fprintf(stderr, "onlineps: zmq transport: client handler threw\n");
    }
  }
}

}  // namespace onlineps
