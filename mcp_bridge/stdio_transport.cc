#include "mcp_bridge/stdio_transport.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <utility>

namespace onlineps::bridge {

using nlohmann::json;

StdioTransport::StdioTransport(StdioTransportOptions options, McpServer* server, std::FILE* in,
                               std::FILE* out)
    : options_(options), mcp_(server), in_(in), out_(out) {}

void StdioTransport::Write(const json& message) {
  WriteLine(message.dump(-1, ' ', false, json::error_handler_t::replace));
}

void StdioTransport::WriteLine(std::string line) {
  line += '\n';
  MutexLock lock(&out_mu_);
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

void StdioTransport::FlushAndExit(int code) {
  MutexLock lock(&out_mu_);  // held until exit: no half-written line
  std::fflush(out_);
  std::_Exit(code);
}

namespace {

// Reads one line: the bytes up to '\n' (not kept), NUL bytes included. Keeps at most
// `max` bytes and sets *too_long when more came. False at EOF with nothing read.
bool ReadLine(std::FILE* in, size_t max, std::string* line, bool* too_long) {
  line->clear();
  *too_long = false;
  bool any = false;
  flockfile(in);
  for (int c; (c = getc_unlocked(in)) != EOF;) {
    any = true;
    if (c == '\n') break;
    if (line->size() < max) {
      line->push_back(static_cast<char>(c));
    } else {
      *too_long = true;
    }
  }
  funlockfile(in);
  return any;
}

}  // namespace

size_t StdioTransport::Run() {
  // Two lanes, each a thread that runs its queue in arrival order: requests that wait
  // their turn (McpServer::Ordered), and calls of the tools the bridge answers alone
  // (get_context, model_info), which never wait behind a worker call.
  constexpr int kOrdered = 0, kAside = 1;
  Mutex mu;
  CondVar cv;
  std::deque<json> queues[2] GUARDED_BY(mu);
  bool eof GUARDED_BY(mu) = false;
  // The stateless (2026-07-28) requests running, by id: their cancel flags, which
  // notifications/cancelled sets (a stateful request's are its session's).
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> stateless_calls GUARDED_BY(mu);
  auto session = [this] {
    MutexLock lock(&session_mu_);
    return session_id_;
  };
  auto handle = [this, &session, &mu, &stateless_calls](json m) {
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
    std::string call_id;
    if (r.stateless && r.message.is_object() && r.message.contains("id")) {
      call_id = r.message["id"].dump();
      r.cancelled = std::make_shared<std::atomic<bool>>(false);
      MutexLock lock(&mu);
      if (!stateless_calls.emplace(call_id, r.cancelled).second) call_id.clear();  // reused
    }
    Reply reply = mcp_->Handle(r);
    if (!call_id.empty()) {
      MutexLock lock(&mu);
      stateless_calls.erase(call_id);
    }
    if (!reply.new_session_id.empty()) {
      std::string previous;
      {
        MutexLock lock(&session_mu_);
        previous = std::exchange(session_id_, reply.new_session_id);
      }
      if (!previous.empty()) mcp_->EndSession(previous, "");  // a worker call: not under the lock
    }
    if (reply.has_body() && !reply.cancelled()) WriteLine(reply.Text());
  };
  auto lane = [&](int index) {
    MutexLock lock(&mu);
    while (true) {
      cv.Wait(&mu, [&]() REQUIRES(mu) { return eof || !queues[index].empty(); });
      if (queues[index].empty()) return;
      json m = std::move(queues[index].front());
      queues[index].pop_front();
      lock.Unlock();
      handle(std::move(m));
      lock.Lock();
    }
  };
  std::thread ordered([&] { lane(kOrdered); });
  std::thread aside([&] { lane(kAside); });
  size_t messages = 0;
  std::string line;
  bool too_long = false;
  while (ReadLine(in_, options_.max_line_bytes, &line, &too_long)) {
    ++messages;
    if (too_long) {
      Write(JsonRpcError(nullptr, kInvalidRequest,
                         "Invalid Request: the line is longer than " +
                             std::to_string(options_.max_line_bytes) +
                             " bytes, the most one stdio message may hold"));
      continue;
    }
    if (NestsDeeperThan(line, kMaxJsonDepth)) {
      Write(JsonRpcError(nullptr, kInvalidRequest,
                         "message nests arrays or objects deeper than " +
                             std::to_string(kMaxJsonDepth) + " levels"));
      continue;
    }
    json m = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (m.is_discarded()) {
      Write(JsonRpcError(nullptr, kParseError, "Parse error: the line is not valid JSON"));
      continue;
    }
    const std::string method = m.is_object() && m.contains("method") && m["method"].is_string()
                                   ? m["method"].get<std::string>()
                                   : std::string();
    if (method == "notifications/cancelled") {
      // A request still queued is dropped unanswered, as the spec asks of a cancelled
      // one (but initialize, which MUST NOT be cancelled); one already running is
      // cancelled by the server.
      const json& params = m.value("params", json::object());
      if (params.is_object() && params.contains("requestId")) {
        const json& id = params["requestId"];
        MutexLock lock(&mu);
        if (auto running = stateless_calls.find(id.dump()); running != stateless_calls.end()) {
          running->second->store(true);
        }
        for (auto& q : queues) {
          q.erase(std::remove_if(q.begin(), q.end(),
                                 [&](const json& r) {
                                   return r.is_object() && r.contains("id") && r["id"] == id &&
                                          r.value("method", json()) != "initialize";
                                 }),
                  q.end());
        }
      }
    }
    // Cancellations, pings and the client's responses (to sampling or elicitation
    // requests a running call waits for) must not queue behind the calls they concern.
    const bool response = m.is_object() && !m.contains("method");
    if (method == "notifications/cancelled" || method == "ping" || response) {
      handle(std::move(m));
      continue;
    }
    const int index = mcp_->Ordered(m) ? kOrdered : kAside;
    MutexLock lock(&mu);
    if (queues[index].size() >= options_.max_queued) {
      if (m.is_object() && m.contains("id")) {
        Write(JsonRpcError(m["id"], kServerError, "too many queued requests; retry later"));
      }
      continue;
    }
    queues[index].push_back(std::move(m));
    cv.SignalAll();
  }
  {
    MutexLock lock(&mu);
    eof = true;
  }
  cv.SignalAll();
  ordered.join();
  aside.join();
  if (const std::string sid = session(); !sid.empty()) mcp_->EndSession(sid, "");
  return messages;
}

}  // namespace onlineps::bridge
