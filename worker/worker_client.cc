#include "worker/worker_client.h"

#include <unordered_map>

#include "common/mutex.h"
#include "common/request_ids.h"

namespace onlineps::worker {
namespace {

using nlohmann::json;

// One call waiting for its reply.
struct Waiter {
  Mutex mu;
  CondVar cv;
  bool done GUARDED_BY(mu) = false;
  Status status GUARDED_BY(mu);
  json body GUARDED_BY(mu);
};

class WorkerClientImpl : public WorkerClient {
 public:
  explicit WorkerClientImpl(WorkerClientOptions o)
      : options_(std::move(o)),
        ids_(static_cast<uint32_t>(std::min<size_t>(options_.max_inflight, 1 << 16))) {}
  ~WorkerClientImpl() override {
    if (transport_) transport_->Close();
  }

  Status Connect() {
    transport_ = NewClientTransport({options_.endpoint}, options_.transport);
    return transport_->Connect({options_.endpoint},
                               [this](size_t, Frames&& frames) { OnReply(std::move(frames)); });
  }

  StatusOr<json> Call(Op op, const json& body) override { return Call(op, body, options_.timeout); }

  StatusOr<json> Call(Op op, const json& body, std::chrono::milliseconds timeout) override {
    auto waiter = std::make_shared<Waiter>();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    uint32_t id;
    {
      MutexLock lock(&mu_);
      std::optional<uint32_t> got;
      // Bounded: callers past max_inflight wait for a free id.
      if (!slot_cv_.WaitUntil(&mu_, deadline,
                              [&]() REQUIRES(mu_) { return (got = ids_.Acquire()).has_value(); })) {
        return DeadlineExceeded("too many calls in flight to the worker");
      }
      id = *got;
      waiting_[id] = waiter;
    }
    Header h;
    h.op = op;
    h.request_id = id;
    Frames frames{Frame::FromString(EncodeHeader(h))};
    std::vector<uint8_t> bytes = json::to_msgpack(body);
    frames.push_back(Frame::FromVector(std::move(bytes)));
    Status sent = transport_->Send(0, std::move(frames));
    MutexLock lock(&waiter->mu);
    const bool done =
        sent.ok() && waiter->cv.WaitUntil(&waiter->mu, deadline,
                                          [&]() REQUIRES(waiter->mu) { return waiter->done; });
    lock.Unlock();
    Forget(id);
    if (!sent.ok()) return sent;
    if (!done) {
      return DeadlineExceeded(std::string(OpName(op)) + " to " + options_.endpoint +
                              ": no reply within " + std::to_string(timeout.count()) + " ms");
    }
    lock.Lock();  // uncontended: after Forget no reply can reach the waiter
    if (!waiter->status.ok()) return waiter->status;
    return std::move(waiter->body);
  }

 private:
  void Forget(uint32_t id) {
    {
      MutexLock lock(&mu_);
      waiting_.erase(id);
      ids_.Release(id);
    }
    slot_cv_.Signal();
  }

  // On the transport's I/O thread: match the reply to its caller and wake it.
  void OnReply(Frames&& frames) {
    if (frames.empty()) return;
    auto h = DecodeHeader(frames[0].data(), frames[0].size());
    if (!h.ok()) return;  // not ours to answer; the caller times out
    std::shared_ptr<Waiter> w;
    {
      MutexLock lock(&mu_);
      auto it = waiting_.find(h->request_id);
      if (it == waiting_.end()) return;  // late reply to a call that gave up
      w = it->second;
    }
    Status st = ReplyStatus(*h);
    json body = json::object();
    if (st.ok() && frames.size() > 1) {
      const auto* p = reinterpret_cast<const uint8_t*>(frames[1].data());
      body = json::from_msgpack(p, p + frames[1].size(), true, false);
      if (body.is_discarded()) st = Malformed("reply body is not msgpack");
    }
    {
      MutexLock lock(&w->mu);
      w->status = st;
      w->body = std::move(body);
      w->done = true;
    }
    w->cv.SignalAll();
  }

  const WorkerClientOptions options_;
  std::unique_ptr<ClientTransport> transport_;
  Mutex mu_;
  CondVar slot_cv_;
  RequestIdPool ids_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, std::shared_ptr<Waiter>> waiting_ GUARDED_BY(mu_);
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
