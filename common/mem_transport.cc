#include "common/mem_transport.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <iterator>
#include <unordered_map>

#include "common/inline_request.h"

namespace onlineps {

using Inbox = HandlerPool<MemClientTransport::Delivery>;

// What a client needs of a server: a queue to put requests on, and a map from peer
// ids back to the clients' inboxes for replies. Shared with clients through the
// registry, so it outlives the transport while a client is mid-Send.
class MemServerCore {
 public:
  explicit MemServerCore(const TransportOptions& options) : options_(options) {}

  // Creates the handler threads. REQUIRES: the core is not registered (no client
  // can reach pool_ yet).
  void StartPool(ServerTransport::Handler handler);
  // Lets the handler threads finish their queues and joins them; later requests drop.
  void DrainPool() { pool_->Close(); }
  void SetOpen(bool open);
  uint64_t dropped() const { return pool_ ? pool_->dropped() : 0; }

  // Called by clients, from any thread.
  void Deliver(const std::string& peer, const std::shared_ptr<Inbox>& inbox, size_t index,
               Frames&& frames);
  // Called by the server's Send, from any thread.
  Status Reply(const std::string& peer, Frames&& frames);

 private:
  struct Route {
    std::weak_ptr<Inbox> inbox;
    size_t index;  // the server's position in that client's endpoint list
  };
  void RememberPeer(const std::string& peer, const std::shared_ptr<Inbox>& inbox, size_t index);

  const TransportOptions options_;
  std::unique_ptr<HandlerPool<Incoming>> pool_;  // set before registration, then immutable

  Mutex mu_;
  std::unordered_map<std::string, Route> peers_ GUARDED_BY(mu_);
  size_t prune_at_ GUARDED_BY(mu_) = 64;
  bool open_ GUARDED_BY(mu_) = false;
};

namespace {

constexpr char kScheme[] = "mem://";

// The peer whose request this thread is running inline (mem_run_on_sender), or null: its
// reply is then delivered on this thread too, when that client's inbox is idle.
thread_local const std::string* tl_inline_peer = nullptr;

bool ParseName(const std::string& endpoint, std::string* name) {
  const std::string scheme(kScheme);
  if (endpoint.compare(0, scheme.size(), scheme) != 0 || endpoint.size() == scheme.size()) {
    return false;
  }
  *name = endpoint.substr(scheme.size());
  return true;
}

// NAME -> running server, for the whole process.
class Registry {
 public:
  static Registry& Get() {
    static auto* registry = new Registry;  // never destroyed: no exit-order hazards
    return *registry;
  }

  Status Bind(const std::string& name, std::shared_ptr<MemServerCore> core) {
    MutexLock lock(&mu_);
    if (!servers_.emplace(name, std::move(core)).second) {
      return AlreadyExists("mem://" + name + " is already bound");
    }
    return Status::Ok();
  }
  void Unbind(const std::string& name) {
    MutexLock lock(&mu_);
    servers_.erase(name);
  }
  std::shared_ptr<MemServerCore> Find(const std::string& name) {
    MutexLock lock(&mu_);
    auto it = servers_.find(name);
    return it == servers_.end() ? nullptr : it->second;
  }

 private:
  Mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<MemServerCore>> servers_ GUARDED_BY(mu_);
};

}  // namespace

// ---------------------------------------------------------------------------- core

void MemServerCore::StartPool(ServerTransport::Handler handler) {
  pool_ = std::make_unique<HandlerPool<Incoming>>(
      "mem server", options_.handler_threads, options_.max_queue_per_thread, std::move(handler));
}

void MemServerCore::SetOpen(bool open) {
  MutexLock lock(&mu_);
  open_ = open;
}

void MemServerCore::Deliver(const std::string& peer, const std::shared_ptr<Inbox>& inbox,
                            size_t index, Frames&& frames) {
  RememberPeer(peer, inbox, index);
  const size_t key = std::hash<std::string>{}(peer);
  Incoming in{peer, std::move(frames), {}, nullptr};
  if (options_.mem_run_on_sender) {
    const std::string* outer = tl_inline_peer;
    tl_inline_peer = &peer;  // its reply may come back on this thread (Reply)
    const bool ran = RunInlineIfIdle(pool_.get(), key, options_.inline_max_bytes, in);
    tl_inline_peer = outer;
    if (ran) return;
  }
  // After DrainPool, Submit refuses: the request is dropped, as by a stopped server.
  pool_->Submit(key, std::move(in));
}

void MemServerCore::RememberPeer(const std::string& peer, const std::shared_ptr<Inbox>& inbox,
                                 size_t index) {
  MutexLock lock(&mu_);
  if (peers_.count(peer) != 0) return;
  peers_.emplace(peer, Route{inbox, index});
  if (peers_.size() < prune_at_) return;
  // A server lives for months while clients come and go: forget the closed ones, at a
  // cost amortized over the doubling of the map.
  for (auto it = peers_.begin(); it != peers_.end();) {
    it = it->second.inbox.expired() ? peers_.erase(it) : std::next(it);
  }
  prune_at_ = std::max<size_t>(64, 2 * peers_.size());
}

Status MemServerCore::Reply(const std::string& peer, Frames&& frames) {
  std::shared_ptr<Inbox> inbox;
  size_t index = 0;
  {
    MutexLock lock(&mu_);
    if (!open_) return Unavailable("server transport is stopped");
    auto it = peers_.find(peer);
    if (it == peers_.end()) return Status::Ok();  // unknown peer: dropped, as by ZeroMQ
    inbox = it->second.inbox.lock();
    index = it->second.index;
  }
  if (!inbox) return Status::Ok();
  MemClientTransport::Delivery d{index, std::move(frames)};
  // The reply to a request run on its sender's thread goes back on that thread when the
  // client's inbox is idle (nothing queued before it), saving the delivery thread's wake-up.
  if (tl_inline_peer != nullptr && *tl_inline_peer == peer && inbox->TryRunInline(0, d)) {
    return Status::Ok();
  }
  inbox->Submit(0, std::move(d));  // full or closed: dropped
  return Status::Ok();
}

// ---------------------------------------------------------------------------- server

MemServerTransport::MemServerTransport(const TransportOptions& options)
    : core_(std::make_shared<MemServerCore>(options)) {}

MemServerTransport::~MemServerTransport() { Stop(); }

uint64_t MemServerTransport::dropped() const { return core_->dropped(); }

StatusOr<std::string> MemServerTransport::Start(const std::string& endpoint, Handler handler) {
  MutexLock lock(&mu_);
  if (state_ != State::kNew) return FailedPrecondition("server transport already started");
  if (!handler) return InvalidArgument("server transport needs a handler");
  std::string name;
  if (!ParseName(endpoint, &name)) {
    return InvalidArgument("not a mem://NAME endpoint: '" + endpoint + "'");
  }
  core_->StartPool(std::move(handler));
  core_->SetOpen(true);
  Status bound = Registry::Get().Bind(name, core_);
  if (!bound.ok()) {
    core_->DrainPool();
    core_->SetOpen(false);
    return bound;
  }
  name_ = std::move(name);
  state_ = State::kRunning;
  return endpoint;
}

Status MemServerTransport::Send(const std::string& peer, Frames frames) {
  if (frames.empty()) return InvalidArgument("Send: no frames");
  return core_->Reply(peer, std::move(frames));
}

void MemServerTransport::Stop() {
  MutexLock lock(&mu_);
  const bool running = state_ == State::kRunning;
  state_ = State::kStopped;
  if (!running) return;
  Registry::Get().Unbind(name_);  // new requests find no server
  core_->DrainPool();             // queued ones finish; their replies still go out
  core_->SetOpen(false);
}

// ---------------------------------------------------------------------------- client

MemClientTransport::MemClientTransport(const TransportOptions& options) : options_(options) {}

MemClientTransport::~MemClientTransport() { Close(); }

uint64_t MemClientTransport::dropped() const {
  MutexLock lock(&mu_);
  return inbox_ ? inbox_->dropped() : 0;
}

Status MemClientTransport::Connect(const std::vector<std::string>& endpoints, Handler handler) {
  MutexLock lock(&mu_);
  if (state_ != State::kNew) return FailedPrecondition("client transport already connected");
  if (!handler) return InvalidArgument("client transport needs a handler");
  std::vector<std::string> names(endpoints.size());
  for (size_t i = 0; i < endpoints.size(); ++i) {
    if (!ParseName(endpoints[i], &names[i])) {
      return InvalidArgument("not a mem://NAME endpoint: '" + endpoints[i] + "'");
    }
  }
  // Unique per client and server index, like a DEALER's identity towards each ROUTER.
  static std::atomic<uint64_t> next_client{0};
  const std::string id = "mem-client-" + std::to_string(next_client.fetch_add(1));
  for (size_t i = 0; i < names.size(); ++i) peers_.push_back(id + "/" + std::to_string(i));
  names_ = std::move(names);
  const size_t max_queue = options_.recv_hwm > 0 ? static_cast<size_t>(options_.recv_hwm) : 0;
  inbox_ = std::make_shared<Inbox>(
      "mem client", 1, max_queue,
      [handler = std::move(handler)](Delivery&& d) { handler(d.first, std::move(d.second)); });
  state_ = State::kRunning;
  return Status::Ok();
}

Status MemClientTransport::Send(size_t index, Frames frames) {
  if (frames.empty()) return InvalidArgument("Send: no frames");
  std::shared_ptr<Inbox> inbox;
  {
    MutexLock lock(&mu_);
    if (state_ != State::kRunning) return Unavailable("client transport is not connected");
    inbox = inbox_;
  }
  if (index >= names_.size()) {
    return InvalidArgument("Send: server index " + std::to_string(index) + " out of range (" +
                           std::to_string(names_.size()) + " servers)");
  }
  std::shared_ptr<MemServerCore> server = Registry::Get().Find(names_[index]);
  if (server) server->Deliver(peers_[index], inbox, index, std::move(frames));
  return Status::Ok();
}

void MemClientTransport::Close() {
  std::shared_ptr<Inbox> inbox;
  {
    MutexLock lock(&mu_);
    if (state_ == State::kRunning) inbox = inbox_;
    state_ = State::kClosed;
  }
  // Closed outside mu_: the Handler it may still run can call Send (which takes mu_).
  if (inbox) inbox->Close();
}

}  // namespace onlineps
