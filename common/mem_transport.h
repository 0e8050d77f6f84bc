// In-process transports for mem://NAME endpoints: no ZeroMQ, no sockets, no copies
// (frames are shared). A process-wide registry maps NAME to a running server. Same
// contract as the ZeroMQ transports: one peer's requests run in order on one handler
// thread, handler queues are bounded, Send is thread-safe and never blocks on a peer.
// Unlike ZeroMQ, a request to a NAME with no server bound is dropped at once rather
// than queued until one binds; the caller's timeout handles it, as for a dead server.
// Stop()/Close() must not be called from a Handler (they join the handler threads).
#ifndef ONLINEPS_COMMON_MEM_TRANSPORT_H_
#define ONLINEPS_COMMON_MEM_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/handler_pool.h"
#include "common/mutex.h"
#include "common/transport.h"

namespace onlineps {

// The part of a server that clients reach through the registry; defined in the .cc.
class MemServerCore;

class MemServerTransport final : public ServerTransport {
 public:
  explicit MemServerTransport(const TransportOptions& options);
  ~MemServerTransport() override;  // Stop()

  // Fails with kAlreadyExists when another server holds NAME.
  StatusOr<std::string> Start(const std::string& endpoint, Handler handler) override;
  // Replies to unknown or closed clients are dropped silently, as with ZeroMQ.
  Status Send(const std::string& peer, Frames frames) override;
  void Stop() override;

  // Requests dropped because their handler thread's queue was full. Call after Start.
  uint64_t dropped() const;

 private:
  // Immutable after construction.
  const std::shared_ptr<MemServerCore> core_;

  Mutex mu_;  // serializes Start/Stop
  enum class State { kNew, kRunning, kStopped };
  State state_ GUARDED_BY(mu_) = State::kNew;
  std::string name_ GUARDED_BY(mu_);
};

class MemClientTransport final : public ClientTransport {
 public:
  // A reply waiting for the delivery thread: (server index, frames).
  using Delivery = std::pair<size_t, Frames>;

  explicit MemClientTransport(const TransportOptions& options);
  ~MemClientTransport() override;  // Close()

  // Every endpoint must be mem://NAME; servers need not be bound yet.
  Status Connect(const std::vector<std::string>& endpoints, Handler handler) override;
  // Dropped (returning OK) when no server holds that NAME right now.
  Status Send(size_t index, Frames frames) override;
  // Delivers the replies already queued, then joins the delivery thread.
  void Close() override;

  // Replies dropped because the delivery queue held recv_hwm of them.
  uint64_t dropped() const;

 private:
  // Immutable after construction.
  const TransportOptions options_;

  mutable Mutex mu_;
  enum class State { kNew, kRunning, kClosed };
  State state_ GUARDED_BY(mu_) = State::kNew;
  // Written by Connect before state_ becomes kRunning, then immutable, so Send reads
  // them without mu_ once it has seen kRunning.
  std::vector<std::string> names_;
  std::vector<std::string> peers_;  // this client's identity towards each server
  std::shared_ptr<HandlerPool<Delivery>> inbox_ GUARDED_BY(mu_);  // runs the Handler
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_MEM_TRANSPORT_H_
