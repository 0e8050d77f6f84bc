#include "worker/worker_client.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "common/mutex.h"
#include "common/rpc_calls.h"

namespace onlineps::worker {
namespace {

using nlohmann::json;

// One call waiting for its reply: filled by the reply (transport thread) or by the
// deadline (RpcCalls' timer thread), read by the caller.
struct Waiter {
  Mutex mu;
  CondVar cv;
  bool done GUARDED_BY(mu) = false;
  Status status GUARDED_BY(mu);
  json body GUARDED_BY(mu);

  void Finish(Status st, json b) {
    {
      MutexLock lock(&mu);
      status = std::move(st);
      body = std::move(b);
      done = true;
    }
    cv.SignalAll();
  }
};

// What RpcCalls holds for a call in flight.
struct Pending {
  std::shared_ptr<Waiter> waiter;
  Op op;
  std::chrono::milliseconds timeout;
};

class WorkerClientImpl : public WorkerClient {
 public:
  explicit WorkerClientImpl(WorkerClientOptions o)
      : options_(std::move(o)),
        calls_(
            static_cast<uint32_t>(std::min<size_t>(options_.max_inflight, 1 << 16)),
            [this](std::unique_ptr<Pending> p) { Expired(std::move(p)); }, nullptr) {}
  ~WorkerClientImpl() override {
    for (auto& p : calls_.Stop()) p->waiter->Finish(Cancelled("client shut down"), json());
    if (transport_) transport_->Close();
  }

  Status Connect() {
    TransportOptions transport = options_.transport;
    // A worker that dies (or restarts) never answers what it was sent: fail those calls
    // now instead of at their deadlines.
    transport.on_disconnect = [this](size_t) {
      FailInFlight("the connection dropped before the worker answered");
    };
    transport_ = NewClientTransport({options_.endpoint}, transport);
    ONLINEPS_RETURN_IF_ERROR(transport_->Connect(
        {options_.endpoint}, [this](size_t, Frames&& frames) { OnReply(std::move(frames)); }));
    calls_.Start();
    return Status::Ok();
  }

  StatusOr<json> Call(Op op, const json& body) override { return Call(op, body, options_.timeout); }

  StatusOr<json> Call(Op op, const json& body, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto waiter = std::make_shared<Waiter>();
    Frames frames{Frame(), Frame::FromVector(json::to_msgpack(body))};
    Status sent;
    auto pending = std::make_unique<Pending>(Pending{waiter, op, timeout});
    // Bounded: callers past max_inflight wait for a free id until their deadline.
    // Sent after the call table's lock is released: the transport's thread taking other
    // calls' replies never waits for this send.
    const StatusOr<uint32_t> id = calls_.AddThen(
        &pending, deadline,
        [&](uint32_t id, Pending&) {
          Header h;
          h.op = op;
          h.request_id = id;
          frames[0] = Frame::FromString(EncodeHeader(h));
          return std::move(frames);
        },
        [&](Frames&& out) { sent = transport_->Send(0, std::move(out)); }, deadline);
    if (!id.ok()) {
      if (id.status().code() != StatusCode::kResourceExhausted) return id.status();
      return DeadlineExceeded("too many calls in flight to the worker");
    }
    if (!sent.ok()) {
      if (calls_.Take(*id)) return sent;  // else the reply or the deadline got there first
    }
    MutexLock lock(&waiter->mu);
    waiter->cv.Wait(&waiter->mu, [&]() REQUIRES(waiter->mu) { return waiter->done; });
    if (!waiter->status.ok()) return waiter->status;
    return std::move(waiter->body);
  }

  void FailInFlight(const std::string& why) override {
    for (auto& p : calls_.TakeAll()) Fail(*p, why);
  }

 private:
  // On the timer thread: no reply by the call's deadline.
  void Expired(std::unique_ptr<Pending> p) {
    Fail(*p, "no reply within " + std::to_string(p->timeout.count()) + " ms");
  }

  // Ends a call without its reply: kDeadlineExceeded, its outcome unknown.
  void Fail(const Pending& p, const std::string& why) {
    p.waiter->Finish(
        DeadlineExceeded(std::string(OpName(p.op)) + " to " + options_.endpoint + ": " + why),
        json());
  }

  // On the transport's I/O thread: match the reply to its caller and wake it.
  void OnReply(Frames&& frames) {
    if (frames.empty()) return;
    auto h = DecodeHeader(frames[0].data(), frames[0].size());
    if (!h.ok()) return;  // not ours to answer; the caller times out
    std::unique_ptr<Pending> p = calls_.Take(h->request_id);
    if (!p) return;  // late reply to a call that gave up
    Status st = ReplyStatus(*h);
    json body = json::object();
    if (st.ok() && frames.size() > 1) {
      const auto* b = reinterpret_cast<const uint8_t*>(frames[1].data());
      body = json::from_msgpack(b, b + frames[1].size(), true, false);
      if (body.is_discarded()) st = Malformed("reply body is not msgpack");
    }
    p->waiter->Finish(std::move(st), std::move(body));
  }

  const WorkerClientOptions options_;
  std::unique_ptr<ClientTransport> transport_;
  RpcCalls<Pending> calls_;
};

}  // namespace

StatusOr<std::unique_ptr<WorkerClient>> WorkerClient::Connect(WorkerClientOptions options) {
  if (options.endpoint.empty()) {
    return InvalidArgument("worker endpoint is empty");
  }
  auto client = std::make_unique<WorkerClientImpl>(std::move(options));
  ONLINEPS_RETURN_IF_ERROR(client->Connect());
  return std::unique_ptr<WorkerClient>(std::move(client));
}

}  // namespace onlineps::worker
