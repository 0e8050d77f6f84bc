#include "worker/worker_client.h"

#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "common/request_ids.h"

namespace onlineps::worker {
namespace {

using nlohmann::json;

// One call waiting for its reply.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // guarded by mu
  Status status;      // guarded by mu
  json body;          // guarded by mu
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
      std::unique_lock<std::mutex> lock(mu_);
      std::optional<uint32_t> got;
      // Bounded: callers past max_inflight wait for a free id.
      if (!slot_cv_.wait_until(lock, deadline,
                               [&] { return (got = ids_.Acquire()).has_value(); })) {
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
    std::unique_lock<std::mutex> lock(waiter->mu);
    const bool done =
        sent.ok() && waiter->cv.wait_until(lock, deadline, [&] { return waiter->done; });
    lock.unlock();
    Forget(id);
    if (!sent.ok()) return sent;
    if (!done) {
      return DeadlineExceeded(std::string(OpName(op)) + " to " + options_.endpoint +
                              ": no reply within " + std::to_string(timeout.count()) + " ms");
    }
    if (!waiter->status.ok()) return waiter->status;
    return std::move(waiter->body);
  }

 private:
  void Forget(uint32_t id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiting_.erase(id);
      ids_.Release(id);
    }
    slot_cv_.notify_one();
  }

  // On the transport's I/O thread: match the reply to its caller and wake it.
  void OnReply(Frames&& frames) {
    if (frames.empty()) return;
    auto h = DecodeHeader(frames[0].data(), frames[0].size());
    if (!h.ok()) return;  // not ours to answer; the caller times out
    std::shared_ptr<Waiter> w;
    {
      std::lock_guard<std::mutex> lock(mu_);
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
      std::lock_guard<std::mutex> lock(w->mu);
      w->status = st;
      w->body = std::move(body);
      w->done = true;
    }
    w->cv.notify_all();
  }

  const WorkerClientOptions options_;
  std::unique_ptr<ClientTransport> transport_;
  std::mutex mu_;
  std::condition_variable slot_cv_;
  RequestIdPool ids_;                                              // guarded by mu_
  std::unordered_map<uint32_t, std::shared_ptr<Waiter>> waiting_;  // guarded by mu_
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
