#include "worker/worker_server.h"

#include <spdlog/spdlog.h>

#include "common/wire.h"
#include "worker/worker_rpc.h"

namespace onlineps::worker {

struct WorkerServer::Job {
  std::string peer;
  Header header;
  nlohmann::json body;
};

WorkerServer::WorkerServer(WorkerService* service, WorkerServerOptions options)
    : service_(service), options_(std::move(options)) {}

WorkerServer::~WorkerServer() { Stop(); }

StatusOr<std::string> WorkerServer::Start() {
  pool_ = std::make_unique<HandlerPool<Job>>("worker", options_.handler_threads, options_.max_queue,
                                             [this](Job&& job) { Handle(std::move(job)); });
  TransportOptions t = options_.transport;
  // The transport's own thread only decodes and routes; the pool runs the model.
  t.handler_threads = 1;
  transport_ = NewServerTransport(options_.listen, t);
  return transport_->Start(options_.listen, [this](Incoming&& in) { OnMessage(std::move(in)); });
}

void WorkerServer::Stop() {
  // New requests are refused from here on; queued ones finish and their replies go out
  // before the transport closes.
  if (transport_ == nullptr || stopping_.exchange(true)) return;
  if (pool_) pool_->Close();
  transport_->Stop();
}

void WorkerServer::Reply(const std::string& peer, const Header& reply, const std::string& body) {
  if (reply.code != StatusCode::kOk) errors_.fetch_add(1, std::memory_order_relaxed);
  Frames frames{Frame::FromString(EncodeHeader(reply))};
  if (!body.empty()) frames.push_back(Frame::FromString(body));
  Status st = transport_ ? transport_->Send(peer, std::move(frames)) : Status::Ok();
  if (!st.ok()) spdlog::debug("reply not sent: {}", st.ToString());
}

void WorkerServer::OnMessage(Incoming&& in) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  size_t bytes = 0;
  for (const Frame& f : in.frames) bytes += f.size();
  auto header = in.frames.empty() ? StatusOr<Header>(Status(StatusCode::kMalformed, "no frames"))
                                  : DecodeHeader(in.frames[0].data(), in.frames[0].size());
  if (!header.ok()) {
    Header req;  // no request id to echo: the client matches nothing and times out
    Reply(in.peer, MakeReply(req, header.status()), "");
    return;
  }
  Status st;
  if (bytes > options_.max_message_bytes) {
    st = Status(StatusCode::kTooLarge, "request is " + std::to_string(bytes) + " bytes; at most " +
                                           std::to_string(options_.max_message_bytes));
  } else if (!IsWorkerOp(header->op)) {
    st = Status(StatusCode::kUnknownOp,
                std::string(OpName(header->op)) + " is not a worker op (is this a PS endpoint?)");
  }
  StatusOr<nlohmann::json> body = in.frames.size() > 1
                                      ? DecodeBody(in.frames[1].data(), in.frames[1].size())
                                      : StatusOr<nlohmann::json>(nlohmann::json::object());
  if (st.ok() && !body.ok()) st = body.status();
  std::string session;
  if (st.ok()) {
    auto s = SessionOf(*body, 256);
    st = s.status();
    if (s.ok()) session = *s;
  }
  if (!st.ok()) {
    Reply(in.peer, MakeReply(*header, st), "");
    return;
  }
  // One session's requests run in order on one thread; sessionless ones spread out.
  const size_t key = session.empty() ? next_lane_.fetch_add(1) : std::hash<std::string>()(session);
  Job job{std::move(in.peer), std::move(*header), std::move(*body)};
  const Header h = job.header;
  const std::string peer = job.peer;
  if (stopping_.load() || !pool_->Submit(key, std::move(job))) {
    const Status refused = stopping_.load()
                               ? Status(StatusCode::kUnavailable, "worker is shutting down")
                               : Status(StatusCode::kResourceExhausted,
                                        "worker is overloaded (handler queue full); retry later");
    Reply(peer, MakeReply(h, refused), "");
  }
}

void WorkerServer::Handle(Job&& job) {
  StatusOr<nlohmann::json> out = HandleWorkerOp(service_, job.header.op, job.body);
  if (!out.ok()) {
    spdlog::debug("{} failed: {}", OpName(job.header.op), out.status().ToString());
    Reply(job.peer, MakeReply(job.header, out.status()), "");
    return;
  }
  Reply(job.peer, MakeReply(job.header, Status::Ok()), EncodeBody(*out));
}

WorkerServerStats WorkerServer::stats() const {
  WorkerServerStats s;
  s.requests = requests_.load();
  s.errors = errors_.load();
  s.dropped = pool_ ? pool_->dropped() : 0;
  return s;
}

}  // namespace onlineps::worker
