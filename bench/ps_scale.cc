// ps_scale: one real shard process (onlineps_ps) grown to --rows sparse rows by one
// sequential client pushing batches of new keys, and the figures of a table at scale:
// growth (p50 and worst call per stage), existing-key push throughput at 1M, 4M, 10M and
// the final row count, RSS per row against the minimum (key + row floats) and against the
// shard's own onlineps_ps_table_memory_bytes, a full checkpoint under load (push p50 /
// p99 before and during it, peak memory of the shard plus its writer), then an
// incremental one (a delta of the rows pushed since, the same figures), and a restore of
// the full file and the delta (time, peak RSS against the restored RSS). Not a test.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ps/ps_client.h"
#include "tests/raw_http_client.h"
#include "tests/subprocess.h"

namespace onlineps::ps {
namespace {

using Clock = std::chrono::steady_clock;
using onlineps::testing::FreePort;
using onlineps::testing::RawClient;
using onlineps::testing::Subprocess;

constexpr char kUsage[] =
    "usage: ps_scale [flags]\n"
    "Grows one sparse table on one shard process to --rows rows and prints growth,\n"
    "throughput, memory, checkpoint and restore figures.\n"
    "  --rows N          rows to grow the table to (default 1000000)\n"
    "  --dim D           floats per row (default 16)\n"
    "  --optimizer NAME  sgd, adagrad, ftrl or adam (default sgd)\n"
    "  --batch K         keys per push (default 10000)\n"
    "  --calls C         existing-key pushes measured at each stage (default 100)\n"
    "  --load-s S        seconds of load measured before the full checkpoint (default 3)\n"
    "  --delta-rows R    rows pushed (10,000-key batches of random existing keys) between\n"
    "                    the full checkpoint and the delta after it (default: a tenth of\n"
    "                    --rows)\n"
    "  --csv FILE        also write figure,p50_us,p99_us,per_s,baseline_per_s,ratio rows\n"
    "  --bin-dir DIR     where onlineps_ps is (default: " ONLINEPS_BIN_DIR
    ")\n"
    "  --help            this text\n";

struct Flags {
  uint64_t rows = 1000000;
  uint32_t dim = 16;
  std::string optimizer = "sgd";
  size_t batch = 10000;
  int calls = 100;
  double load_s = 3;
  uint64_t delta_rows = 0;  // 0: rows / 10
  std::string csv;
  std::string bin_dir = ONLINEPS_BIN_DIR;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ps_scale: unknown flag or missing value: %s\n%s", a.c_str(), kUsage);
      return false;
    }
    const char* v = argv[++i];
    char* end = nullptr;
    auto number = [&](const char* what) {
      const double x = std::strtod(v, &end);
      if (end == v || *end != 0 || x <= 0) {
        std::fprintf(stderr, "ps_scale: %s needs a positive number, got '%s'\n", what, v);
        std::exit(2);
      }
      return x;
    };
    if (a == "--rows") {
      f->rows = static_cast<uint64_t>(number("--rows"));
    } else if (a == "--dim") {
      f->dim = static_cast<uint32_t>(number("--dim"));
    } else if (a == "--optimizer") {
      f->optimizer = v;
    } else if (a == "--batch") {
      f->batch = static_cast<size_t>(number("--batch"));
    } else if (a == "--calls") {
      f->calls = static_cast<int>(number("--calls"));
    } else if (a == "--load-s") {
      f->load_s = number("--load-s");
    } else if (a == "--delta-rows") {
      f->delta_rows = static_cast<uint64_t>(number("--delta-rows"));
    } else if (a == "--csv") {
      f->csv = v;
    } else if (a == "--bin-dir") {
      f->bin_dir = v;
    } else {
      std::fprintf(stderr, "ps_scale: unknown flag: %s\n%s", a.c_str(), kUsage);
      return false;
    }
  }
  return true;
}

// A field of /proc/PID/status (kB), in bytes; 0 if unreadable.
uint64_t ProcStatusBytes(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0)
      return std::strtoull(line.c_str() + std::strlen(field), nullptr, 10) * 1024;
  }
  return 0;
}

// Proportional set size of pid (shared pages split among their sharers), in bytes.
// onlineps_ps_table_memory_bytes of the table, from the shard's /metrics; -1 if absent.
double TableMemoryMetric(int admin_port) {
  auto c = RawClient::Connect(admin_port);
  if (!c || !c->Send("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) return -1;
  auto reply = c->Read(std::chrono::seconds(5));
  if (!reply) return -1;
  std::istringstream body(reply->body);
  std::string line;
  while (std::getline(body, line)) {
    if (line.rfind("onlineps_ps_table_memory_bytes{", 0) == 0 &&
        line.find("\"scale\"") != std::string::npos) {
      return std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
    }
  }
  return -1;
}

struct Dist {
  double p50 = 0, p99 = 0, max = 0;
};

Dist Summarize(std::vector<double> us) {
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)], us.back()};
}

class Csv {
 public:
  explicit Csv(const std::string& path) {
    if (path.empty()) return;
    f_ = std::fopen(path.c_str(), "w");
    if (!f_) {
      std::fprintf(stderr, "ps_scale: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
      std::exit(2);
    }
    std::fprintf(f_, "figure,p50_us,p99_us,per_s,baseline_per_s,ratio\n");
  }
  ~Csv() {
    if (f_) std::fclose(f_);
  }
  void Row(const std::string& figure, double p50, double p99, double per_s, double base,
           double ratio) {
    if (f_)
      std::fprintf(f_, "%s,%.1f,%.1f,%.1f,%.1f,%.3f\n", figure.c_str(), p50, p99, per_s, base,
                   ratio);
  }

 private:
  std::FILE* f_ = nullptr;
};

uint64_t KeyOf(uint64_t i) { return i * 0x9e3779b97f4a7c15ULL + 1; }

class Scale {
 public:
  explicit Scale(const Flags& f) : f_(f), csv_(f.csv) {}

  int Run() {
    dir_ = (std::filesystem::temp_directory_path() / ("ps_scale." + std::to_string(getpid())))
               .string();
    std::filesystem::create_directories(dir_);
    if (!StartShard()) return 1;
    TableSpec spec;
    spec.name = "scale";
    spec.kind = TableKind::kSparse;
    spec.dim = f_.dim;
    spec.optimizer = f_.optimizer;
    if (Status st = client_->CreateTable(spec); !st.ok()) {
      std::fprintf(stderr, "ps_scale: create table: %s\n", st.ToString().c_str());
      return 1;
    }
    rss0_ = ProcStatusBytes(shard_->pid(), "VmRSS:");
    row_floats_ = f_.dim * (1 + SlotsOf(f_.optimizer));
    std::printf(
        "ps_scale: dim %u %s, batches of %zu keys, growing to %llu rows (shard RSS %.1f MiB "
        "empty)\n",
        f_.dim, f_.optimizer.c_str(), f_.batch, static_cast<unsigned long long>(f_.rows),
        rss0_ / 1048576.0);
    vals_.assign(f_.batch * f_.dim, 0.001f);
    std::vector<uint64_t> stages;
    for (uint64_t m : {1000000ull, 4000000ull, 10000000ull}) {
      if (m < f_.rows) stages.push_back(m);
    }
    stages.push_back(f_.rows);
    for (uint64_t stage : stages) {
      Grow(stage);
      Existing(stage);
      Memory(stage);
    }
    CheckpointUnderLoad(/*delta=*/false);
    QuietCheckpoint();
    CheckpointUnderLoad(/*delta=*/true);
    Restore();
    std::filesystem::remove_all(dir_);
    return 0;
  }

 private:
  static int SlotsOf(const std::string& opt) {
    if (opt == "adagrad") return 1;
    if (opt == "ftrl" || opt == "adam") return 2;
    return 0;
  }

  bool StartShard() {
    admin_port_ = FreePort();
    shard_ = std::make_unique<Subprocess>(std::vector<std::string>{
        f_.bin_dir + "/onlineps_ps", "--listen", "tcp://127.0.0.1:0", "--admin-port",
        std::to_string(admin_port_), "--checkpoint-dir", dir_, "--log-level", "warn"});
    endpoint_ = shard_->WaitForLine("LISTENING ", std::chrono::minutes(10));
    if (endpoint_.empty()) {
      std::fprintf(stderr, "ps_scale: %s/onlineps_ps did not start\n", f_.bin_dir.c_str());
      return false;
    }
    PsClientOptions co;
    co.shards = {endpoint_};
    co.timeout = std::chrono::seconds(60);
    co.attempt_timeout = std::chrono::seconds(60);
    auto c = PsClient::Connect(co);
    if (!c.ok()) return false;
    client_ = std::move(c).value();
    return true;
  }

  double Push(const uint64_t* keys) {
    auto t0 = Clock::now();
    VersionVector v;
    Status st = client_->PushSparse("scale", keys, f_.batch, vals_.data(), v, nullptr).Wait();
    if (!st.ok()) {
      std::fprintf(stderr, "ps_scale: push: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }

  void Grow(uint64_t target) {
    std::vector<uint64_t> keys(f_.batch);
    std::vector<double> us;
    const uint64_t from = rows_;
    while (rows_ < target) {
      for (size_t i = 0; i < f_.batch; ++i) keys[i] = KeyOf(rows_ + i);
      us.push_back(Push(keys.data()));
      rows_ += f_.batch;
      if (us.size() % 100 == 0) {
        std::fprintf(stderr, "  grown to %llu rows\r", static_cast<unsigned long long>(rows_));
      }
    }
    const Dist d = Summarize(us);
    const std::string fig = "grow new-key push " + std::to_string(f_.batch) + "x" +
                            std::to_string(f_.dim) + " to " + std::to_string(target) + " rows";
    std::printf("%-52s p50 %9.1f us  p99 %9.1f us  worst %9.1f us (%.1fx p50) | %.2f M keys/s\n",
                fig.c_str(), d.p50, d.p99, d.max, d.max / d.p50, f_.batch / d.p50);
    (void)from;
    csv_.Row(fig, d.p50, d.p99, f_.batch / d.p50 * 1e6, 0, d.max / d.p50);
  }

  void Existing(uint64_t stage) {
    std::mt19937_64 rng(stage);
    std::vector<uint64_t> keys(f_.batch);
    std::vector<double> us;
    for (int c = 0; c < f_.calls; ++c) {
      for (auto& k : keys) k = KeyOf(rng() % rows_);
      us.push_back(Push(keys.data()));
    }
    const Dist d = Summarize(us);
    const double per_s = f_.batch / d.p50 * 1e6;
    if (first_existing_ == 0) first_existing_ = per_s;
    const std::string fig = "existing-key push " + std::to_string(f_.batch) + "x" +
                            std::to_string(f_.dim) + " at " + std::to_string(rows_) + " rows";
    std::printf(
        "%-52s p50 %9.1f us  p99 %9.1f us (%.1fx p50) | %.2f M keys/s, %.2f of the first stage\n",
        fig.c_str(), d.p50, d.p99, d.p99 / d.p50, per_s / 1e6, per_s / first_existing_);
    csv_.Row(fig, d.p50, d.p99, per_s, first_existing_, per_s / first_existing_);
  }

  void Memory(uint64_t stage) {
    // The shard refreshes its table metrics on its maintenance tick.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const uint64_t rss = ProcStatusBytes(shard_->pid(), "VmRSS:");
    const double per_row = static_cast<double>(rss - rss0_) / rows_;
    const double min_row = 8.0 + row_floats_ * 4.0;
    const double metric = TableMemoryMetric(admin_port_);
    std::printf(
        "memory at %llu rows: RSS %.1f MiB, %.1f bytes per row (minimum %.0f: %.2fx), "
        "memory_bytes %.1f MiB (%.2f of RSS growth)\n",
        static_cast<unsigned long long>(stage), rss / 1048576.0, per_row, min_row,
        per_row / min_row, metric / 1048576.0, metric / static_cast<double>(rss - rss0_));
    csv_.Row("rss bytes per row at " + std::to_string(rows_) + " rows", 0, 0, per_row, min_row,
             per_row / min_row);
  }

  // A checkpoint while one client pushes batches of random existing keys. The first
  // (full) one after --load-s seconds of that load; the delta after --delta-rows rows were
  // pushed since the full one's cut.
  void CheckpointUnderLoad(bool delta) {
    struct Sample {
      double t_s, us;
    };
    std::vector<Sample> samples;
    std::atomic<size_t> pushes{0};
    std::atomic<bool> stop{false};
    const auto t0 = Clock::now();
    auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    std::thread load([&] {
      std::mt19937_64 rng(delta ? 98 : 99);
      std::vector<uint64_t> keys(f_.batch);
      while (!stop) {
        for (auto& k : keys) k = KeyOf(rng() % rows_);
        const double start = since();
        samples.push_back({start, Push(keys.data())});
        ++pushes;
      }
    });
    // The shard's RSS from /proc/PID/status (its counters: the checkpoint writer is a
    // thread of the shard). Not smaps_rollup's PSS: that walks the page tables under the
    // shard's mmap lock, and the copy blocks a push maps during a checkpoint then waited
    // for the walk (10-20 ms at 10M rows), a stall of the bench's own making.
    uint64_t peak = 0, before = ProcStatusBytes(shard_->pid(), "VmRSS:");
    std::atomic<bool> sampling{true};
    std::thread sampler([&] {
      while (sampling) {
        peak = std::max(peak, ProcStatusBytes(shard_->pid(), "VmRSS:"));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    const uint64_t delta_rows = f_.delta_rows != 0 ? f_.delta_rows : rows_ / 10;
    if (delta) {
      while (pushes * f_.batch < delta_rows) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(f_.load_s));
    }
    PsClientOptions co;
    co.shards = {endpoint_};
    co.timeout = std::chrono::minutes(10);
    co.attempt_timeout = std::chrono::minutes(10);
    auto ckpt_client = PsClient::Connect(co);
    const double c0 = since();
    Status st = ckpt_client.ok() ? (*ckpt_client)->Checkpoint() : ckpt_client.status();
    const double c1 = since();
    stop = true;
    load.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    sampling = false;
    sampler.join();
    if (!st.ok()) {
      std::fprintf(stderr, "ps_scale: checkpoint: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    std::vector<double> out, during;
    for (const Sample& s : samples) {
      if (s.t_s < c0) out.push_back(s.us);
      if (s.t_s >= c0 && s.t_s <= c1) during.push_back(s.us);
    }
    const Dist o = Summarize(out), d = Summarize(during);
    const std::string file = NewestCheckpointFile();
    const uint64_t bytes = std::filesystem::file_size(dir_ + "/" + file);
    const char* kind = delta ? "delta" : "full";
    std::printf(
        "%s checkpoint of %llu rows%s: %.2f s, %.1f MiB file (%s); pushes during it: %zu, p50 "
        "%.1f us, p99 %.1f us, worst %.1f us; outside: p50 %.1f us, p99 %.1f us (p99 ratio "
        "%.2f)\n",
        kind, static_cast<unsigned long long>(rows_),
        delta
            ? (" (about " + std::to_string(delta_rows) + " row updates since the full one)").c_str()
            : "",
        c1 - c0, bytes / 1048576.0, file.c_str(), during.size(), d.p50, d.p99, d.max, o.p50, o.p99,
        d.p99 / o.p99);
    // Where the slow pushes fall: a push early in a full checkpoint copies most of the
    // rows it changes (the writer has not reached them), a late one almost none.
    std::string tenths;
    for (int k = 0; k < 10; ++k) {
      std::vector<double> part;
      for (const Sample& s : samples) {
        const double at = (s.t_s - c0) / (c1 - c0);
        if (at >= k / 10.0 && at < (k + 1) / 10.0) part.push_back(s.us);
      }
      char buf[48];
      std::snprintf(buf, sizeof buf, "%s%.0f", k == 0 ? "" : " / ",
                    part.empty() ? 0.0 : Summarize(part).p99);
      tenths += buf;
    }
    std::printf("  p99 (us) of the pushes in each tenth of the %s checkpoint: %s\n",
                delta ? "delta" : "full", tenths.c_str());
    std::printf(
        "memory during the %s checkpoint: peak shard RSS %.1f MiB, %.2fx the %.1f MiB "
        "before\n",
        kind, peak / 1048576.0, static_cast<double>(peak) / before, before / 1048576.0);
    const std::string at = " at " + std::to_string(rows_) + " rows";
    csv_.Row(std::string("push during ") + (delta ? "delta " : "") + "checkpoint" + at, d.p50,
             d.p99, f_.batch / d.p50 * 1e6, f_.batch / o.p50 * 1e6, d.p99 / o.p99);
    csv_.Row(std::string(delta ? "delta" : "full") + " checkpoint seconds and bytes" + at,
             (c1 - c0) * 1e6, 0, static_cast<double>(bytes), 0, 0);
    csv_.Row(std::string("peak memory during ") + (delta ? "delta " : "") + "checkpoint" + at, 0, 0,
             static_cast<double>(peak), static_cast<double>(before),
             static_cast<double>(peak) / before);
  }

  // A checkpoint without load: the pushes during the full checkpoint under load changed
  // more than half the rows, so this one is full too; the delta then holds only the
  // --delta-rows updates pushed after it.
  void QuietCheckpoint() {
    const auto t0 = Clock::now();
    Status st = client_->Checkpoint();
    if (!st.ok()) {
      std::fprintf(stderr, "ps_scale: checkpoint: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    std::printf("checkpoint without load (starts the delta's change set): %.2f s, %s\n",
                std::chrono::duration<double>(Clock::now() - t0).count(),
                NewestCheckpointFile().c_str());
  }

  // The checkpoint file written last (the full file or a delta after it).
  std::string NewestCheckpointFile() {
    std::string newest;
    std::filesystem::file_time_type t{};
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name.find(".tmp") != std::string::npos || name.find(".replica") != std::string::npos)
        continue;
      if (newest.empty() || e.last_write_time() > t) {
        newest = name;
        t = e.last_write_time();
      }
    }
    return newest;
  }

  void Restore() {
    kill(shard_->pid(), SIGKILL);  // the checkpoint above is the state to restore
    client_.reset();
    shard_.reset();
    const auto t0 = Clock::now();
    Subprocess restored({f_.bin_dir + "/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                         "--admin-port", "-1", "--checkpoint-dir", dir_, "--log-level", "warn"});
    uint64_t hwm = 0;
    std::atomic<bool> done{false};
    std::thread watch([&] {
      while (!done) {
        hwm = std::max(hwm, ProcStatusBytes(restored.pid(), "VmRSS:"));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    const std::string ep = restored.WaitForLine("LISTENING ", std::chrono::minutes(30));
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    done = true;
    watch.join();
    hwm = std::max(hwm, ProcStatusBytes(restored.pid(), "VmHWM:"));
    const uint64_t rss = ProcStatusBytes(restored.pid(), "VmRSS:");
    if (ep.empty()) {
      std::fprintf(stderr, "ps_scale: the restored shard did not start\n");
      std::exit(1);
    }
    std::printf(
        "restore of %llu rows: %.2f s to serving, peak RSS %.1f MiB, %.2fx the restored %.1f MiB\n",
        static_cast<unsigned long long>(rows_), secs, hwm / 1048576.0,
        static_cast<double>(hwm) / rss, rss / 1048576.0);
    csv_.Row("restore peak rss at " + std::to_string(rows_) + " rows", secs * 1e6, 0,
             static_cast<double>(hwm), static_cast<double>(rss), static_cast<double>(hwm) / rss);
    kill(restored.pid(), SIGKILL);
  }

  const Flags f_;
  Csv csv_;
  std::string dir_, endpoint_;
  int admin_port_ = 0;
  std::unique_ptr<Subprocess> shard_;
  std::unique_ptr<PsClient> client_;
  std::vector<float> vals_;
  uint64_t rows_ = 0, rss0_ = 0;
  uint32_t row_floats_ = 0;
  double first_existing_ = 0;
};

}  // namespace
}  // namespace onlineps::ps

int main(int argc, char** argv) {
  onlineps::ps::Flags flags;
  if (!onlineps::ps::ParseFlags(argc, argv, &flags)) return 2;
  return onlineps::ps::Scale(flags).Run();
}
