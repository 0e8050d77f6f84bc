// Shard replication through real processes: 2 shards x 2 replicas (onlineps_ps), four
// client threads pushing one new sparse row each (value +1 when applied once) and
// logging every acknowledged push. kill -9 of shard 0's primary mid-traffic; a fresh
// replacement replica catches up from a snapshot plus the stream; then kill -9 of the
// new primary, so the replacement serves alone. Every acknowledged push must be in the
// parameters exactly once; unacknowledged ones at most once. Recovery times are printed.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "ps/ps_client.h"
#include "tests/subprocess.h"

namespace onlineps::ps {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::Subprocess;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct Ack {
  uint64_t key;
  double at_s;  // since the start of traffic
};

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int s = 0; s < 2; ++s)
      for (int r = 0; r < 2; ++r) {
        ep_[s][r] = "tcp://127.0.0.1:" + std::to_string(FreePort());
        admin_[s][r] = FreePort();
      }
    for (int s = 0; s < 2; ++s)
      for (int r = 0; r < 2; ++r) Start(s, r);
  }

  void Start(int s, int r) {
    proc_[s][r] =
        std::make_unique<Subprocess>(std::vector<std::string>{ONLINEPS_BIN_DIR "/onlineps_ps",
                                                              "--shard-index",
                                                              std::to_string(s),
                                                              "--num-shards",
                                                              "2",
                                                              "--listen",
                                                              ep_[s][r],
                                                              "--replicas",
                                                              ep_[s][0] + "," + ep_[s][1],
                                                              "--replica-index",
                                                              std::to_string(r),
                                                              "--replica-heartbeat-ms",
                                                              "50",
                                                              "--replica-lease-ms",
                                                              "500",
                                                              "--replica-timeout-ms",
                                                              "1000",
                                                              "--admin-port",
                                                              std::to_string(admin_[s][r]),
                                                              "--log-level",
                                                              "warn"});
    ASSERT_FALSE(proc_[s][r]->WaitForLine("LISTENING ", milliseconds(10000)).empty());
  }

  // The value of one series on a replica's /metrics, or -1 when it is not there.
  double Metric(int s, int r, const std::string& series) const {
    httplib::Client c("127.0.0.1", admin_[s][r]);
    auto res = c.Get("/metrics");
    if (!res || res->status != 200) return -1;
    const std::string& body = res->body;
    size_t at = body.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(body.substr(at + series.size() + 2));
  }

  PsClientOptions Options() const {
    PsClientOptions o;
    o.shards = {ep_[0][0] + "|" + ep_[0][1], ep_[1][0] + "|" + ep_[1][1]};
    o.timeout = milliseconds(30000);
    o.attempt_timeout = milliseconds(300);
    return o;
  }

  // Pushes from `threads` clients until `stop`; acked pushes go to acks_.
  void Traffic(int threads, std::atomic<bool>* stop) {
    for (int t = 0; t < threads; ++t) {
      workers_.emplace_back([this, t, stop] {
        auto client = PsClient::Connect(Options());
        ASSERT_TRUE(client.ok());
        const float grad = -1.0f;  // SGD, lr 1: the row goes from 0 to 1
        for (uint64_t i = 0; !stop->load(); ++i) {
          const uint64_t key = (static_cast<uint64_t>(t + 1) << 40) | i;
          {
            std::lock_guard<std::mutex> lock(mu_);
            sent_.push_back(key);
          }
          PushReply reply;
          Status st = (*client)->PushSparse("rows", &key, 1, &grad, {}, &reply).Wait();
          if (!st.ok()) {
            errors_++;
            continue;
          }
          std::lock_guard<std::mutex> lock(mu_);
          acks_.push_back({key, std::chrono::duration<double>(Clock::now() - t0_).count()});
        }
      });
    }
  }

  void Join() {
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  // Longest pause between consecutive acknowledgements around `from_s` (a client thread
  // blocked on shard 0 stops all its pushes, so all four stall when shard 0 does).
  double LongestGap(double from_s) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<double> times;
    for (const Ack& a : acks_)
      if (a.at_s >= from_s - 0.5) times.push_back(a.at_s);
    std::sort(times.begin(), times.end());
    double gap = 0;
    for (size_t i = 1; i < times.size(); ++i) gap = std::max(gap, times[i] - times[i - 1]);
    return gap;
  }

  double Now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  std::string ep_[2][2];
  std::unique_ptr<Subprocess> proc_[2][2];
  int admin_[2][2] = {};
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::vector<uint64_t> sent_;
  std::vector<Ack> acks_;
  std::atomic<int> errors_{0};
  Clock::time_point t0_ = Clock::now();
};

TEST_F(ReplicationTest, Kill9PrimaryLosesNoAcknowledgedPush) {
  {
    auto client = PsClient::Connect(Options());
    ASSERT_TRUE(client.ok());
    TableSpec spec;
    spec.name = "rows";
    spec.kind = TableKind::kSparse;
    spec.dim = 1;
    spec.optimizer_params = {{"lr", 1.0}};
    ASSERT_TRUE((*client)->CreateTable(spec).ok());  // waits for the elections
  }
  std::atomic<bool> stop{false};
  t0_ = Clock::now();
  Traffic(4, &stop);
  std::this_thread::sleep_for(milliseconds(1500));

  // 1. kill -9 shard 0's primary (replica 0: both replicas start empty, the lower wins).
  const double kill1 = Now();
  ASSERT_EQ(proc_[0][0]->Stop(SIGKILL, milliseconds(5000)), 128 + SIGKILL);
  std::this_thread::sleep_for(milliseconds(2500));
  const double gap1 = LongestGap(kill1);
  // The metrics tell the story: replica 1 was promoted and is primary.
  EXPECT_EQ(Metric(0, 1, "onlineps_ps_replica{field=\"primary\"}"), 1);
  EXPECT_GE(Metric(0, 1, "onlineps_ps_replica_events_total{event=\"promotion\"}"), 1);
  EXPECT_GE(Metric(0, 1, "onlineps_ps_replica{field=\"epoch\"}"), 2);

  // 2. A replacement replica 0 (empty: no checkpoint) joins and catches up.
  Start(0, 0);
  std::this_thread::sleep_for(milliseconds(2000));
  EXPECT_GE(Metric(0, 1, "onlineps_ps_replica_events_total{event=\"snapshot_sent\"}"), 1);
  EXPECT_GE(Metric(0, 0, "onlineps_ps_replica_events_total{event=\"snapshot_loaded\"}"), 1);
  EXPECT_EQ(Metric(0, 0, "onlineps_ps_replica{field=\"primary\"}"), 0);
  EXPECT_EQ(Metric(0, 1, "onlineps_ps_replica{field=\"in_sync_backups\"}"), 1);

  // 3. kill -9 the new primary: the replacement must hold every acknowledged push.
  const double kill2 = Now();
  ASSERT_EQ(proc_[0][1]->Stop(SIGKILL, milliseconds(5000)), 128 + SIGKILL);
  std::this_thread::sleep_for(milliseconds(2500));
  stop = true;
  Join();
  const double gap2 = LongestGap(kill2);

  size_t acked_before = 0;
  for (const Ack& a : acks_) acked_before += a.at_s < kill1;
  std::printf("acknowledged pushes: %zu (%zu before the first kill), errors %d\n", acks_.size(),
              acked_before, errors_.load());
  std::printf(
      "recovery (longest pause in acknowledgements): %.3f s after kill -9 of the "
      "primary, %.3f s after kill -9 of the second primary\n",
      gap1, gap2);
  EXPECT_EQ(errors_.load(), 0);
  EXPECT_GT(acked_before, 100u);
  EXPECT_GT(acks_.size(), acked_before + 100) << "traffic did not resume after the failover";
  EXPECT_LT(gap1, 10.0);
  EXPECT_LT(gap2, 10.0);

  auto client = PsClient::Connect(Options());
  ASSERT_TRUE(client.ok());
  std::vector<float> rows(sent_.size());
  VersionVector v;
  ASSERT_TRUE(
      (*client)->PullSparse("rows", sent_.data(), sent_.size(), rows.data(), &v).Wait().ok());
  std::unordered_map<uint64_t, float> value;
  for (size_t i = 0; i < sent_.size(); ++i) value[sent_[i]] = rows[i];
  size_t lost = 0, twice = 0;
  for (const Ack& a : acks_) lost += value[a.key] != 1.0f;
  for (const auto& [key, x] : value) twice += x != 0.0f && x != 1.0f;
  EXPECT_EQ(lost, 0u) << "acknowledged pushes missing or applied more than once";
  EXPECT_EQ(twice, 0u) << "pushes applied more than once";
  EXPECT_EQ(v[0] + v[1], [&] {
    size_t applied = 0;
    for (const auto& [key, x] : value) applied += x == 1.0f;
    return applied;
  }()) << "table versions count every applied push once";
}

}  // namespace
}  // namespace onlineps::ps
