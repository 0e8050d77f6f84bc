#include "mcp_bridge/stdio_transport.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <deque>
#include <thread>
#include <utility>

namespace onlineps::bridge {

using nlohmann::json;

StdioTransport::StdioTransport(StdioTransportOptions options, McpServer* server, std::FILE* in,
                               std::FILE* out)
    : options_(options), mcp_(server), in_(in), out_(out) {}

void StdioTransport::Write(const json& message) {
  const std::string line = message.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  MutexLock lock(&out_mu_);
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

void StdioTransport::FlushAndExit(int code) {
  MutexLock lock(&out_mu_);  // held until exit: no half-written line
  std::fflush(out_);
  std::_Exit(code);
}

size_t StdioTransport::Run() {
  Mutex mu;
  CondVar cv;
  std::deque<json> queue GUARDED_BY(mu);
  bool eof GUARDED_BY(mu) = false;
  auto session = [this] {
    MutexLock lock(&session_mu_);
    return session_id_;
  };
  auto handle = [this, &session](json m) {
    Request r;
    r.message = std::move(m);
    r.session_id = session();
    r.notify = [this](const json& n) { Write(n); };
    const RevisionChoice revision =
        ChooseRevision(r.message, r.session_id, "", TransportKind::kStdio);
    if (revision.refused()) {
      if (!revision.body.is_null()) Write(revision.body);
      return;
    }
    r.stateless = revision.stateless;
    Reply reply = mcp_->Handle(r);
    if (!reply.new_session_id.empty()) {
      std::string previous;
      {
        MutexLock lock(&session_mu_);
        previous = std::exchange(session_id_, reply.new_session_id);
      }
      if (!previous.empty()) mcp_->EndSession(previous, "");  // a worker call: not under the lock
    }
    const bool cancelled = reply.body.is_object() && reply.body.contains("error") &&
                           reply.body["error"].value("code", 0) == kRequestCancelled;
    if (!reply.body.is_null() && !cancelled) Write(reply.body);
  };
  std::thread executor([&] {
    MutexLock lock(&mu);
    while (true) {
      cv.Wait(&mu, [&]() REQUIRES(mu) { return eof || !queue.empty(); });
      if (queue.empty()) return;
      json m = std::move(queue.front());
      queue.pop_front();
      lock.Unlock();
      handle(std::move(m));
      lock.Lock();
    }
  });
  size_t messages = 0;
  std::string line;
  char buf[65536];
  bool too_long = false;
  while (std::fgets(buf, sizeof buf, in_)) {
    line += buf;
    if (line.size() > options_.max_line_bytes) too_long = true;
    if (line.empty() || line.back() != '\n') {
      if (too_long) line.clear();  // keep reading to the end of the line, storing nothing
      if (!std::feof(in_)) continue;
    }
    ++messages;
    if (too_long) {
      Write(JsonRpcError(nullptr, kInvalidRequest, "message longer than the line limit"));
      too_long = false;
      line.clear();
      continue;
    }
    if (NestsDeeperThan(line, kMaxJsonDepth)) {
      Write(JsonRpcError(nullptr, kInvalidRequest,
                         "message nests arrays or objects deeper than " +
                             std::to_string(kMaxJsonDepth) + " levels"));
      line.clear();
      continue;
    }
    json m = json::parse(line, nullptr, /*allow_exceptions=*/false);
    line.clear();
    if (m.is_discarded()) {
      Write(JsonRpcError(nullptr, kParseError, "Parse error: the line is not valid JSON"));
      continue;
    }
    // Cancellations and pings must not wait behind the call they are about.
    const std::string method = m.is_object() && m.contains("method") && m["method"].is_string()
                                   ? m["method"].get<std::string>()
                                   : std::string();
    // Cancellations, pings and the client's responses (to sampling or elicitation
    // requests a running call waits for) must not queue behind the calls they concern.
    const bool response = m.is_object() && !m.contains("method");
    if (method == "notifications/cancelled" || method == "ping" || response) {
      handle(std::move(m));
      continue;
    }
    MutexLock lock(&mu);
    if (queue.size() >= options_.max_queued) {
      if (m.is_object() && m.contains("id")) {
        Write(JsonRpcError(m["id"], kServerError, "too many queued requests; retry later"));
      }
      continue;
    }
    queue.push_back(std::move(m));
    cv.Signal();
  }
  {
    MutexLock lock(&mu);
    eof = true;
  }
  cv.Signal();
  executor.join();
  if (const std::string sid = session(); !sid.empty()) mcp_->EndSession(sid, "");
  return messages;
}

}  // namespace onlineps::bridge
