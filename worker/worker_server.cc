#include "worker/worker_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/wire.h"
#include "worker/guarded.h"
#include "worker/request_limits.h"
#include "worker/worker_rpc.h"

namespace onlineps::worker {
// A request as queued: its body still encoded (checked by CheckBody), decoded by the
// handler thread that runs it.
struct WorkerServer::Job {
  std::string peer;
  Header header;
  Frames frames;
  size_t bytes = 0;  // counted in queued_bytes_ until decoded
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  std::string session;   // "" for sessionless requests (no order among them)
  bool resumed = false;  // taken from parked_: it holds its session's turn
};

namespace {

// A peer's ZeroMQ routing id, printable: its bytes in hex (the id is all the ROUTER knows
// of the peer once its request is handled).
std::string PeerName(const std::string& peer) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "0x";
  for (unsigned char c : peer) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

}  // namespace

WorkerServer::WorkerServer(WorkerService* service, WorkerServerOptions options)
    : service_(service), options_(std::move(options)) {}

WorkerServer::~WorkerServer() { Stop(); }

StatusOr<std::string> WorkerServer::Start() {
  pool_ = std::make_unique<HandlerPool<Job>>("worker", options_.handler_threads, options_.max_queue,
                                             [this](Job&& job) { Handle(std::move(job)); });
  TransportOptions t = options_.transport;
  // The transport's own thread only checks and routes; the pool decodes and runs.
  t.handler_threads = 1;
  // Between the limit and twice it a request gets a TOO_LARGE reply; beyond, ZeroMQ
  // stops reading it instead of buffering it whole (as the shards do).
  t.max_message_bytes = 2 * service_->limits().max_request_bytes;
  // A count bounds ZeroMQ's queue of unread replies per peer: the count that keeps it
  // under the byte bound however large the replies (up to 10,000 context_get replies of
  // ~50 KB were half a gigabyte).
  const size_t largest = MaxReplyBytes(*service_);
  const size_t hwm = std::clamp<size_t>(options_.max_unsent_reply_bytes / largest, 16,
                                        static_cast<size_t>(std::max(t.send_hwm, 16)));
  t.send_hwm = static_cast<int>(hwm);
  send_hwm_ = hwm;
  t.report_unsent = true;  // counted and logged in Reply, not dropped unseen
  spdlog::info(
      "a peer that does not read its replies gets at most {} of them queued (--max-unsent-"
      "reply-bytes {} over the largest reply, {} bytes); the rest are dropped",
      hwm, options_.max_unsent_reply_bytes, largest);
  transport_ = NewServerTransport(options_.listen, t);
  return transport_->Start(options_.listen, [this](Incoming&& in) { OnMessage(std::move(in)); });
}

void WorkerServer::Stop() {
  // New requests are refused from here on; queued ones finish and their replies go out
  // before the transport closes.
  if (transport_ == nullptr || stopping_.exchange(true)) return;
  if (pool_) pool_->Close();
  {
    // Learns waiting for their pushes are answered by the PS client's callbacks (each
    // push ends by its deadline); the requests parked behind them can no longer run.
    MutexLock lock(&parked_mu_);
    learns_cv_.WaitUntil(&parked_mu_, std::chrono::steady_clock::now() + std::chrono::seconds(60),
                         [&]() REQUIRES(parked_mu_) { return learns_in_flight_ == 0; });
  }
  std::unordered_map<std::string, std::deque<Job>> parked;
  {
    MutexLock lock(&parked_mu_);
    parked.swap(parked_);
    parked_count_ = 0;
  }
  for (auto& [session, jobs] : parked) {
    for (Job& job : jobs) {
      queued_bytes_.fetch_sub(job.bytes);
      Reply(job.peer, MakeReply(job.header, Unavailable("worker is shutting down")), "");
    }
  }
  transport_->Stop();
}

void WorkerServer::Reply(const std::string& peer, const Header& reply, const std::string& body) {
  if (reply.code != StatusCode::kOk) errors_.fetch_add(1, std::memory_order_relaxed);
  Status st = Guarded("sending the reply", [&] {
    Frames frames{Frame::FromString(EncodeHeader(reply))};
    if (!body.empty()) frames.push_back(Frame::FromString(body));
    return transport_ ? transport_->Send(peer, std::move(frames)) : Status::Ok();
  });
  if (st.code() == StatusCode::kResourceExhausted) {
    // The peer sends and does not read: its calls time out. Bounded: the first 10, then
    // every 1000th.
    const uint64_t n = unsent_dropped_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n <= 10 || n % 1000 == 0) {
      spdlog::warn(
          "reply to peer {} dropped: it has not read the {} replies queued for it "
          "(--max-unsent-reply-bytes {}); {} replies dropped so far",
          PeerName(peer), send_hwm_, options_.max_unsent_reply_bytes, n);
    }
  } else if (!st.ok()) {
    spdlog::debug("reply not sent: {}", st.ToString());
  }
}

void WorkerServer::Answer(const Job& job, const StatusOr<nlohmann::json>& out) {
  if (!out.ok()) {
    spdlog::debug("{} failed: {}", OpName(job.header.op), out.status().ToString());
    Reply(job.peer, MakeReply(job.header, out.status()), "");
    return;
  }
  StatusOr<std::string> body =
      Guarded("encoding the reply", [&]() -> StatusOr<std::string> { return EncodeBody(*out); });
  if (!body.ok()) {
    Reply(job.peer, MakeReply(job.header, body.status()), "");
    return;
  }
  Reply(job.peer, MakeReply(job.header, Status::Ok()), *body);
}

void WorkerServer::OnMessage(Incoming&& in) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  size_t bytes = 0;
  for (const Frame& f : in.frames) bytes += f.size();
  auto header = in.frames.empty() ? StatusOr<Header>(Malformed("no frames"))
                                  : DecodeHeader(in.frames[0].data(), in.frames[0].size());
  if (!header.ok()) {
    Header req;  // no request id to echo: the client matches nothing and times out
    Reply(in.peer, MakeReply(req, header.status()), "");
    return;
  }
  // The transport thread only checks and routes: a body is scanned here (sizes, value
  // counts, session) without being decoded; a handler thread decodes it.
  Status st = CheckRequestBytes(bytes, service_->limits());
  if (st.ok() && !IsWorkerOp(header->op)) {
    st =
        UnknownOp(std::string(OpName(header->op)) + " is not a worker op (is this a PS endpoint?)");
  }
  std::string_view session;
  if (st.ok() && in.frames.size() > 1) {
    st = CheckBody(in.frames[1].data(), in.frames[1].size(), service_->limits(), &session);
  }
  if (!st.ok()) {
    Reply(in.peer, MakeReply(*header, st), "");
    return;
  }
  if (header->op == Op::kWorkerStats) {
    // Health probes are answered at once, never queued behind model work (their body is
    // not read).
    in.frames.resize(1);
    Job job;
    job.peer = std::move(in.peer);
    job.header = std::move(*header);
    job.frames = std::move(in.frames);
    Handle(std::move(job));
    return;
  }
  // Queued requests hold their bodies: at most kQueuedRequests of the largest size.
  const size_t max_queued = kQueuedRequests * service_->limits().max_request_bytes;
  if (queued_bytes_.fetch_add(bytes) + bytes > max_queued) {
    queued_bytes_.fetch_sub(bytes);
    Reply(in.peer,
          MakeReply(*header, ResourceExhausted("worker is overloaded (requests of more than " +
                                               std::to_string(max_queued) +
                                               " bytes queued: " + std::to_string(kQueuedRequests) +
                                               " x --max-request-bytes); retry later")),
          "");
    return;
  }
  // One session's requests run in order on one thread; sessionless ones spread out.
  const size_t key =
      session.empty() ? next_lane_.fetch_add(1) : std::hash<std::string_view>()(session);
  Job job;
  job.peer = std::move(in.peer);
  job.header = std::move(*header);
  job.frames = std::move(in.frames);
  job.bytes = bytes;
  job.session = std::string(session);
  const Header h = job.header;
  const std::string peer = job.peer;
  if (stopping_.load() || !pool_->Submit(key, std::move(job))) {
    queued_bytes_.fetch_sub(bytes);
    const Status refused =
        stopping_.load()
            ? Unavailable("worker is shutting down")
            : ResourceExhausted("worker is overloaded (handler queue full); retry later");
    Reply(peer, MakeReply(h, refused), "");
  }
}

void WorkerServer::Handle(Job&& job) {
  if (!job.session.empty() && !job.resumed) {
    // A learn of this session waits for its pushes: this request runs after it.
    MutexLock lock(&parked_mu_);
    if (auto it = parked_.find(job.session); it != parked_.end()) {
      if (parked_count_ < options_.max_queue * pool_->size()) {
        ++parked_count_;
        it->second.push_back(std::move(job));
        return;
      }
      queued_bytes_.fetch_sub(job.bytes);
      Reply(job.peer,
            MakeReply(job.header, ResourceExhausted("worker is overloaded (requests waiting "
                                                    "for their session's learn); retry later")),
            "");
      return;
    }
  }
  // Past here the request is answered and its session's turn passed on, whatever throws.
  const std::string_view op_name = OpName(job.header.op);
  StatusOr<nlohmann::json> body = Guarded(op_name, [&]() -> StatusOr<nlohmann::json> {
    if (job.frames.size() < 2) return nlohmann::json::object();
    return DecodeBody(job.frames[1].data(), job.frames[1].size(), service_->limits());
  });
  job.frames.clear();  // the decoded body holds what the request needs
  queued_bytes_.fetch_sub(job.bytes);
  if (job.header.op == Op::kLearn && body.ok())
    return HandleLearn(std::move(job), std::move(*body));
  StatusOr<nlohmann::json> out = Guarded(op_name, [&]() -> StatusOr<nlohmann::json> {
    if (!body.ok()) return body.status();
    return HandleWorkerOp(service_, job.header.op, *body);
  });
  Answer(job, out);
  const size_t op = static_cast<size_t>(job.header.op);
  if (op < latency_.size()) {
    latency_[op].Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job.received).count());
  }
  if (job.resumed) NextOfSession(job.session);
}

void WorkerServer::HandleLearn(Job&& job, nlohmann::json body) {
  StatusOr<LearnRequest> req =
      Guarded("learn", [&]() -> StatusOr<LearnRequest> { return LearnRequestOf(service_, body); });
  if (!req.ok()) {
    Reply(job.peer, MakeReply(job.header, req.status()), "");
    if (job.resumed) NextOfSession(job.session);
    return;
  }
  const std::string session = job.session;
  auto answered = std::make_shared<std::atomic<bool>>(false);
  // Built before the session is parked: nothing that may throw lies between the two.
  WorkerService::LearnDone done = [this, answered, job = std::move(job)](StatusOr<LearnReply> r) {
    if (answered->exchange(true)) return;
    Answer(job, r.ok() ? Guarded("learn", [&]() -> StatusOr<nlohmann::json> { return ToJson(*r); })
                       : StatusOr<nlohmann::json>(r.status()));
    latency_[static_cast<size_t>(Op::kLearn)].Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job.received).count());
    NextOfSession(job.session);
    MutexLock lock(&parked_mu_);
    if (--learns_in_flight_ == 0) learns_cv_.SignalAll();
  };
  {
    MutexLock lock(&parked_mu_);
    ++learns_in_flight_;
    // Later requests of this session wait for this learn's answer (read-your-writes).
    if (!session.empty()) parked_.try_emplace(session);
  }
  try {
    service_->LearnAsync(req->session, req->batch, done, req->context_revision);
  } catch (const std::exception& e) {
    // Before any push (the model's pass): answered here, so the session is not left
    // waiting for an answer that will never come.
    done(Internal(std::string("learn failed: ") + e.what()));
  } catch (...) {
    done(Internal("learn failed: a non-standard exception"));
  }
}

void WorkerServer::NextOfSession(const std::string& session) {
  if (session.empty()) return;
  for (;;) {
    Job next;
    {
      MutexLock lock(&parked_mu_);
      auto it = parked_.find(session);
      if (it == parked_.end()) return;
      if (it->second.empty()) {
        parked_.erase(it);  // nothing waited: the session is free
        return;
      }
      next = std::move(it->second.front());
      it->second.pop_front();
      --parked_count_;
    }
    next.resumed = true;
    const Header h = next.header;
    const std::string peer = next.peer;
    const size_t bytes = next.bytes;
    if (!stopping_.load() &&
        pool_->Submit(std::hash<std::string_view>()(session), std::move(next))) {
      return;
    }
    queued_bytes_.fetch_sub(bytes);
    Reply(peer,
          MakeReply(h, stopping_.load() ? Unavailable("worker is shutting down")
                                        : ResourceExhausted("worker is overloaded (handler "
                                                            "queue full); retry later")),
          "");
  }
}

WorkerServerStats WorkerServer::stats() const {
  WorkerServerStats s;
  s.requests = requests_.load();
  s.errors = errors_.load();
  s.dropped = pool_ ? pool_->dropped() : 0;
  s.unsent_dropped = unsent_dropped_.load();
  for (size_t op = 0; op < latency_.size(); ++op) s.latency[op] = latency_[op].Read();
  return s;
}

}  // namespace onlineps::worker
