// One suite run against every transport: ZeroMQ over loopback TCP and in-process mem://.
#include "common/transport.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mem_transport.h"
#include "common/zmq_transport.h"
#include "tests/subprocess.h"

namespace onlineps {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr auto kWait = 5s;

Frame F(std::string s) { return Frame::FromString(std::move(s)); }

Frame U64(uint64_t v) { return Frame::FromVector(std::vector<uint64_t>{v}); }

uint64_t AsU64(const Frame& f) { return f.CountOf<uint64_t>() == 1 ? *f.As<uint64_t>() : ~0ull; }

// Collects what a client's Handler receives.
class Inbox {
 public:
  ClientTransport::Handler Handler() {
    return [this](size_t server, Frames&& frames) {
      std::lock_guard<std::mutex> lock(mu_);
      items_.emplace_back(server, std::move(frames));
      cv_.notify_all();
    };
  }
  // Waits until `n` messages have arrived in all; false on timeout.
  bool WaitFor(size_t n, std::chrono::milliseconds timeout = kWait) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return items_.size() >= n; });
  }
  std::vector<std::pair<size_t, Frames>> Items() {
    std::lock_guard<std::mutex> lock(mu_);
    return items_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<size_t, Frames>> items_;
};

// Polls `done` until true or kWait passes.
template <typename Pred>
bool Eventually(Pred done) {
  const auto deadline = Clock::now() + kWait;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Runs `fn` on another thread and fails if it has not returned within kWait. A hung
// thread cannot be joined, so that failure ends the process instead of hanging ctest.
template <typename Fn>
void FinishesInTime(const char* what, Fn fn) {
  auto done = std::async(std::launch::async, std::move(fn));
  if (done.wait_for(kWait) == std::future_status::ready) return;
  std::cerr << "FAILED: " << what << " still running after " << kWait.count() << " s\n";
  std::_Exit(1);
}

// Runs `fn` when it goes out of scope. Tests declare one after the locals their
// handlers use, so the server stops before those locals die on every exit path.
template <typename Fn>
class Cleanup {
 public:
  explicit Cleanup(Fn fn) : fn_(std::move(fn)) {}
  ~Cleanup() { fn_(); }

 private:
  Fn fn_;
};

using onlineps::testing::FreePort;

uint64_t Dropped(ServerTransport* server) {
  if (auto* zmq = dynamic_cast<ZmqServerTransport*>(server)) return zmq->dropped();
  if (auto* mem = dynamic_cast<MemServerTransport*>(server)) return mem->dropped();
  ADD_FAILURE() << "unknown transport type";
  return 0;
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  bool IsZmq() const { return GetParam() == "zmq-tcp"; }

  std::string FreshEndpoint() const {
    if (IsZmq()) return "tcp://127.0.0.1:0";
    static std::atomic<int> next{0};
    return "mem://transport-test-" + std::to_string(next++);
  }

  // Starts server_ on a fresh endpoint and sets endpoint_ to where it is bound.
  void StartServer(ServerTransport::Handler handler, TransportOptions options = {}) {
    const std::string endpoint = FreshEndpoint();
    server_ = NewServerTransport(endpoint, options);
    StatusOr<std::string> bound = server_->Start(endpoint, std::move(handler));
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    endpoint_ = *bound;
  }
  void StopServer() {
    if (server_) server_->Stop();
  }
  // Replies to each request with its own frames, from the handler thread.
  void StartEchoServer(TransportOptions options = {}) {
    StartServer([this](Incoming&& in) { EXPECT_TRUE(server_->Send(in.peer, in.frames).ok()); },
                options);
  }
  std::unique_ptr<ClientTransport> Connect(const std::string& endpoint, Inbox* inbox,
                                           TransportOptions options = {}) {
    auto client = NewClientTransport({endpoint}, options);
    Status connected = client->Connect({endpoint}, inbox->Handler());
    EXPECT_TRUE(connected.ok()) << connected.ToString();
    return client;
  }

  std::unique_ptr<ServerTransport> server_;
  std::string endpoint_;
};

TEST_P(TransportTest, RoundTripsMultiFrameMessageByteExact) {
  ASSERT_NO_FATAL_FAILURE(StartEchoServer());
  Inbox inbox;
  auto client = Connect(endpoint_, &inbox);
  std::string big(4 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  // 64 keys: big enough that ZeroMQ's decoder leaves them inside its receive buffer
  // (after the 6-byte header, so unaligned) instead of in a message of their own.
  std::vector<uint64_t> keys(64);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = ~0ull - i * 977;
  const Frame big_frame = F(big);
  ASSERT_TRUE(client->Send(0, {F("header"), Frame::FromVector(keys), F(""), big_frame}).ok());

  ASSERT_TRUE(inbox.WaitFor(1));
  auto items = inbox.Items();
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].first, 0u);
  const Frames& reply = items[0].second;
  ASSERT_EQ(reply.size(), 4u);
  EXPECT_EQ(reply[0].ToString(), "header");
  ASSERT_EQ(reply[1].CountOf<uint64_t>(), 64);
  EXPECT_EQ(std::vector<uint64_t>(reply[1].As<uint64_t>(), reply[1].As<uint64_t>() + 64), keys);
  EXPECT_TRUE(reply[2].empty());
  ASSERT_EQ(reply[3].size(), big.size());
  EXPECT_EQ(std::memcmp(reply[3].data(), big.data(), big.size()), 0);
  for (const Frame& f : reply) {
    if (!f.empty()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % 8, 0u);
    }
  }
  if (!IsZmq()) {
    EXPECT_EQ(reply[3].data(), big_frame.data()) << "mem:// must share, not copy";
  }
}

TEST_P(TransportTest, PortZeroBindReturnsConnectableEndpoint) {
  if (!IsZmq()) GTEST_SKIP() << "ports exist only for tcp://";
  ASSERT_NO_FATAL_FAILURE(StartEchoServer());
  const std::string prefix = "tcp://127.0.0.1:";
  ASSERT_EQ(endpoint_.compare(0, prefix.size(), prefix), 0) << endpoint_;
  const int port = std::stoi(endpoint_.substr(prefix.size()));
  EXPECT_GT(port, 0);
  Inbox inbox;
  auto client = Connect(endpoint_, &inbox);
  ASSERT_TRUE(client->Send(0, {F("ping")}).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  EXPECT_EQ(inbox.Items()[0].second[0].ToString(), "ping");
}

TEST_P(TransportTest, KeepsOnePeersRequestsInOrderAcrossHandlerThreads) {
  constexpr uint64_t kCount = 10000;
  TransportOptions options;
  options.handler_threads = 4;
  options.max_queue_per_thread = 2 * kCount;
  options.send_hwm = options.recv_hwm = 2 * kCount;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> seen;
  std::set<std::thread::id> threads;
  Cleanup stop([this] { StopServer(); });
  ASSERT_NO_FATAL_FAILURE(StartServer(
      [&](Incoming&& in) {
        std::lock_guard<std::mutex> lock(mu);
        seen.push_back(AsU64(in.frames[0]));
        threads.insert(std::this_thread::get_id());
        cv.notify_all();
      },
      options));
  Inbox inbox;
  auto client = Connect(endpoint_, &inbox, options);
  for (uint64_t i = 0; i < kCount; ++i) ASSERT_TRUE(client->Send(0, {U64(i)}).ok()) << i;

  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, kWait, [&] { return seen.size() >= kCount; })) << seen.size();
  for (uint64_t i = 0; i < kCount; ++i) ASSERT_EQ(seen[i], i);
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(Dropped(server_.get()), 0u);
}

TEST_P(TransportTest, ManyConcurrentClientsEachGetTheirOwnReplies) {
  constexpr int kClients = 8;
  constexpr uint64_t kPerClient = 200;
  TransportOptions options;
  options.handler_threads = 4;
  ASSERT_NO_FATAL_FAILURE(StartEchoServer(options));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      Inbox inbox;
      auto client = Connect(endpoint_, &inbox);
      for (uint64_t i = 0; i < kPerClient; ++i) {
        if (!client->Send(0, {F("client-" + std::to_string(c)), U64(i)}).ok()) errors[c] = "send";
      }
      if (!inbox.WaitFor(kPerClient)) errors[c] += " timeout";
      std::set<uint64_t> seqs;
      for (const auto& [server, frames] : inbox.Items()) {
        if (frames[0].ToString() != "client-" + std::to_string(c)) errors[c] += " misrouted";
        seqs.insert(AsU64(frames[1]));
      }
      if (seqs.size() != kPerClient || *seqs.rbegin() != kPerClient - 1) errors[c] += " seqs";
    });
  }
  for (auto& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(errors[c], "") << "client " << c;
}

TEST_P(TransportTest, DeliversRepliesSentFromAnotherThread) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Incoming> pending;
  bool done = false;
  std::thread replier;
  Cleanup stop([&] {
    StopServer();
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    }
    if (replier.joinable()) replier.join();
  });
  ASSERT_NO_FATAL_FAILURE(StartServer([&](Incoming&& in) {
    std::lock_guard<std::mutex> lock(mu);
    pending.push_back(std::move(in));
    cv.notify_all();
  }));
  replier = std::thread([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (cv.wait(lock, [&] { return done || !pending.empty(); }), !pending.empty()) {
      Incoming in = std::move(pending.front());
      pending.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(2ms);  // the handler has long returned
      EXPECT_TRUE(server_->Send(in.peer, {F("deferred:" + in.frames[0].ToString())}).ok());
      lock.lock();
    }
  });
  Inbox inbox;
  auto client = Connect(endpoint_, &inbox);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client->Send(0, {F(std::to_string(i))}).ok());
  EXPECT_TRUE(inbox.WaitFor(3));
  std::multiset<std::string> got;
  for (const auto& item : inbox.Items()) got.insert(item.second[0].ToString());
  EXPECT_EQ(got, (std::multiset<std::string>{"deferred:0", "deferred:1", "deferred:2"}));
}

TEST_P(TransportTest, SendAfterStopOrCloseIsUnavailable) {
  ASSERT_NO_FATAL_FAILURE(StartEchoServer());
  Inbox inbox;
  auto client = Connect(endpoint_, &inbox);
  server_->Stop();
  server_->Stop();  // idempotent
  EXPECT_EQ(server_->Send("some-peer", {F("late")}).code(), StatusCode::kUnavailable);
  client->Close();
  client->Close();
  EXPECT_EQ(client->Send(0, {F("late")}).code(), StatusCode::kUnavailable);
}

TEST_P(TransportTest, StopWithRequestsInFlightDoesNotHang) {
  std::atomic<int> handled{0};
  TransportOptions options;
  options.handler_threads = 2;
  Cleanup stop([this] { StopServer(); });
  ASSERT_NO_FATAL_FAILURE(StartServer(
      [&](Incoming&& in) {
        std::this_thread::sleep_for(50us);
        handled++;
        (void)server_->Send(in.peer, std::move(in.frames));  // may race with Stop: no check
      },
      options));
  Inbox inbox_a, inbox_b;
  auto a = Connect(endpoint_, &inbox_a);
  auto b = Connect(endpoint_, &inbox_b);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(a->Send(0, {U64(i)}).ok());
    ASSERT_TRUE(b->Send(0, {U64(i)}).ok());
  }
  ASSERT_TRUE(Eventually([&] { return handled > 0; }));
  FinishesInTime("server Stop", [&] { server_->Stop(); });
  FinishesInTime("client Close", [&] {
    a->Close();
    b->Close();
  });
}

// The client is told when an established connection drops (its requests will get no
// reply), so callers can fail them at once instead of at their deadlines.
TEST_P(TransportTest, ClientIsToldWhenTheServerGoesAway) {
  if (!IsZmq()) GTEST_SKIP() << "mem:// does not report disconnects (transport.h)";
  ASSERT_NO_FATAL_FAILURE(StartEchoServer());
  std::atomic<int> dropped{0};
  TransportOptions options;
  options.on_disconnect = [&](size_t index) {
    EXPECT_EQ(index, 0u);
    dropped++;
  };
  Inbox inbox;
  auto client = Connect(endpoint_, &inbox, options);
  ASSERT_TRUE(client->Send(0, {F("hello")}).ok());
  ASSERT_TRUE(inbox.WaitFor(1));
  EXPECT_EQ(dropped.load(), 0) << "a live connection reported as dropped";
  server_->Stop();
  for (int i = 0; i < 200 && dropped.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(dropped.load(), 1) << "no disconnect reported within 2 s of the server's stop";
  client->Close();
}

TEST_P(TransportTest, ServerThatAppearsLater) {
  if (IsZmq()) {
    // The kernel picks the port (not a ZeroMQ server, whose listener closes
    // asynchronously and could still accept, and drop, the early connection).
    const int port = FreePort();
    ASSERT_GT(port, 0);
    const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
    Inbox inbox;
    auto client = Connect(endpoint, &inbox);
    ASSERT_TRUE(client->Send(0, {F("early")}).ok());
    std::this_thread::sleep_for(20ms);
    server_ = NewServerTransport(endpoint);
    auto echo = [this](Incoming&& in) { (void)server_->Send(in.peer, std::move(in.frames)); };
    StatusOr<std::string> bound = server_->Start(endpoint, echo);
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    ASSERT_TRUE(inbox.WaitFor(1)) << "the request queued before the bind never arrived";
    EXPECT_EQ(inbox.Items()[0].second[0].ToString(), "early");
  } else {
    // mem:// drops requests to a name nobody holds (documented in mem_transport.h).
    const std::string endpoint = FreshEndpoint();
    Inbox inbox;
    auto client = Connect(endpoint, &inbox);
    ASSERT_TRUE(client->Send(0, {F("early")}).ok());
    server_ = NewServerTransport(endpoint);
    auto echo = [this](Incoming&& in) { (void)server_->Send(in.peer, std::move(in.frames)); };
    ASSERT_TRUE(server_->Start(endpoint, echo).ok());
    ASSERT_TRUE(client->Send(0, {F("late")}).ok());
    ASSERT_TRUE(inbox.WaitFor(1));
    EXPECT_FALSE(inbox.WaitFor(2, 50ms));
    EXPECT_EQ(inbox.Items()[0].second[0].ToString(), "late");
  }
}

TEST_P(TransportTest, BadEndpointsAreInvalidArgument) {
  auto handler = [](Incoming&&) {};
  Status started = NewServerTransport("foo://x")->Start("foo://x", handler).status();
  EXPECT_EQ(started.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(started.message().find("foo://x"), std::string::npos) << started.ToString();
  Inbox inbox;
  Status connected = NewClientTransport({"foo://y"})->Connect({"foo://y"}, inbox.Handler());
  EXPECT_EQ(connected.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(connected.message().find("foo://y"), std::string::npos) << connected.ToString();
  // A known scheme with a malformed address fails the same way.
  const std::string bad = IsZmq() ? "tcp://127.0.0.1:notaport" : "mem://";
  started = NewServerTransport(bad)->Start(bad, handler).status();
  EXPECT_EQ(started.code(), StatusCode::kInvalidArgument) << started.ToString();
  EXPECT_NE(started.message().find(bad), std::string::npos) << started.ToString();
}

TEST_P(TransportTest, BindingABoundEndpointFails) {
  ASSERT_NO_FATAL_FAILURE(StartEchoServer());
  auto second = NewServerTransport(endpoint_);
  Status status = second->Start(endpoint_, [](Incoming&&) {}).status();
  EXPECT_EQ(status.code(), StatusCode::kAlreadyExists) << status.ToString();
  EXPECT_NE(status.message().find(endpoint_), std::string::npos) << status.ToString();
}

TEST_P(TransportTest, FullHandlerQueueDropsAndCounts) {
  TransportOptions options;
  options.handler_threads = 1;
  options.max_queue_per_thread = 2;
  options.inline_max_bytes = 0;  // this handler blocks: it must not run on the I/O thread
  std::atomic<bool> open{false};
  std::atomic<int> handled{0};
  Cleanup stop([&] {
    open = true;
    StopServer();
  });
  ASSERT_NO_FATAL_FAILURE(StartServer(
      [&](Incoming&&) {
        while (!open) std::this_thread::sleep_for(1ms);
        handled++;
      },
      options));
  Inbox inbox;
  auto client = Connect(endpoint_, &inbox);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client->Send(0, {U64(i)}).ok());
  // One request is in the handler or queued, two more are queued, the rest dropped.
  ASSERT_TRUE(Eventually([&] { return Dropped(server_.get()) >= 17; })) << Dropped(server_.get());
  open = true;
  ASSERT_TRUE(Eventually([&] { return handled + Dropped(server_.get()) == 20; }));
  EXPECT_LE(Dropped(server_.get()), 18u);
}

TEST_P(TransportTest, OneFrameRoundTripLatency) {
  ASSERT_NO_FATAL_FAILURE(StartEchoServer());
  Inbox inbox;
  auto client = Connect(endpoint_, &inbox);
  constexpr int kWarmup = 200, kRounds = 2000;
  std::vector<double> micros;
  for (int i = 0; i < kWarmup + kRounds; ++i) {
    const auto start = Clock::now();
    ASSERT_TRUE(client->Send(0, {U64(i)}).ok());
    ASSERT_TRUE(inbox.WaitFor(i + 1));
    const std::chrono::duration<double, std::micro> took = Clock::now() - start;
    if (i >= kWarmup) micros.push_back(took.count());
  }
  std::sort(micros.begin(), micros.end());
  const double p50 = micros[micros.size() / 2], p99 = micros[micros.size() * 99 / 100];
  std::cout << GetParam() << " 1-frame round trip: p50 " << p50 << " us, p99 " << p99 << " us\n";
  RecordProperty("p50_us", std::to_string(p50));
  // Loose bound: the target is far lower, but CI machines are shared.
  EXPECT_LT(p50, 1000.0);
}

// mem_run_on_sender: a small request runs on the sending thread (with requeue offered)
// and its reply reaches the client's Handler on that thread before Send returns; a large
// one, or any request without the option, goes to the server's handler thread.
// common/zmq_transport.cc answers getpid() from a cache (libzmq asks it on every signal
// between its threads): the program's own definition wins over libc's, and it is right
// in the parent, in a fork child (refreshed before fork returns) and after the child's
// transports start.
TEST(PidCacheTest, GetpidIsCachedAndRightAfterFork) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&getpid), &info), 0);
  EXPECT_EQ(std::string(info.dli_fname).find("libc."), std::string::npos)
      << "getpid resolves to " << info.dli_fname << ", not this program's cached copy";
  const pid_t parent = getpid();
  EXPECT_EQ(parent, static_cast<pid_t>(syscall(SYS_getpid)));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const pid_t mine = static_cast<pid_t>(syscall(SYS_getpid));
    bool ok = getpid() == mine && mine != parent;
    // The child's own ZeroMQ context and sockets work (they look at getpid too).
    ZmqServerTransport server({});
    auto ep = server.Start("tcp://127.0.0.1:0", [](Incoming&&) {});
    ok = ok && ep.ok();
    server.Stop();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the fork child saw a wrong pid or could not serve";
  EXPECT_EQ(getpid(), parent);
}

TEST(MemTransportTest, RunOnSenderHandlesAndRepliesOnTheSendingThread) {
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "mem_run_on_sender" : "default");
    static std::atomic<int> next{0};
    const std::string endpoint = "mem://run-on-sender-" + std::to_string(next++);
    TransportOptions options;
    options.mem_run_on_sender = on;
    options.inline_max_bytes = 64;
    std::mutex mu;
    std::vector<std::thread::id> handled, replied;
    std::vector<bool> offered_requeue;
    MemServerTransport server(options);
    ASSERT_TRUE(server
                    .Start(endpoint,
                           [&](Incoming&& in) {
                             {
                               std::lock_guard<std::mutex> lock(mu);
                               handled.push_back(std::this_thread::get_id());
                               offered_requeue.push_back(static_cast<bool>(in.requeue));
                             }
                             EXPECT_TRUE(server.Send(in.peer, std::move(in.frames)).ok());
                           })
                    .ok());
    MemClientTransport client(options);
    ASSERT_TRUE(client
                    .Connect({endpoint},
                             [&](size_t, Frames&&) {
                               std::lock_guard<std::mutex> lock(mu);
                               replied.push_back(std::this_thread::get_id());
                             })
                    .ok());
    ASSERT_TRUE(client.Send(0, {U64(1)}).ok());
    if (on) {
      std::lock_guard<std::mutex> lock(mu);
      ASSERT_EQ(replied.size(), 1u) << "the reply came before Send returned";
    }
    ASSERT_TRUE(Eventually([&] {
      std::lock_guard<std::mutex> lock(mu);
      return replied.size() == 1;
    }));
    ASSERT_TRUE(client.Send(0, {F(std::string(100, 'x'))}).ok());  // over inline_max_bytes
    ASSERT_TRUE(Eventually([&] {
      std::lock_guard<std::mutex> lock(mu);
      return replied.size() == 2;
    }));
    client.Close();
    server.Stop();
    const auto self = std::this_thread::get_id();
    EXPECT_EQ(handled[0] == self, on);
    EXPECT_EQ(replied[0] == self, on);
    EXPECT_EQ(offered_requeue[0], on);
    EXPECT_NE(handled[1], self) << "a large request runs on the handler thread";
    EXPECT_NE(replied[1], self);
    EXPECT_FALSE(offered_requeue[1]);
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest, ::testing::Values("zmq-tcp", "mem"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Stop() "lets handler threads finish what is queued, flushes replies" (transport.h): the
// reply of a request being handled when Stop is called reaches the client. The ROUTER was
// closed with linger 0, which dropped what ZeroMQ had not written yet (a large reply).
TEST(ZmqServerStopTest, TheRepliesOfHandledRequestsGetOut) {
  std::atomic<bool> started{false};
  ZmqServerTransport server({});
  auto bound = server.Start("tcp://127.0.0.1:0", [&](Incoming&& in) {
    started = true;
    std::this_thread::sleep_for(300ms);
    Frames reply = {F("hdr"), Frame::FromString(std::string(size_t{200} << 20, 'x'))};
    EXPECT_TRUE(server.Send(in.peer, std::move(reply)).ok());
  });
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  Inbox inbox;
  auto client = NewClientTransport({*bound});
  ASSERT_TRUE(client->Connect({*bound}, inbox.Handler()).ok());
  ASSERT_TRUE(client->Send(0, {F("req")}).ok());
  ASSERT_TRUE(Eventually([&] { return started.load(); }));
  server.Stop();  // returns once the handler has sent its reply
  EXPECT_TRUE(inbox.WaitFor(1)) << "the reply sent before Stop returned never arrived";
  client->Close();
}

}  // namespace
}  // namespace onlineps
