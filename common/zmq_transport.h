// ZeroMQ transports (tcp://, ipc://, inproc://). The server is a ROUTER owned by one
// I/O thread that feeds HandlerPool threads; the client is one DEALER per server owned
// by one I/O thread. Send() on either hands frames to the I/O thread through an inproc
// pipe without copying their bytes, so it never blocks on the network. All transports
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
  void ForwardReplies(bool drain);
  void DispatchRequests();

  // Immutable after construction.
  const TransportOptions options_;

  Mutex lifecycle_mu_;  // serializes Start/Stop
  enum class State { kNew, kRunning, kStopped };
  State state_ GUARDED_BY(lifecycle_mu_) = State::kNew;

  // Owned by io_thread_ while it runs.
  zmq::socket_t router_;
  zmq::socket_t pull_;
  std::unique_ptr<HandlerPool<Incoming>> pool_;  // set in Start, closed in Stop
  std::thread io_thread_;
  std::atomic<bool> receiving_{true};  // false: I/O thread stops reading the ROUTER
  std::atomic<bool> exit_{false};      // true: I/O thread flushes replies and exits

  Mutex send_mu_;
  zmq::socket_t push_ GUARDED_BY(send_mu_);
  bool open_ GUARDED_BY(send_mu_) = false;  // Send accepted

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
  void IoLoop();
  void ForwardRequests(bool drain);
  void DeliverReplies(size_t index);
  void ReadMonitor(size_t index);

  // Immutable after construction.
  const TransportOptions options_;

  Mutex lifecycle_mu_;  // serializes Connect/Close
  enum class State { kNew, kRunning, kClosed };
  State state_ GUARDED_BY(lifecycle_mu_) = State::kNew;

  // Owned by io_thread_ while it runs.
  std::vector<zmq::socket_t> dealers_;
  std::vector<zmq::socket_t> monitors_;  // one per dealer with options_.on_disconnect
  zmq::socket_t pull_;
  Handler handler_;
  std::thread io_thread_;
  std::atomic<bool> exit_{false};
  std::atomic<uint64_t> dropped_{0};

  Mutex send_mu_;
  zmq::socket_t push_ GUARDED_BY(send_mu_);
  bool open_ GUARDED_BY(send_mu_) = false;
  size_t num_servers_ GUARDED_BY(send_mu_) = 0;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_ZMQ_TRANSPORT_H_
