// WorkerClient over a real ZeroMQ server transport that answers only when the test says:
// CallAsync returns before the reply and hands it over on another thread, exactly once;
// past max_inflight an asynchronous call is refused at once as "busy" (not sent, not a
// deadline), while a blocking one waits for a free id; deadlines and the synchronous
// form end calls as before.
#include "worker/worker_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/transport.h"
#include "common/wire.h"

namespace onlineps::worker {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// A worker stand-in: keeps every request; Answer(i) replies to the i-th with {"n": i}.
class HeldServer {
 public:
  HeldServer() : server_(NewServerTransport("tcp://127.0.0.1:0")) {
    auto ep = server_->Start("tcp://127.0.0.1:0", [this](Incoming&& in) {
      std::lock_guard<std::mutex> lock(mu_);
      held_.push_back(std::move(in));
    });
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    endpoint_ = ep.ok() ? *ep : "";
  }
  ~HeldServer() { server_->Stop(); }
  const std::string& endpoint() const { return endpoint_; }
  size_t received() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  bool WaitFor(size_t n) {
    for (int i = 0; i < 5000 && received() < n; ++i) std::this_thread::sleep_for(1ms);
    return received() >= n;
  }
  void Answer(size_t i) {
    Incoming in;
    {
      std::lock_guard<std::mutex> lock(mu_);
      in.peer = held_[i].peer;
      in.frames = held_[i].frames;
    }
    auto h = DecodeHeader(in.frames[0].data(), in.frames[0].size());
    ASSERT_TRUE(h.ok());
    const Header reply = MakeReply(*h, Status::Ok());
    ASSERT_TRUE(server_
                    ->Send(in.peer, {Frame::FromString(EncodeHeader(reply)),
                                     Frame::FromVector(json::to_msgpack(json{{"n", i}}))})
                    .ok());
  }

 private:
  std::unique_ptr<ServerTransport> server_;
  std::string endpoint_;
  std::mutex mu_;
  std::vector<Incoming> held_;
};

std::unique_ptr<WorkerClient> Connect(const std::string& endpoint, size_t max_inflight) {
  WorkerClientOptions o;
  o.endpoint = endpoint;
  o.max_inflight = max_inflight;
  auto c = WorkerClient::Connect(o);
  EXPECT_TRUE(c.ok());
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(WorkerClientTest, AsyncCallsAnswerLaterOnAnotherThreadEachOnce) {
  HeldServer server;
  std::mutex mu;
  std::vector<std::optional<StatusOr<json>>> got(3);
  std::vector<int> times(3, 0);
  std::vector<std::thread::id> threads(3);
  auto client = Connect(server.endpoint(), 16);  // after what its callbacks touch
  for (int i = 0; i < 3; ++i) {
    client->CallAsync(Op::kInfer, {{"i", i}}, 5000ms, [&, i](StatusOr<json> r) {
      std::lock_guard<std::mutex> lock(mu);
      got[i] = std::move(r);
      ++times[i];
      threads[i] = std::this_thread::get_id();
    });
  }
  ASSERT_TRUE(server.WaitFor(3));
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& g : got) EXPECT_FALSE(g.has_value());  // nothing answered yet
  }
  server.Answer(2);
  server.Answer(0);
  server.Answer(1);
  for (int i = 0; i < 5000; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (got[0] && got[1] && got[2]) break;
    }
    std::this_thread::sleep_for(1ms);  // without the lock: the callbacks need it
  }
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    ASSERT_TRUE(got[i]->ok()) << got[i]->status().ToString();
    EXPECT_EQ((**got[i])["n"], i);  // each call got its own reply
    EXPECT_EQ(times[i], 1);
    EXPECT_NE(threads[i], std::this_thread::get_id());
  }
}

TEST(WorkerClientTest, PastMaxInflightAnAsyncCallIsRefusedAtOnceAndNotSent) {
  HeldServer server;
  std::atomic<int> answered{0};
  std::optional<Status> third;
  auto client = Connect(server.endpoint(), 2);  // after what its callbacks touch
  for (int i = 0; i < 2; ++i) {
    client->CallAsync(Op::kInfer, json::object(), 5000ms, [&](StatusOr<json>) { ++answered; });
  }
  ASSERT_TRUE(server.WaitFor(2));
  const auto t0 = std::chrono::steady_clock::now();
  client->CallAsync(Op::kInfer, json::object(), 5000ms,
                    [&](StatusOr<json> r) { third = r.status(); });
  ASSERT_TRUE(third.has_value());  // on this thread, before CallAsync returned
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(third->code(), StatusCode::kResourceExhausted) << third->ToString();
  EXPECT_NE(third->message().find("not sent"), std::string::npos) << third->ToString();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(server.received(), 2u);
  // A blocking call waits for an id instead, and goes out once one is free.
  std::thread answer([&] {
    std::this_thread::sleep_for(100ms);
    server.Answer(0);
    server.WaitFor(3);
    server.Answer(2);
  });
  StatusOr<json> r = client->Call(Op::kInfer, json::object(), 5000ms);
  answer.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["n"], 2);
  EXPECT_EQ(answered.load(), 1);
}

TEST(WorkerClientTest, AsyncCallsLeaveRoomForBlockingOnes) {
  HeldServer server;
  std::atomic<int> busy{0};
  auto client = Connect(server.endpoint(), 8);  // 8 / 4 = 2 ids kept for blocking calls
  for (int i = 0; i < 7; ++i) {
    client->CallAsync(Op::kInfer, json::object(), 5000ms, [&](StatusOr<json> r) {
      if (r.status().code() == StatusCode::kResourceExhausted) ++busy;
    });
  }
  EXPECT_EQ(busy.load(), 1);  // the 7th: 6 in flight is the asynchronous limit
  ASSERT_TRUE(server.WaitFor(6));
  std::thread answer([&] {
    server.WaitFor(7);
    server.Answer(6);
  });
  StatusOr<json> r = client->Call(Op::kWorkerStats, json::object(), 5000ms);  // a probe
  answer.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["n"], 6);
}

TEST(WorkerClientTest, AfterShutdownNoCallbackRunsAndCallsAreRefused) {
  HeldServer server;
  std::atomic<int> ended{0};
  Status later;
  auto client = Connect(server.endpoint(), 16);
  for (int i = 0; i < 3; ++i) {
    client->CallAsync(Op::kLearn, json::object(), 60000ms, [&](StatusOr<json> r) {
      if (r.status().code() == StatusCode::kDeadlineExceeded) ++ended;
    });
  }
  ASSERT_TRUE(server.WaitFor(3));
  client->Shutdown("test");
  EXPECT_EQ(ended.load(), 3);  // ended, outcome unknown
  client->CallAsync(Op::kInfer, json::object(), 1000ms,
                    [&](StatusOr<json> r) { later = r.status(); });
  EXPECT_EQ(later.code(), StatusCode::kCancelled) << later.ToString();
  server.Answer(0);  // a late reply finds no one
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(ended.load(), 3);
  EXPECT_EQ(server.received(), 3u);
}

TEST(WorkerClientTest, AnUnansweredAsyncCallEndsAtItsDeadline) {
  HeldServer server;
  std::atomic<bool> done{false};
  Status status;
  std::atomic<int> failed{0};
  auto client = Connect(server.endpoint(), 16);  // after what its callbacks touch
  const auto t0 = std::chrono::steady_clock::now();
  client->CallAsync(Op::kLearn, json::object(), 200ms, [&](StatusOr<json> r) {
    status = r.status();
    done = true;
  });
  for (int i = 0; i < 5000 && !done; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(done.load());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 190ms);
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status.ToString();
  // FailInFlight ends the others at once.
  for (int i = 0; i < 3; ++i) {
    client->CallAsync(Op::kInfer, json::object(), 60000ms, [&](StatusOr<json> r) {
      if (r.status().code() == StatusCode::kDeadlineExceeded) ++failed;
    });
  }
  client->FailInFlight("test");
  EXPECT_EQ(failed.load(), 3);
}

}  // namespace
}  // namespace onlineps::worker
