// replica_chaos: a seeded chaos driver for a replicated shard, as real processes. Per seed:
// a real etcd on loopback, one shard of 3 onlineps_ps replicas (sync, --min-insync-replicas
// 1 or 2, checkpoints every second), client threads pushing one new sparse row each (SGD, lr 1:
// a row reads 1 exactly when its push was applied once), and a scheduler, seeded, that
// kill -9s, SIGSTOPs, SIGTERMs and restarts primaries and backups, stops and restarts the
// whole group, kills or freezes etcd for a moment and wipes its data. Then it heals everything and
// checks: every push acknowledged OK applied exactly once, every push whose outcome is unknown at
// most once, every push answered "not applied" not at all; then kill -9s the primary and checks the
// same on the replica elected next, then stops and restarts the whole group and checks again from
// the checkpoints.
//
// kill -9 is done only while another replica than the victim is in the ISR (the promise
// of docs/reliability.md: a push is lost only when every ISR member loses its memory).
//
//   replica_chaos [--seeds N] [--first S] [--seconds T] [--keep-logs] [--ps-binary PATH]
// (--ps-binary: a copy of onlineps_ps, so that a rebuild does not pull it from under a
// long run).
// Exit 0 when every seed passed; a failing seed replays its schedule with --first S
// --seeds 1 (the timing of real processes varies, so a replay is likely, not certain,
// to fail again). Logs of a failing seed are kept in the directory it prints.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ps/ps_client.h"
#include "tests/etcd_server.h"
#include "tests/subprocess.h"

namespace onlineps::ps {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kReplicas = 3;
constexpr int kClients = 3;

enum class Outcome { kAcked, kUnknown, kNotApplied };

struct Push {
  uint64_t key;
  Outcome outcome;
  std::string error;
};

class ChaosRun {
 public:
  ChaosRun(uint64_t seed, double seconds) : seed_(seed), seconds_(seconds), rng_(seed) {
    // Short call timeouts leave pushes of unknown outcome behind outages.
    const int timeouts[] = {1000, 2000, 4000};
    client_timeout_ms_ = timeouts[Rand(0, 2)];
    min_insync_ = Rand(1, 2);  // 1, the default: a lone primary acknowledges while backups re-sync
  }

  // True when every check passed.
  bool Run() {
    char tmpl[] = "/tmp/onlineps-chaos-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::printf("seed %llu: logs in %s; client timeout %d ms, --min-insync-replicas %d\n",
                static_cast<unsigned long long>(seed_), dir_.c_str(), client_timeout_ms_,
                min_insync_);
    std::fflush(stdout);
    if (!etcd_.ok()) return Fail("etcd did not start (is etcd-server installed?)");
    for (int r = 0; r < kReplicas; ++r) {
      ep_[r] = "tcp://127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
      admin_[r] = testing::FreeLoopbackPort();
    }
    for (int r = 0; r < kReplicas; ++r)
      if (!Start(r)) return Fail("replica " + std::to_string(r) + " did not start");
    if (!CreateTable()) return Fail("create_table failed");
    StartClients();
    Chaos();
    Heal();
    if (!WaitFor([&] { return IsrSize() == kReplicas; }, milliseconds(20000)))
      return Fail("the group did not re-form with every replica in the ISR after healing");
    const size_t acked_before = Count(Outcome::kAcked);
    std::this_thread::sleep_for(milliseconds(500));
    StopClients();
    if (Count(Outcome::kAcked) == acked_before) return Fail("no push acknowledged after healing");
    if (!WaitFor([&] { return IsrSize() == kReplicas; }, milliseconds(20000)))
      return Fail("not every replica in the ISR at the end");
    bool ok = Check("after healing");
    // The backups hold the same: kill -9 the primary (every replica is in the ISR).
    const int p = Primary();
    if (p >= 0) {
      Kill(p, SIGKILL);
      ok &= Check("after kill -9 of primary " + std::to_string(p));
      if (!Start(p)) return Fail("replica did not restart");
    }
    // And the checkpoints hold it: the whole group stopped and restarted.
    if (!WaitFor([&] { return IsrSize() == kReplicas; }, milliseconds(20000)))
      return Fail("not every replica in the ISR before the final group restart");
    for (int r = 0; r < kReplicas; ++r) Kill(r, SIGTERM);
    for (int r = 0; r < kReplicas; ++r)
      if (!Start(r)) return Fail("replica did not restart");
    ok &= Check("after a whole-group restart");
    for (int r = 0; r < kReplicas; ++r) Kill(r, SIGTERM);
    std::printf(
        "seed %llu: %s: %zu acknowledged, %zu outcome unknown, %zu not applied, %d faults\n",
        static_cast<unsigned long long>(seed_), ok ? "PASS" : "FAIL", Count(Outcome::kAcked),
        Count(Outcome::kUnknown), Count(Outcome::kNotApplied), faults_);
    if (ok && !keep_logs) std::filesystem::remove_all(dir_);
    return ok;
  }

  static inline bool keep_logs = false;
  static inline std::string ps_binary = ONLINEPS_BIN_DIR "/onlineps_ps";

 private:
  bool Fail(const std::string& why) {
    std::printf("seed %llu: FAIL: %s (logs in %s)\n", static_cast<unsigned long long>(seed_),
                why.c_str(), dir_.c_str());
    stop_ = true;
    for (auto& t : clients_) t.join();
    clients_.clear();
    return false;
  }

  std::string Group() const {
    std::string g;
    for (int r = 0; r < kReplicas; ++r) g += (r ? "," : "") + ep_[r];
    return g;
  }

  bool Start(int r) {
    std::string cmd = "exec " + ps_binary + " --shard-index 0 --num-shards 1";
    cmd += " --listen " + ep_[r] + " --replicas " + Group() + " --replica-index " +
           std::to_string(r) + " --etcd " + etcd_.endpoint() +
           " --replica-heartbeat-ms 50 --replica-lease-ms 1000 --replica-timeout-ms 1000"
           " --replica-unclean-wait-ms 5000 --checkpoint-interval-s 1 --min-insync-replicas " +
           std::to_string(min_insync_) + " --checkpoint-dir " + dir_ + "/ckpt" + std::to_string(r) +
           " --admin-port " + std::to_string(admin_[r]) + " --log-level info 2>>" + dir_ + "/r" +
           std::to_string(r) + ".log";
    Log("start replica " + std::to_string(r));
    proc_[r] =
        std::make_unique<testing::Subprocess>(std::vector<std::string>{"/bin/sh", "-c", cmd});
    stopped_[r] = false;
    return !proc_[r]->WaitForLine("LISTENING ", milliseconds(10000)).empty();
  }

  // Sends `sig` (SIGKILL or SIGTERM) and waits for the exit.
  void Kill(int r, int sig) {
    if (!proc_[r]) return;
    if (sig == SIGKILL) last_kill_s_ = Now();
    Log(std::string(sig == SIGKILL ? "kill -9" : "SIGTERM") + " replica " + std::to_string(r));
    if (stopped_[r]) kill(proc_[r]->pid(), SIGCONT);
    const int rc = proc_[r]->Stop(sig, milliseconds(15000));
    if (rc < 0) {
      Log("replica " + std::to_string(r) + " did not exit on its signal: kill -9");
      proc_[r]->Stop(SIGKILL, milliseconds(5000));
    } else if (sig == SIGTERM && rc != 0) {
      Log("replica " + std::to_string(r) + " exited " + std::to_string(rc) + " on SIGTERM");
      bad_exits_++;
    }
    proc_[r].reset();
    stopped_[r] = false;
  }

  void Pause(int r, bool pause) {
    if (!proc_[r]) return;
    Log(std::string(pause ? "SIGSTOP" : "SIGCONT") + " replica " + std::to_string(r));
    kill(proc_[r]->pid(), pause ? SIGSTOP : SIGCONT);
    stopped_[r] = pause;
  }

  double Metric(int r, const std::string& series) const {
    if (!proc_[r] || stopped_[r]) return -1;
    httplib::Client c("127.0.0.1", admin_[r]);
    c.set_connection_timeout(0, 300000);
    c.set_read_timeout(1, 0);
    auto res = c.Get("/metrics");
    if (!res || res->status != 200) return -1;
    const size_t at = res->body.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(res->body.substr(at + series.size() + 2));
  }
  double Field(int r, const std::string& f) const {
    return Metric(r, "onlineps_ps_replica{field=\"" + f + "\"}");
  }
  int Primary() const {
    for (int r = 0; r < kReplicas; ++r)
      if (Field(r, "primary") == 1) return r;
    return -1;
  }
  int IsrSize() const {
    const int p = Primary();
    return p < 0 ? 0 : static_cast<int>(Field(p, "isr_size"));
  }

  bool WaitFor(const std::function<bool()>& pred, milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (pred()) return true;
      std::this_thread::sleep_for(milliseconds(25));
    }
    return pred();
  }

  PsClientOptions Options() const {
    PsClientOptions o;
    std::string g;
    for (int r = 0; r < kReplicas; ++r) g += (r ? "|" : "") + ep_[r];
    o.shards = {g};
    o.timeout = milliseconds(client_timeout_ms_);
    o.attempt_timeout = milliseconds(300);
    return o;
  }

  bool CreateTable() {
    auto client = PsClient::Connect(Options());
    if (!client.ok()) return false;
    TableSpec spec;
    spec.name = "rows";
    spec.kind = TableKind::kSparse;
    spec.dim = 1;
    spec.optimizer_params = {{"lr", 1.0}};
    for (int i = 0; i < 10; ++i)
      if ((*client)->CreateTable(spec).ok()) return true;  // waits for the election
    return false;
  }

  void StartClients() {
    for (int t = 0; t < kClients; ++t) {
      clients_.emplace_back([this, t] {
        auto client = PsClient::Connect(Options());
        if (!client.ok()) return;
        const float grad = -1.0f;
        for (uint64_t i = 0; !stop_.load(); ++i) {
          const uint64_t key = (static_cast<uint64_t>(t + 1) << 40) | i;
          PushReply reply;
          const Status st = (*client)->PushSparse("rows", &key, 1, &grad, {}, &reply).Wait();
          Push p{key, Outcome::kAcked, ""};
          if (!st.ok()) {
            p.error = st.ToString();
            // DEADLINE_EXCEEDED (no answer, or a refused resend) and CANCELLED may have been
            // applied; any other error is an answer that it was not.
            const bool unknown = st.code() == StatusCode::kDeadlineExceeded ||
                                 st.code() == StatusCode::kCancelled ||
                                 st.code() == StatusCode::kUnavailable;
            p.outcome = reply.shards_took ? Outcome::kAcked
                        : unknown         ? Outcome::kUnknown
                                          : Outcome::kNotApplied;
          }
          std::lock_guard<std::mutex> lock(mu_);
          pushes_.push_back(std::move(p));
        }
      });
    }
  }

  void StopClients() {
    stop_ = true;
    for (auto& t : clients_) t.join();
    clients_.clear();
  }

  size_t Count(Outcome o) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(std::count_if(pushes_.begin(), pushes_.end(),
                                             [o](const Push& p) { return p.outcome == o; }));
  }

  int Rand(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  void Sleep(int ms) { std::this_thread::sleep_for(milliseconds(ms)); }
  double Now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  void Log(const std::string& what) {
    std::printf("  [%6.2f] %s\n", Now(), what.c_str());
    std::fflush(stdout);
  }

  // A kill of memory only while the ISR holds another replica than the victim, which has
  // every acknowledged push (a paused one keeps its memory): 2 or more in the ISR, every
  // replica running, and the last kill's victim gone from the ISR (the follower timeout
  // is 1 s) or back in sync.
  bool MayKill() {
    for (int r = 0; r < kReplicas; ++r)
      if (!proc_[r]) return false;
    if (Now() - last_kill_s_ < 2.5) return false;
    return IsrSize() >= 2;
  }

  void Chaos() {
    t0_ = Clock::now();
    Sleep(Rand(300, 1000));
    while (Now() < seconds_) {
      faults_++;
      const int kind = Rand(0, 14);
      const int victim = Rand(0, kReplicas - 1);
      const int primary = Primary();
      switch (kind) {
        case 0:
        case 1:  // kill -9 the primary (or a replica), restart it soon or later
        case 2: {
          const int r = kind < 2 && primary >= 0 ? primary : victim;
          if (!MayKill()) {
            Log("skip kill -9: fewer than 2 in the ISR, or a kill within 2.5 s");
            break;
          }
          Kill(r, SIGKILL);
          Sleep(Rand(0, 1500));
          Start(r);
          break;
        }
        case 3:  // SIGSTOP the primary or a replica, past the lease or not
        case 4: {
          const int r = kind == 3 && primary >= 0 ? primary : victim;
          Pause(r, true);
          Sleep(Rand(100, 2500));
          Pause(r, false);
          break;
        }
        case 5: {  // a clean stop of one replica
          const int r = primary >= 0 && Rand(0, 1) ? primary : victim;
          Kill(r, SIGTERM);
          Sleep(Rand(0, 1500));
          Start(r);
          break;
        }
        case 6:
        case 7: {  // the whole group stopped, restarted in some order
          std::vector<int> order = {0, 1, 2};
          std::shuffle(order.begin(), order.end(), rng_);
          for (int r : order) {
            Kill(r, SIGTERM);
            Sleep(Rand(0, 200));
          }
          Sleep(Rand(0, 1000));
          std::shuffle(order.begin(), order.end(), rng_);
          for (int r : order) {
            Start(r);
            Sleep(Rand(0, 500));
          }
          break;
        }
        case 8: {  // etcd down for a moment
          Log("kill -9 etcd");
          etcd_.Kill();
          Sleep(Rand(200, 2500));
          Log("restart etcd");
          if (!etcd_.Restart()) Log("etcd did not restart");
          break;
        }
        case 9:  // a quiet spell
          Log("quiet");
          break;
        case 10: {  // a backup paused, then the primary killed: the paused one must wait
          if (primary < 0 || !MayKill()) {
            Log("skip pause-and-kill: fewer than 2 in the ISR, or a kill within 2.5 s");
            break;
          }
          const int backup = (primary + Rand(1, kReplicas - 1)) % kReplicas;
          Pause(backup, true);
          Sleep(Rand(0, 300));
          Kill(primary, SIGKILL);
          Sleep(Rand(0, 1500));
          Pause(backup, false);
          Sleep(Rand(0, 1000));
          Start(primary);
          break;
        }
        case 11: {  // SIGTERM, then kill -9 during the final checkpoint
          if (!MayKill()) {
            Log("skip term-then-kill: fewer than 2 in the ISR, or a kill within 2.5 s");
            break;
          }
          const int r = primary >= 0 && Rand(0, 1) ? primary : victim;
          Log("SIGTERM then kill -9 replica " + std::to_string(r));
          kill(proc_[r]->pid(), SIGTERM);
          Sleep(Rand(0, 60));
          Kill(r, SIGKILL);
          Sleep(Rand(0, 1000));
          Start(r);
          break;
        }
        case 13: {  // etcd loses its data: the group forms again (an unclean election)
          if (!MayKill()) {
            Log("skip etcd wipe: fewer than 2 in the ISR, or a kill within 2.5 s");
            break;
          }
          Log("etcd loses its data");
          if (!etcd_.Wipe()) Log("etcd did not restart");
          break;
        }
        case 14: {  // etcd frozen: calls hang instead of failing
          const pid_t pid = etcd_.pid();
          if (pid <= 0) break;
          Log("SIGSTOP etcd");
          kill(pid, SIGSTOP);
          Sleep(Rand(200, 3000));
          Log("SIGCONT etcd");
          kill(pid, SIGCONT);
          break;
        }
        case 12: {  // etcd down while the primary is killed
          if (primary < 0 || !MayKill()) {
            Log("skip etcd-and-kill: fewer than 2 in the ISR, or a kill within 2.5 s");
            break;
          }
          Log("kill -9 etcd");
          etcd_.Kill();
          Sleep(Rand(0, 500));
          Kill(primary, SIGKILL);
          Sleep(Rand(0, 800));
          Start(primary);
          Sleep(Rand(0, 1500));
          Log("restart etcd");
          if (!etcd_.Restart()) Log("etcd did not restart");
          break;
        }
      }
      Sleep(Rand(200, 1500));
    }
  }

  void Heal() {
    Log("heal");
    for (int r = 0; r < kReplicas; ++r) {
      if (stopped_[r]) Pause(r, false);
      if (!proc_[r]) Start(r);
    }
  }

  // Pulls every row pushed from the current primary and checks each push's outcome.
  bool Check(const std::string& when) {
    auto client = PsClient::Connect(Options());
    if (!client.ok()) return Fail("connect: " + client.status().ToString());
    std::vector<Push> pushes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pushes = pushes_;
    }
    std::vector<uint64_t> keys;
    for (const Push& p : pushes) keys.push_back(p.key);
    std::vector<float> rows(keys.size());
    for (size_t at = 0; at < keys.size(); at += 20000) {
      const size_t n = std::min<size_t>(20000, keys.size() - at);
      Status st;
      for (int attempt = 0; attempt < 10; ++attempt) {
        VersionVector v;
        st = (*client)->PullSparse("rows", keys.data() + at, n, rows.data() + at, &v).Wait();
        if (st.ok()) break;
      }
      if (!st.ok()) return Fail(when + ": pull failed: " + st.ToString());
    }
    size_t lost = 0, twice = 0, unknown_applied = 0, refused_applied = 0;
    for (size_t i = 0; i < pushes.size(); ++i) {
      const float x = rows[i];
      const Push& p = pushes[i];
      const bool bad = (p.outcome == Outcome::kAcked && x != 1.0f) ||
                       (p.outcome == Outcome::kUnknown && x != 0.0f && x != 1.0f) ||
                       (p.outcome == Outcome::kNotApplied && x != 0.0f);
      lost += p.outcome == Outcome::kAcked && x == 0.0f;
      twice += x != 0.0f && x != 1.0f;
      unknown_applied += p.outcome == Outcome::kUnknown && x == 1.0f;
      refused_applied += p.outcome == Outcome::kNotApplied && x != 0.0f;
      if (bad && lost + twice + refused_applied <= 10) {
        std::printf("  %s: key %llx (client %llu, push %llu) %s reads %g%s%s\n", when.c_str(),
                    static_cast<unsigned long long>(p.key),
                    static_cast<unsigned long long>(p.key >> 40),
                    static_cast<unsigned long long>(p.key & ((uint64_t{1} << 40) - 1)),
                    p.outcome == Outcome::kAcked     ? "acknowledged"
                    : p.outcome == Outcome::kUnknown ? "outcome unknown"
                                                     : "not applied",
                    x, p.error.empty() ? "" : ": ", p.error.c_str());
      }
    }
    const bool ok = lost == 0 && twice == 0 && refused_applied == 0;
    std::printf(
        "seed %llu: %s: %zu pushes; lost %zu, applied twice %zu, refused but applied %zu; "
        "%zu of unknown outcome applied; %d unclean SIGTERM exits%s\n",
        static_cast<unsigned long long>(seed_), when.c_str(), pushes.size(), lost, twice,
        refused_applied, unknown_applied, bad_exits_, ok ? "" : "  <-- VIOLATION");
    std::fflush(stdout);
    return ok;
  }

  const uint64_t seed_;
  const double seconds_;
  std::mt19937_64 rng_;
  std::string dir_;
  testing::EtcdServer etcd_;
  std::string ep_[kReplicas];
  int admin_[kReplicas] = {};
  std::unique_ptr<testing::Subprocess> proc_[kReplicas];
  bool stopped_[kReplicas] = {};
  std::vector<std::thread> clients_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Push> pushes_;
  int faults_ = 0, bad_exits_ = 0;
  int client_timeout_ms_ = 4000, min_insync_ = 2;
  double last_kill_s_ = -10;
  Clock::time_point t0_ = Clock::now();
};

}  // namespace
}  // namespace onlineps::ps

int main(int argc, char** argv) {
  uint64_t first = 1, seeds = 2;
  double seconds = 15;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--first") {
      first = std::strtoull(next(), nullptr, 10);
    } else if (a == "--seeds") {
      seeds = std::strtoull(next(), nullptr, 10);
    } else if (a == "--seconds") {
      seconds = std::strtod(next(), nullptr);
    } else if (a == "--ps-binary") {
      onlineps::ps::ChaosRun::ps_binary = next();
    } else if (a == "--keep-logs") {
      onlineps::ps::ChaosRun::keep_logs = true;
    } else {
      std::fprintf(stderr,
                   "usage: replica_chaos [--seeds N] [--first S] [--seconds T] [--keep-logs] "
                   "[--ps-binary PATH]\n");
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  std::vector<uint64_t> failed;
  for (uint64_t s = first; s < first + seeds; ++s) {
    onlineps::ps::ChaosRun run(s, seconds);
    if (!run.Run()) failed.push_back(s);
  }
  std::printf("%llu seeds from %llu: %zu failed", static_cast<unsigned long long>(seeds),
              static_cast<unsigned long long>(first), failed.size());
  for (uint64_t s : failed) std::printf(" %llu", static_cast<unsigned long long>(s));
  std::printf("\n");
  return failed.empty() ? 0 : 1;
}
