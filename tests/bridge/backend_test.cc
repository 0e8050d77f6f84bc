// Backend + WorkerPool + WorkerClient over a real ZeroMQ server that stands in for a
// worker: it answers worker_stats at once (with a body the test picks) and holds every
// other request. Covers the asynchronous call path's failure cases: a call that fails at
// once and is retried (runs its whole chain on the caller's thread), a worker at its
// in-flight cap (busy, not down), and a worker_stats reply that is not a map. And, with
// the MCP server and tools on top, a session's end racing a call of it still running.
#include "mcp_bridge/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/transport.h"
#include "common/wire.h"
#include "mcp_bridge/context_store.h"
#include "mcp_bridge/mcp_server.h"
#include "mcp_bridge/router.h"
#include "mcp_bridge/session_table.h"
#include "mcp_bridge/tools.h"
#include "mcp_bridge/worker_pool.h"

namespace onlineps::bridge {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

class StandInWorker {
 public:
  explicit StandInWorker(json stats) : stats_(std::move(stats)) {
    server_ = NewServerTransport("tcp://127.0.0.1:0");
    auto ep = server_->Start("tcp://127.0.0.1:0", [this](Incoming&& in) { OnRequest(in); });
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    endpoint_ = ep.ok() ? *ep : "";
  }
  ~StandInWorker() { server_->Stop(); }
  const std::string& endpoint() const { return endpoint_; }
  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  // From now on worker_stats is held too: the worker hangs.
  void GoSilent() { silent_ = true; }
  // From now on learns are answered at once with `status` instead of held.
  void AnswerLearns(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    learn_answer_ = std::move(status);
  }
  // From now on context_set and context_clear are answered at once, and remembered.
  void AnswerContexts() { answer_contexts_ = true; }
  // From now on context_set is held, until ReleaseContextSets answers what it holds.
  void HoldContextSets() { hold_sets_ = true; }
  void ReleaseContextSets() {
    std::vector<Held> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held.swap(held_sets_);
      hold_sets_ = false;
    }
    for (Held& h : held) Answer(h.peer, h.header, "set " + h.session);
  }
  bool WaitHeldContextSets(size_t n) {
    for (int i = 0; i < 10000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (held_sets_.size() >= n) return true;
      }
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }
  // "set SESSION" or "clear SESSION" for each context call answered, in order.
  std::vector<std::string> contexts() {
    std::lock_guard<std::mutex> lock(mu_);
    return contexts_;
  }
  bool WaitHeld(size_t n) {
    for (int i = 0; i < 10000 && held() < n; ++i) std::this_thread::sleep_for(1ms);
    return held() >= n;
  }

 private:
  void OnRequest(const Incoming& in) {
    auto h = DecodeHeader(in.frames[0].data(), in.frames[0].size());
    if (!h.ok()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (h->op == Op::kLearn && learn_answer_.has_value()) {
        (void)server_->Send(in.peer,
                            {Frame::FromString(EncodeHeader(MakeReply(*h, *learn_answer_)))});
        return;
      }
    }
    if ((h->op == Op::kContextSet || h->op == Op::kContextClear) && answer_contexts_ &&
        in.frames.size() > 1) {
      const json body =
          json::from_msgpack(std::string(in.frames[1].data(), in.frames[1].size()), true, false);
      const std::string session = body.value("session", std::string());
      if (h->op == Op::kContextSet && hold_sets_) {
        std::lock_guard<std::mutex> lock(mu_);
        held_sets_.push_back(Held{in.peer, *h, session});
        return;
      }
      Answer(in.peer, *h, std::string(h->op == Op::kContextSet ? "set " : "clear ") + session);
      return;
    }
    if (h->op != Op::kWorkerStats || silent_) {
      std::lock_guard<std::mutex> lock(mu_);
      ++held_;  // never answered
      return;
    }
    (void)server_->Send(in.peer, {Frame::FromString(EncodeHeader(MakeReply(*h, Status::Ok()))),
                                  Frame::FromVector(json::to_msgpack(stats_))});
  }

  struct Held {
    std::string peer;
    Header header;
    std::string session;
  };
  // Answers a context call, noting `what` in contexts_.
  void Answer(const std::string& peer, const Header& h, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      contexts_.push_back(what);
    }
    (void)server_->Send(peer, {Frame::FromString(EncodeHeader(MakeReply(h, Status::Ok()))),
                               Frame::FromVector(json::to_msgpack(json::object()))});
  }

  const json stats_;
  std::unique_ptr<ServerTransport> server_;
  std::string endpoint_;
  std::mutex mu_;
  size_t held_ = 0;
  std::atomic<bool> silent_{false};
  std::atomic<bool> answer_contexts_{false};
  std::atomic<bool> hold_sets_{false};
  std::vector<std::string> contexts_;   // guarded by mu_
  std::vector<Held> held_sets_;         // guarded by mu_
  std::optional<Status> learn_answer_;  // guarded by mu_
};

// The parts of a bridge below the MCP layer. Heap-allocated and never freed when a test
// fails by timing out, so a thread stuck inside them touches no freed memory.
struct Parts {
  explicit Parts(std::vector<std::string> endpoints, BackendOptions b = {},
                 std::chrono::milliseconds health_timeout = 1000ms)
      : router(RouterOptions{}), contexts(ContextStoreOptions{}) {
    WorkerPoolOptions o;
    o.endpoints = std::move(endpoints);
    o.health_timeout = health_timeout;
    o.health_interval = std::chrono::hours(1);  // probes only when a call fails
    pool = std::make_unique<WorkerPool>(o, &router);
    backend = std::make_unique<Backend>(b, &router, pool.get(), &contexts);
  }
  Router router;
  ContextStore contexts;
  std::unique_ptr<WorkerPool> pool;
  std::unique_ptr<Backend> backend;
};

// Runs backend.Call on a thread of its own; the status, or nullopt when it did not come
// back within `limit` (the thread is then left behind, with `parts`).
std::optional<Status> CallWithin(Parts* parts, const std::string& session, Op op,
                                 std::chrono::milliseconds limit) {
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> f = result->get_future();
  std::thread([parts, session, op, result] {
    result->set_value(parts->backend->Call(session, op, json::object()).status());
  }).detach();
  if (f.wait_for(limit) != std::future_status::ready) return std::nullopt;
  return f.get();
}

TEST(BackendTest, AnInferThatFailsAtOnceIsRetriedWithoutDeadlock) {
  // The ring names a worker the pool cannot reach: the call, its probe and its retry all
  // fail on the caller's thread, inside one another's callbacks.
  auto* parts = new Parts({});
  parts->router.AddWorker("tcp://127.0.0.1:9");
  std::optional<Status> st = CallWithin(parts, "s", Op::kInfer, 5000ms);
  ASSERT_TRUE(st.has_value()) << "the call never came back (deadlock)";
  EXPECT_EQ(st->code(), StatusCode::kUnavailable) << st->ToString();
  // And with a context to send first (the other path into the call).
  ASSERT_TRUE(parts->contexts.Set("c", {"some context"}, {}).ok());
  st = CallWithin(parts, "c", Op::kInfer, 5000ms);
  ASSERT_TRUE(st.has_value()) << "the call with a context never came back (deadlock)";
  EXPECT_EQ(st->code(), StatusCode::kUnavailable) << st->ToString();
  delete parts;
}

TEST(BackendTest, AWorkerAtItsInflightCapIsBusyNotDown) {
  StandInWorker worker({{"instance", "stand-in"}, {"labels", json::array()}});
  auto* parts = new Parts({worker.endpoint()});
  ASSERT_TRUE(parts->pool->Start().ok());
  ASSERT_EQ(parts->pool->healthy(), 1u);
  // Fill the client's asynchronous share (its default limit) with calls the worker holds.
  const size_t limit = worker::WorkerClientOptions{}.max_inflight -
                       worker::WorkerClientOptions{}.reserved_for_blocking;
  std::atomic<size_t> ended{0};
  for (size_t i = 0; i < limit; ++i) {
    parts->pool->CallAsync(worker.endpoint(), Op::kInfer, json::object(), 60000ms,
                           [&](StatusOr<json>) { ++ended; });
  }
  ASSERT_TRUE(worker.WaitHeld(limit));
  ASSERT_EQ(ended.load(), 0u);
  // A call with a context to send, and one without: both refused as busy, at once.
  ASSERT_TRUE(parts->contexts.Set("with-context", {"some context"}, {}).ok());
  for (const char* session : {"with-context", "plain"}) {
    std::optional<Status> st = CallWithin(parts, session, Op::kInfer, 5000ms);
    ASSERT_TRUE(st.has_value()) << session;
    EXPECT_EQ(st->code(), StatusCode::kResourceExhausted) << session << ": " << st->ToString();
  }
  // Nothing probed it down, and the calls it holds are still in flight.
  EXPECT_EQ(parts->pool->healthy(), 1u);
  EXPECT_EQ(ended.load(), 0u);
  // A health probe still gets through (the blocking share).
  EXPECT_TRUE(parts->pool->ReportFailure(worker.endpoint()));
  parts->pool->Stop();  // ends the held calls: no callback after this
  EXPECT_EQ(ended.load(), limit);
  delete parts;
}

TEST(BackendTest, AWorkerStatsReplyThatIsNotAMapIsAFailedProbeNotALostCall) {
  StandInWorker worker(json::array({1}));
  BackendOptions b;
  b.infer_timeout = 300ms;
  auto* parts = new Parts({worker.endpoint()}, b);
  ASSERT_TRUE(parts->pool->Start().ok());
  EXPECT_EQ(parts->pool->healthy(), 0u);
  const auto workers = parts->pool->Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_NE(workers[0].last_error.find("not a map"), std::string::npos) << workers[0].last_error;
  // Routed there anyway: the infer is held, times out, and its probe gets the bad reply.
  parts->router.AddWorker(worker.endpoint());
  std::optional<Status> st = CallWithin(parts, "s", Op::kInfer, 5000ms);
  ASSERT_TRUE(st.has_value()) << "the call never came back";
  EXPECT_FALSE(st->ok());
  parts->pool->Stop();
  delete parts;
}

// A worker that answers its probes but not an infer (stuck, e.g. waiting on a PS shard):
// the infer times out once. Its retry would go to the same worker and wait as long again.
TEST(BackendTest, AnInferThatTimesOutOnAWorkerStillInTheRingIsNotSentThereAgain) {
  StandInWorker worker({{"instance", "stand-in"}, {"labels", json::array()}});
  BackendOptions b;
  b.infer_timeout = 300ms;
  auto* parts = new Parts({worker.endpoint()}, b);
  ASSERT_TRUE(parts->pool->Start().ok());
  ASSERT_EQ(parts->pool->healthy(), 1u);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<Status> st = CallWithin(parts, "s", Op::kInfer, 5000ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(st.has_value()) << "the call never came back";
  EXPECT_EQ(st->code(), StatusCode::kDeadlineExceeded) << st->ToString();
  EXPECT_EQ(worker.held(), 1u) << "the infer was sent to the same stuck worker again";
  EXPECT_LT(took, 550ms);
  EXPECT_EQ(parts->pool->healthy(), 1u);
  parts->pool->Stop();
  delete parts;
}

// A worker that hangs: once the probes take it out of the ring, its calls end there and
// then, without probing the departed worker once more (a health timeout later).
TEST(BackendTest, ACallEndedBecauseItsWorkerLeftTheRingEndsWithoutAnotherProbe) {
  StandInWorker worker({{"instance", "stand-in"}, {"labels", json::array()}});
  BackendOptions b;
  b.learn_timeout = 60000ms;
  auto* parts = new Parts({worker.endpoint()}, b, /*health_timeout=*/800ms);
  ASSERT_TRUE(parts->pool->Start().ok());
  ASSERT_EQ(parts->pool->healthy(), 1u);
  auto learn = std::async(std::launch::async, [parts] {
    const Status s = parts->backend->Call("s", Op::kLearn, json::object()).status();
    return std::make_pair(s, std::chrono::steady_clock::now());
  });
  ASSERT_TRUE(worker.WaitHeld(1));
  worker.GoSilent();
  // Two failed probes take it out of the ring (failures_to_down), which ends the learn.
  EXPECT_FALSE(parts->pool->ReportFailure(worker.endpoint()));
  if (parts->pool->healthy() > 0) {
    EXPECT_FALSE(parts->pool->ReportFailure(worker.endpoint()));
  }
  const auto left = std::chrono::steady_clock::now();
  ASSERT_EQ(parts->pool->healthy(), 0u);
  ASSERT_EQ(learn.wait_for(5000ms), std::future_status::ready) << "the learn never ended";
  const auto [status, ended] = learn.get();
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status.ToString();
  EXPECT_NE(status.message().find("left the ring"), std::string::npos) << status.ToString();
  EXPECT_LT(ended - left, 300ms) << "the learn waited for another probe of the departed worker";
  parts->pool->Stop();
  delete parts;
}

// A call the worker never answered says so (worker::kNoWorkerAnswer); a DEADLINE_EXCEEDED
// the worker answered itself (its PS push timed out) does not: the bridge's learn error
// names the right cause of the unknown outcome from it.
TEST(BackendTest, ACallTheWorkerNeverAnsweredIsToldFromOneItAnsweredAsTimedOut) {
  StandInWorker worker({{"instance", "stand-in"}, {"labels", json::array()}});
  BackendOptions b;
  b.learn_timeout = 300ms;
  auto* parts = new Parts({worker.endpoint()}, b);
  ASSERT_TRUE(parts->pool->Start().ok());
  std::optional<Status> held = CallWithin(parts, "s", Op::kLearn, 5000ms);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->code(), StatusCode::kDeadlineExceeded) << held->ToString();
  EXPECT_NE(held->message().find(worker::kNoWorkerAnswer), std::string::npos) << held->ToString();
  worker.AnswerLearns(DeadlineExceeded("push_batch on shard 0 got no answer in 5000 ms"));
  std::optional<Status> answered = CallWithin(parts, "s", Op::kLearn, 5000ms);
  ASSERT_TRUE(answered.has_value());
  EXPECT_EQ(answered->code(), StatusCode::kDeadlineExceeded) << answered->ToString();
  EXPECT_EQ(answered->message().find(worker::kNoWorkerAnswer), std::string::npos)
      << answered->ToString();
  parts->pool->Stop();
  delete parts;
}

// A session whose context was sent to one worker, then moved to a joining worker before
// its next call: ending it (or clearing its context) must drop the copy where it is, on
// the first worker, not only on the session's new owner, which holds none.
TEST(BackendTest, EndingASessionThatMovedDropsItsContextWhereItWasSent) {
  StandInWorker a({{"instance", "a"}, {"labels", json::array()}});
  StandInWorker b({{"instance", "b"}, {"labels", json::array()}});
  a.AnswerContexts();
  b.AnswerContexts();
  auto* parts = new Parts({a.endpoint(), b.endpoint()});
  ASSERT_TRUE(parts->pool->Start().ok());
  ASSERT_EQ(parts->pool->healthy(), 2u);
  parts->router.RemoveWorker(b.endpoint());  // b joins later (no probe puts it back)
  std::vector<std::string> sessions;
  for (int i = 0; i < 40; ++i) {
    const std::string s = "m:" + std::to_string(i);
    ASSERT_EQ(parts->router.Route(s).value(), a.endpoint());
    ASSERT_TRUE(parts->contexts.Set(s, {"private " + s}, {}).ok());
    ASSERT_TRUE(parts->backend->SyncContext(s).ok());
    sessions.push_back(s);
  }
  ASSERT_TRUE(parts->router.AddWorker(b.endpoint()));
  std::vector<std::string> moved;
  for (const std::string& s : sessions) {
    if (parts->router.OwnerOf(s) == b.endpoint()) moved.push_back(s);
  }
  ASSERT_GE(moved.size(), 2u);
  // One ends (DELETE, expiry), one has its context cleared (clear_context).
  parts->contexts.Clear(moved[0]);
  parts->backend->EndSession(moved[0]);
  parts->contexts.Clear(moved[1]);
  (void)parts->backend->SyncContext(moved[1]);
  const std::vector<std::string> on_a = a.contexts();
  for (const std::string& s : {moved[0], moved[1]}) {
    EXPECT_NE(std::find(on_a.begin(), on_a.end(), "clear " + s), on_a.end())
        << s << "'s context was left on " << a.endpoint() << ", the worker that holds it";
  }
  parts->pool->Stop();
  delete parts;
}

// A set_context still running (its context on the way to the session's worker) when the
// session's DELETE arrives: the end must win. Before, the DELETE's clear ran first and
// the set landed after it: the worker kept the ended session's private context (until
// its TTL), and the bridge a record of that copy, forever.
TEST(SessionEndTest, ASetContextRunningWhenItsSessionEndsLeavesNoContextBehind) {
  StandInWorker worker({{"instance", "stand-in"}, {"labels", json::array()}});
  worker.AnswerContexts();
  auto* parts = new Parts({worker.endpoint()});
  ASSERT_TRUE(parts->pool->Start().ok());
  ASSERT_EQ(parts->pool->healthy(), 1u);
  auto tools = std::make_unique<Tools>(ToolsOptions{}, parts->backend.get(), &parts->contexts,
                                       parts->pool.get(), &parts->router);
  auto server = std::make_unique<McpServer>(McpServerOptions{}, tools.get(), nullptr,
                                            [parts](const std::string& key) {
                                              parts->contexts.Clear(key);
                                              parts->backend->EndSession(key);
                                            });
  auto send = [&](const std::string& sid, const std::string& method, json params) {
    Request req;
    req.message = {{"jsonrpc", "2.0"}, {"id", 1}, {"method", method}, {"params", params}};
    req.session_id = sid;
    return server->Handle(req);
  };
  const std::string sid =
      send("", "initialize", {{"protocolVersion", "2025-11-25"}}).new_session_id;
  ASSERT_FALSE(sid.empty());
  const std::string key = SessionTable::KeyOf("", sid);
  ASSERT_EQ(parts->router.Route(key).value(), worker.endpoint());  // placed: the set syncs

  worker.HoldContextSets();
  Reply set_reply;
  std::thread set([&] {
    set_reply =
        send(sid, "tools/call", {{"name", "set_context"}, {"arguments", {{"items", {"private"}}}}});
  });
  ASSERT_TRUE(worker.WaitHeldContextSets(1));
  std::atomic<bool> ended{false};
  std::thread end([&] { ended = server->EndSession(sid, ""); });
  std::this_thread::sleep_for(200ms);  // the end arrives while the set is at the worker
  worker.ReleaseContextSets();
  set.join();
  end.join();
  EXPECT_TRUE(ended.load());
  EXPECT_FALSE(parts->contexts.Get(key).has_value()) << "the ended session's context is back";
  const std::vector<std::string> seen = worker.contexts();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), "clear " + key)
      << "the worker keeps the ended session's context; its context calls were: "
      << testing::PrintToString(seen);
  server.reset();
  tools.reset();
  parts->pool->Stop();
  delete parts;
}

}  // namespace
}  // namespace onlineps::bridge
