// Test fixture for replicated shards as real processes: a real etcd (tests/etcd_server.h),
// onlineps_ps replicas started, SIGTERMed and kill -9ed by the test, client threads
// pushing one new sparse row each (value +1 when applied once) and logging every
// acknowledged push, and the final check that every acknowledged push is in the
// parameters exactly once.
#ifndef ONLINEPS_TESTS_PS_REPLICATION_CLUSTER_H_
#define ONLINEPS_TESTS_PS_REPLICATION_CLUSTER_H_

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ps/ps_client.h"
#include "tests/etcd_server.h"
#include "tests/subprocess.h"

namespace onlineps::ps {

class ReplicationCluster : public ::testing::Test {
 protected:
  using Clock = std::chrono::steady_clock;
  static constexpr int kMaxShards = 2, kMaxReplicas = 3;

  struct Ack {
    uint64_t key;
    double at_s;  // since the start of traffic
  };

  // Starts every replica of `shards` x `replicas` (none with a checkpoint directory
  // unless `checkpoints`).
  void Up(int shards, int replicas, bool checkpoints = false, std::vector<std::string> extra = {}) {
    ASSERT_TRUE(etcd_.ok()) << "etcd did not start (is etcd-server installed?)";
    shards_ = shards;
    replicas_ = replicas;
    extra_ = std::move(extra);
    if (checkpoints) {
      char tmpl[] = "/tmp/onlineps-repl-XXXXXX";
      ckpt_ = mkdtemp(tmpl);
    }
    for (int s = 0; s < shards; ++s)
      for (int r = 0; r < replicas; ++r) {
        ep_[s][r] = "tcp://127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
        admin_[s][r] = testing::FreeLoopbackPort();
      }
    for (int s = 0; s < shards; ++s)
      for (int r = 0; r < replicas; ++r) Start(s, r);
  }

  void TearDown() override {
    stop_ = true;
    Join();
    for (auto& s : proc_)
      for (auto& p : s) p.reset();
    if (!ckpt_.empty()) std::system(("rm -rf " + ckpt_).c_str());
  }

  std::string Group(int s) const {
    std::string g;
    for (int r = 0; r < replicas_; ++r) g += (r ? "," : "") + ep_[s][r];
    return g;
  }

  void Start(int s, int r) {
    proc_[s][r] = std::make_unique<testing::Subprocess>(Argv(s, r));
    ASSERT_FALSE(proc_[s][r]->WaitForLine("LISTENING ", std::chrono::milliseconds(10000)).empty());
  }

  // The command line of replica (s, r).
  std::vector<std::string> Argv(int s, int r) const {
    std::vector<std::string> argv = {ONLINEPS_BIN_DIR "/onlineps_ps",
                                     "--shard-index",
                                     std::to_string(s),
                                     "--num-shards",
                                     std::to_string(shards_),
                                     "--listen",
                                     ep_[s][r],
                                     "--replicas",
                                     Group(s),
                                     "--replica-index",
                                     std::to_string(r),
                                     "--etcd",
                                     etcd_.endpoint(),
                                     "--replica-heartbeat-ms",
                                     "50",
                                     "--replica-lease-ms",
                                     "1000",
                                     "--replica-timeout-ms",
                                     "1000",
                                     "--admin-port",
                                     std::to_string(admin_[s][r]),
                                     "--log-level",
                                     log_level_};
    if (!ckpt_.empty()) {
      argv.push_back("--checkpoint-dir");
      argv.push_back(ckpt_ + "/r" + std::to_string(r));
    }
    for (const auto& e : extra_) argv.push_back(e);
    return argv;
  }

  // Kills replica (s, r) with `sig` and waits for it to exit.
  void Signal(int s, int r, int sig) {
    const int rc = proc_[s][r]->Stop(sig, std::chrono::milliseconds(10000));
    if (sig == SIGKILL) {
      ASSERT_EQ(rc, 128 + SIGKILL);
    } else {
      ASSERT_EQ(rc, 0) << "replica " << s << "/" << r << " did not stop cleanly";
    }
  }

  // The value of one series on a replica's /metrics, or -1 when it is not there.
  double Metric(int s, int r, const std::string& series) const {
    httplib::Client c("127.0.0.1", admin_[s][r]);
    c.set_connection_timeout(1, 0);
    c.set_read_timeout(2, 0);
    auto res = c.Get("/metrics");
    if (!res || res->status != 200) return -1;
    const std::string& body = res->body;
    size_t at = body.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(body.substr(at + series.size() + 2));
  }
  // The status of a replica's /readyz (0 when it does not answer).
  int Readyz(int s, int r) const {
    httplib::Client c("127.0.0.1", admin_[s][r]);
    c.set_connection_timeout(1, 0);
    auto res = c.Get("/readyz");
    return res ? res->status : 0;
  }
  double Field(int s, int r, const std::string& field) const {
    return Metric(s, r, "onlineps_ps_replica{field=\"" + field + "\"}");
  }
  double Event(int s, int r, const std::string& event) const {
    return Metric(s, r, "onlineps_ps_replica_events_total{event=\"" + event + "\"}");
  }

  // The replica of shard s that reports itself primary (one only), or -1.
  int Primary(int s) const {
    int found = -1;
    for (int r = 0; r < replicas_; ++r) {
      if (proc_[s][r] && Field(s, r, "primary") == 1) {
        if (found >= 0) return -2;  // two: never acceptable
        found = r;
      }
    }
    return found;
  }

  bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return pred();
  }

  PsClientOptions Options() const {
    PsClientOptions o;
    for (int s = 0; s < shards_; ++s) {
      std::string g;
      for (int r = 0; r < replicas_; ++r) g += (r ? "|" : "") + ep_[s][r];
      o.shards.push_back(g);
    }
    o.timeout = std::chrono::milliseconds(30000);
    o.attempt_timeout = std::chrono::milliseconds(300);
    return o;
  }

  void CreateTable() {
    auto client = PsClient::Connect(Options());
    ASSERT_TRUE(client.ok());
    TableSpec spec;
    spec.name = "rows";
    spec.kind = TableKind::kSparse;
    spec.dim = 1;
    spec.optimizer_params = {{"lr", 1.0}};
    ASSERT_TRUE((*client)->CreateTable(spec).ok());  // waits for the elections
  }

  // Pushes from `threads` clients until stop_; acked pushes go to acks_.
  void Traffic(int threads) {
    t0_ = Clock::now();
    for (int t = 0; t < threads; ++t) {
      workers_.emplace_back([this, t] {
        auto client = PsClient::Connect(Options());
        ASSERT_TRUE(client.ok());
        const float grad = -1.0f;  // SGD, lr 1: the row goes from 0 to 1
        for (uint64_t i = 0; !stop_.load(); ++i) {
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
          acks_.push_back({key, Now()});
        }
      });
    }
  }

  void Join() {
    stop_ = true;
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  size_t AcksSince(double from_s) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const Ack& a : acks_) n += a.at_s >= from_s;
    return n;
  }

  // Seconds from `from_s` to the first acknowledgement after it (a pause in service).
  double FirstAckAfter(double from_s) {
    std::lock_guard<std::mutex> lock(mu_);
    double first = -1;
    for (const Ack& a : acks_)
      if (a.at_s >= from_s && (first < 0 || a.at_s < first)) first = a.at_s;
    return first < 0 ? -1 : first - from_s;
  }

  // Longest pause between consecutive acknowledgements from `from_s` on.
  double LongestGap(double from_s) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<double> times{from_s};
    for (const Ack& a : acks_)
      if (a.at_s >= from_s) times.push_back(a.at_s);
    std::sort(times.begin(), times.end());
    double gap = 0;
    for (size_t i = 1; i < times.size(); ++i) gap = std::max(gap, times[i] - times[i - 1]);
    return gap;
  }

  double Now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  // Every acknowledged push is in the parameters exactly once; none twice.
  void ExpectEveryAckOnce() {
    auto client = PsClient::Connect(Options());
    ASSERT_TRUE(client.ok());
    std::vector<uint64_t> sent;
    std::vector<Ack> acks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      sent = sent_;
      acks = acks_;
    }
    std::vector<float> rows(sent.size());
    for (size_t at = 0; at < sent.size(); at += 20000) {  // under any --max-message-mb
      const size_t n = std::min<size_t>(20000, sent.size() - at);
      VersionVector v;
      Status st = (*client)->PullSparse("rows", sent.data() + at, n, rows.data() + at, &v).Wait();
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    std::unordered_map<uint64_t, float> value;
    for (size_t i = 0; i < sent.size(); ++i) value[sent[i]] = rows[i];
    size_t lost = 0, twice = 0;
    for (const Ack& a : acks) lost += value[a.key] != 1.0f;
    for (const auto& [key, x] : value) twice += x != 0.0f && x != 1.0f;
    std::printf("acknowledged pushes: %zu, lost: %zu, applied twice: %zu, errors: %d\n",
                acks.size(), lost, twice, errors_.load());
    EXPECT_EQ(lost, 0u) << "acknowledged pushes missing or applied more than once";
    EXPECT_EQ(twice, 0u) << "pushes applied more than once";
  }

  testing::EtcdServer etcd_;
  int shards_ = 1, replicas_ = 2;
  std::vector<std::string> extra_;
  std::string log_level_ = "warn";  // of the replicas (their logs go to the test's stderr)
  std::string ckpt_;
  std::string ep_[kMaxShards][kMaxReplicas];
  int admin_[kMaxShards][kMaxReplicas] = {};
  std::unique_ptr<testing::Subprocess> proc_[kMaxShards][kMaxReplicas];
  std::vector<std::thread> workers_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<uint64_t> sent_;
  std::vector<Ack> acks_;
  std::atomic<int> errors_{0};
  Clock::time_point t0_ = Clock::now();
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_TESTS_PS_REPLICATION_CLUSTER_H_
