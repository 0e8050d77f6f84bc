// Message transport between PS clients and shard servers, behind an interface so tests
// and replays can swap the network for memory, and tests can decorate a client
// transport, e.g. to inject faults (TransportOptions::decorate, tests/common/fault_transport.h).
//
// Endpoint schemes:
//   tcp://HOST:PORT, ipc://PATH, inproc://NAME  -> ZeroMQ (ROUTER server, DEALER client)
//   mem://NAME                                   -> in-process queues, no ZeroMQ at all
// A server endpoint with port 0 (tcp://127.0.0.1:0) binds an ephemeral port; Start()
// returns the endpoint actually bound.
#ifndef ONLINEPS_COMMON_TRANSPORT_H_
#define ONLINEPS_COMMON_TRANSPORT_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/curve.h"
#include "common/frame.h"
#include "common/status.h"

namespace onlineps {

class ClientTransport;

// Wraps the client transport a factory made and returns what callers get instead: a
// hook for decorators such as tests' fault injection (tests/common/fault_transport.h).
using ClientTransportDecorator =
    std::function<std::unique_ptr<ClientTransport>(std::unique_ptr<ClientTransport>)>;

struct TransportOptions {
  // Server: handler threads. Requests from one peer always go to the same thread, so
  // each peer's requests are handled in the order sent.
  int handler_threads = 2;
  // Server: requests waiting for a handler thread, per thread. When full, the request
  // is dropped and counted (the client's timeout and retry handle it).
  size_t max_queue_per_thread = 8192;
  // Hard cap on one incoming frame (ZMQ_MAXMSGSIZE): ZeroMQ disconnects a peer that
  // sends a larger one. Servers check their soft limit on whole messages themselves.
  size_t max_message_bytes = size_t{1} << 30;
  // ZeroMQ high-water marks (messages) on sockets that face the network.
  int send_hwm = 10000;
  int recv_hwm = 10000;
  // Server (ZeroMQ): Send refuses a reply to a peer with send_hwm replies unread
  // (RESOURCE_EXHAUSTED) and one to a peer no longer connected (UNAVAILABLE), instead of
  // ZeroMQ dropping them unseen; either way the reply is not sent. Off by default.
  bool report_unsent = false;
  // Server: requests up to this size (all frames) are handled on the I/O thread when
  // their peer's handler lane is idle, saving two thread hand-offs per round trip;
  // larger ones always go to a handler thread. 0 disables inline handling.
  size_t inline_max_bytes = 256 * 1024;
  // mem:// server: requests up to inline_max_bytes run on the sending client's thread
  // when their peer's lane is idle (what the ZeroMQ server does on its I/O thread), with
  // Incoming::requeue set, and their reply is handed to the client's Handler on that
  // thread too when its inbox is idle. Only for servers whose clients call Send holding
  // no lock that the server's Handler or their own Handler takes (PsClient does not; the
  // replay's in-process shards use it); off by default.
  bool mem_run_on_sender = false;
  // Client: how long Close() waits to flush unsent messages (ZMQ_LINGER).
  std::chrono::milliseconds linger{0};
  // CurveZMQ on ZeroMQ sockets (common/curve.h); off when curve.secret_key is empty.
  // A server needs its key pair; a client its key pair and the server's public key.
  // mem:// ignores it (nothing leaves the process).
  CurveOptions curve;
  // Client: when set, NewClientTransport returns decorate(transport) instead of the
  // transport itself. Null (the default): no decorator. Servers ignore it.
  ClientTransportDecorator decorate;
  // Client: called on the transport's I/O thread when an established connection to
  // server `index` drops (the server died or closed it; ZeroMQ tcp:// and ipc:// only).
  // Requests already sent on it will get no reply; requests sent afterwards wait for a
  // reconnection. Must not block. Null (the default): not watched.
  std::function<void(size_t index)> on_disconnect;
};

// An incoming request on a server: the opaque identity of the peer that sent it plus
// its frames (header first). Replies go back with Send(peer, ...).
struct Incoming {
  std::string peer;
  Frames frames;
  // The sender's CURVE public key (Z85, 40 characters) when the server runs CURVE and
  // the handshake authenticated it; empty otherwise (no CURVE, or mem://).
  std::string client_key;
  // Set only while the request runs on the transport's I/O thread: hands it, unanswered
  // and unchanged, to its peer's handler thread instead (which then runs the Handler
  // again with this field empty). A Handler that would have to wait for a lock uses it,
  // so that the I/O thread never waits. Empty elsewhere.
  std::function<void(Incoming&&)> requeue;
};

// REQUIRES for every implementation: Send is thread-safe; Handler may be called
// concurrently from different handler threads (never concurrently for one peer).
class ServerTransport {
 public:
  using Handler = std::function<void(Incoming&&)>;
  virtual ~ServerTransport() = default;

  // Binds `endpoint` and starts the I/O and handler threads. Returns the bound endpoint.
  virtual StatusOr<std::string> Start(const std::string& endpoint, Handler handler) = 0;
  // Queues a reply to `peer`. Never blocks on the network. Fails with kUnavailable
  // after Stop().
  virtual Status Send(const std::string& peer, Frames frames) = 0;
  // Stops receiving, lets handler threads finish what is queued, flushes replies, joins.
  // Idempotent.
  virtual void Stop() = 0;
};

// A client connected to a fixed list of servers (shards), addressed by index.
class ClientTransport {
 public:
  // Called on the transport's I/O thread for every message received from `server`.
  // Must not block for long.
  using Handler = std::function<void(size_t server, Frames&&)>;
  virtual ~ClientTransport() = default;

  // Connects to every endpoint (ZeroMQ connects lazily: an absent server is not an error
  // here; calls to it time out). Starts the I/O thread.
  virtual Status Connect(const std::vector<std::string>& endpoints, Handler handler) = 0;
  // Queues `frames` for server `index`. Thread-safe; never blocks on the network.
  virtual Status Send(size_t index, Frames frames) = 0;
  // Stops the I/O thread and closes sockets. Idempotent.
  virtual void Close() = 0;
};

// Whether `endpoint` names a transport: a known scheme and, for tcp://, a port in 0..65535
// (or *). The factories apply it too; a flag parser calls it to refuse a bad endpoint
// before anything waits on the network.
Status CheckEndpoint(const std::string& endpoint);

// Factories choose the implementation from the endpoint scheme (see above).
std::unique_ptr<ServerTransport> NewServerTransport(const std::string& endpoint,
                                                    const TransportOptions& options = {});
std::unique_ptr<ClientTransport> NewClientTransport(const std::vector<std::string>& endpoints,
                                                    const TransportOptions& options = {});

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_TRANSPORT_H_
