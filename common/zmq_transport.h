// ZeroMQ transports (tcp://, ipc://, inproc://). The server is a ROUTER read by one I/O
// thread that feeds HandlerPool threads; the client is one DEALER per server read by one
// I/O thread. Send() on either writes the socket itself, under the socket's mutex and
// without waiting (ZeroMQ queues the frames, not copied, for its own I/O threads): no
// hand-off to our I/O thread, one thread crossing fewer per message. All transports
// share one process-wide zmq::context_t, so inproc:// endpoints work between them.
// Stop()/Close() must not be called from a Handler (they join the handler threads).
#ifndef ONLINEPS_COMMON_ZMQ_TRANSPORT_H_
#define ONLINEPS_COMMON_ZMQ_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/handler_pool.h"
#include "common/mutex.h"
#include "common/transport.h"

namespace onlineps {

// A ZeroMQ error as a Status: kInvalidArgument (bad endpoint or protocol),
// kAlreadyExists (address in use), kUnavailable otherwise; the message starts with `what`.
Status FromZmqError(const std::string& what, const zmq::error_t& e);

// A ZeroMQ socket that an I/O thread reads and any thread writes. ZeroMQ sockets are not
// thread-safe, so every use is under `mu`. The I/O thread polls `fd` (ZMQ_FD, readable
// when the socket has commands to process) rather than the socket; since any use of the
// socket may process those commands, a writer that leaves a message readable must wake
// the I/O thread itself (ZmqWakeup).
struct LockedSocket {
  Mutex mu;
  zmq::socket_t socket GUARDED_BY(mu);
  bool open GUARDED_BY(mu) = false;  // Send accepted
  int fd = -1;                       // set before the I/O thread starts
};

// An eventfd that wakes an I/O thread out of its poll.
class ZmqWakeup {
 public:
  ZmqWakeup();  // throws zmq::error_t(errno) when no eventfd can be made
  ~ZmqWakeup();
  ZmqWakeup(const ZmqWakeup&) = delete;
  ZmqWakeup& operator=(const ZmqWakeup&) = delete;
  int fd() const { return fd_; }
  void Wake();   // thread-safe
  void Drain();  // by the I/O thread, after poll said fd() is readable

 private:
  int fd_ = -1;
};

class ZmqServerTransport final : public ServerTransport {
 public:
  explicit ZmqServerTransport(const TransportOptions& options);
  ~ZmqServerTransport() override;  // Stop()

  StatusOr<std::string> Start(const std::string& endpoint, Handler handler) override;
  // Unknown or departed peers are dropped silently (ZMQ_ROUTER_MANDATORY=0). Fails with
  // kResourceExhausted when the I/O thread is send_hwm messages behind.
  Status Send(const std::string& peer, Frames frames) override;
  void Stop() override;

  // Requests dropped because their handler thread's queue was full. Call after Start.
  uint64_t dropped() const;

 private:
  StatusOr<std::string> BindSockets(const std::string& endpoint);
  void IoLoop();
  void DispatchRequests();

  // Immutable after construction.
  const TransportOptions options_;

  Mutex lifecycle_mu_;  // serializes Start/Stop
  enum class State { kNew, kRunning, kStopped };
  State state_ GUARDED_BY(lifecycle_mu_) = State::kNew;

  LockedSocket router_;  // read by io_thread_, written by Send
  std::unique_ptr<ZmqWakeup> wakeup_;
  std::unique_ptr<HandlerPool<Incoming>> pool_;  // set in Start, closed in Stop
  std::thread io_thread_;
  std::atomic<bool> receiving_{true};  // false: I/O thread stops reading the ROUTER
  std::atomic<bool> exit_{false};      // true: I/O thread closes the ROUTER and exits

  std::string zap_domain_;  // registered with the ZAP handler while bound ("" : none)
};

class ZmqClientTransport final : public ClientTransport {
 public:
  explicit ZmqClientTransport(const TransportOptions& options);
  ~ZmqClientTransport() override;  // Close()

  Status Connect(const std::vector<std::string>& endpoints, Handler handler) override;
  // Messages the DEALER cannot take (send_hwm queued for an absent or slow server) are
  // dropped and counted in dropped(); the caller's timeout handles them.
  Status Send(size_t index, Frames frames) override;
  void Close() override;

  // Requests dropped because a server's send queue was full.
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  Status ConnectSockets(const std::vector<std::string>& endpoints);
  void CloseSockets();
  void IoLoop();
  void DeliverReplies(size_t index);
  void ReadMonitor(size_t index);

  // Immutable after construction.
  const TransportOptions options_;

  Mutex lifecycle_mu_;  // serializes Connect/Close
  enum class State { kNew, kRunning, kClosed };
  State state_ GUARDED_BY(lifecycle_mu_) = State::kNew;

  // Read by io_thread_, written by Send. The vector is filled before num_servers_ is
  // published and never changes after.
  std::vector<std::unique_ptr<LockedSocket>> dealers_;
  std::atomic<size_t> num_servers_{0};
  std::vector<zmq::socket_t> monitors_;  // io_thread_'s; one per dealer with on_disconnect
  std::unique_ptr<ZmqWakeup> wakeup_;
  Handler handler_;
  std::thread io_thread_;
  std::atomic<bool> exit_{false};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_ZMQ_TRANSPORT_H_
