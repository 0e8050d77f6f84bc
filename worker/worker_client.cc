#include "worker/worker_client.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "common/await.h"
#include "common/rpc_calls.h"
#include "worker/msgpack_json.h"

namespace onlineps::worker {
namespace {

using nlohmann::json;

// What RpcCalls holds for a call in flight.
struct Pending {
  WorkerClient::Done done;
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
  ~WorkerClientImpl() override { Shutdown("client shut down"); }

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
    return Await<StatusOr<json>>(
        [&](Done done) { Send(op, body, timeout, std::move(done), /*wait_for_id=*/true); });
  }

  void CallAsync(Op op, const json& body, std::chrono::milliseconds timeout, Done done) override {
    Send(op, body, timeout, std::move(done), /*wait_for_id=*/false);
  }

  void FailInFlight(const std::string& why) override {
    for (auto& p : calls_.TakeAll()) Fail(*p, why);
  }

  void Shutdown(const std::string& why) override {
    for (auto& p : calls_.Stop()) Fail(*p, why);  // later calls: kCancelled, not sent
    if (transport_) transport_->Close();          // joins the thread that runs replies
  }

 private:
  // On the timer thread: no reply by the call's deadline.
  void Expired(std::unique_ptr<Pending> p) {
    Fail(*p, "no reply within " + std::to_string(p->timeout.count()) + " ms");
  }

  // Ends a call without its reply: kDeadlineExceeded, its outcome unknown.
  void Fail(const Pending& p, const std::string& why) {
    p.done(DeadlineExceeded(std::string(OpName(p.op)) + " to " + options_.endpoint + ": " + why +
                            kNoWorkerAnswer));
  }

  // Registers the call and sends it. Callers past max_inflight wait for a free id until
  // the deadline when `wait_for_id` (a blocking Call), else fail at once.
  void Send(Op op, const json& body, std::chrono::milliseconds timeout, Done done,
            bool wait_for_id) {
    const auto now = std::chrono::steady_clock::now();
    const auto deadline = now + timeout;
    if (!wait_for_id && calls_.in_flight() >= async_limit_) return done(Busy());
    Frames frames{Frame(), Frame::FromVector(json::to_msgpack(body))};
    Status sent;
    auto pending = std::make_unique<Pending>(Pending{std::move(done), op, timeout});
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
        [&](Frames&& out) { sent = transport_->Send(0, std::move(out)); },
        wait_for_id ? deadline : now);
    if (!id.ok()) {  // `pending` is still ours
      if (id.status().code() != StatusCode::kResourceExhausted) return pending->done(id.status());
      // Not sent: a blocking caller waited out its deadline for a free id; an asynchronous
      // one is told at once, with a code that says "busy", not "worker gone".
      pending->done(wait_for_id ? DeadlineExceeded("too many calls in flight to the worker")
                                : Busy());
      return;
    }
    if (!sent.ok()) {
      // Else the reply or the deadline got there first and answered the call.
      if (std::unique_ptr<Pending> p = calls_.Take(*id)) p->done(sent);
    }
  }

  Status Busy() const {
    return ResourceExhausted(std::to_string(async_limit_) + " calls in flight to " +
                             options_.endpoint + " (its limit); the call was not sent");
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
      auto decoded =
          MsgpackToJson(reinterpret_cast<const uint8_t*>(frames[1].data()), frames[1].size());
      if (decoded.ok()) {
        body = std::move(decoded).value();
      } else {
        st = Malformed("reply body is not msgpack: " + decoded.status().message());
      }
    }
    if (st.ok()) {
      p->done(std::move(body));
    } else {
      p->done(std::move(st));
    }
  }

  const WorkerClientOptions options_;
  // CallAsync is refused from this many calls in flight on (the rest are for Call).
  const size_t async_limit_ =
      std::max<size_t>(1, options_.max_inflight -
                              std::min(options_.reserved_for_blocking, options_.max_inflight / 4));
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
