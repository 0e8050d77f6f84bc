// ps_bench: parameter-server figures, each printed beside a raw ZeroMQ baseline that
// moves the same bytes in the same run (DEALER -> ROUTER, one 16-byte reply, the same
// callers and calls in flight), so ratios stay meaningful on a noisy machine. Not a test.
// `ps_bench --help` lists the flags.
#include <prometheus/registry.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ps/ps_client.h"
#include "ps/rule_set.h"
#include "ps/shard_server.h"
#include "tests/subprocess.h"

namespace onlineps::ps {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "usage: ps_bench [flags]\n"
    "PS push and pull figures beside raw ZeroMQ moving the same bytes in the same run.\n"
    "  --iters N      calls per caller per figure (default 2000; the 10000-key figures\n"
    "                 make N/10 calls, the 4 MiB ones N/20)\n"
    "  --quick        --iters 200\n"
    "  --mem          one in-process shard on mem:// (no network): the shard's own cost\n"
    "  --shards N     N shard processes (onlineps_ps) on tcp loopback, keys and dense\n"
    "                 slices hash-partitioned as in production (default 1: in process)\n"
    "  --clients N    concurrent callers, each with its own client (default 1); with\n"
    "                 N > 1 sparse pushes also run with all callers on the same keys\n"
    "  --inflight N   calls each caller keeps outstanding (default 1)\n"
    "  --pull-part-bytes N  the client's PsClientOptions::pull_part_bytes (default: the\n"
    "                 library's, 256 KiB; 0 sends each shard's rows of a pull as one part)\n"
    "  --csv FILE     also write figure,p50_us,p99_us,per_s,baseline_per_s,ratio rows\n"
    "                 (per_s: calls per second of all callers; ratio: per_s / baseline)\n"
    "  --only TEXT    only the figures whose name contains TEXT (e.g. 'sparse push 10000',\n"
    "                 'apply' for the per-row and apply-rate figures): to profile one\n"
    "  --bin-dir DIR  where onlineps_ps is, for --shards (default: " ONLINEPS_BIN_DIR
    ")\n"
    "  --help         this text\n";

struct Flags {
  int iters = 2000;
  bool mem = false;
  int shards = 1, clients = 1, inflight = 1;
  long pull_part_bytes = -1;  // -1: the library's default
  std::string csv, only, bin_dir = ONLINEPS_BIN_DIR;
  bool Wants(const std::string& figure) const { return figure.find(only) != std::string::npos; }
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  auto count = [&](int& i, const char* name, int* out) {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ps_bench: %s needs a value\n", name);
      return false;
    }
    char* end = nullptr;
    const long v = std::strtol(argv[++i], &end, 10);
    if (*end != 0 || v < 1 || v > 1000000) {
      std::fprintf(stderr, "ps_bench: %s needs a positive integer, got '%s'\n", name, argv[i]);
      return false;
    }
    *out = static_cast<int>(v);
    return true;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool ok = true;
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--mem") {
      f->mem = true;
    } else if (a == "--quick") {
      f->iters = 200;
    } else if (a == "--iters") {
      ok = count(i, "--iters", &f->iters);
    } else if (a == "--shards") {
      ok = count(i, "--shards", &f->shards);
    } else if (a == "--clients") {
      ok = count(i, "--clients", &f->clients);
    } else if (a == "--inflight") {
      ok = count(i, "--inflight", &f->inflight);
    } else if (a == "--pull-part-bytes" && i + 1 < argc) {
      char* end = nullptr;
      f->pull_part_bytes = std::strtol(argv[++i], &end, 10);
      if (*end != 0 || f->pull_part_bytes < 0) {
        std::fprintf(stderr, "ps_bench: --pull-part-bytes needs a byte count, got '%s'\n", argv[i]);
        return false;
      }
    } else if ((a == "--csv" || a == "--bin-dir" || a == "--only") && i + 1 < argc) {
      (a == "--csv" ? f->csv : a == "--only" ? f->only : f->bin_dir) = argv[++i];
    } else {
      std::fprintf(stderr, "ps_bench: unknown flag or missing value: %s\n%s", a.c_str(), kUsage);
      return false;
    }
    if (!ok) return false;
  }
  if (f->mem && f->shards > 1) {
    std::fprintf(stderr, "ps_bench: --mem runs one in-process shard; it cannot go with --shards\n");
    return false;
  }
  return true;
}

struct Stats {
  double p50_us = 0, p99_us = 0, per_s = 0;  // per_s: calls per second, all callers
};

// `callers` threads, each keeping `inflight` calls outstanding for `iters` calls.
// issue(caller, i) starts call i and returns a function that waits for it.
using Waiter = std::function<void()>;
Stats Load(int callers, int inflight, int iters,
           const std::function<Waiter(int caller, int i)>& issue) {
  std::vector<std::vector<double>> us(callers);
  auto run = [&](int c, int n, std::vector<double>* out) {
    std::deque<std::pair<Waiter, Clock::time_point>> pending;
    for (int i = 0; i < n || !pending.empty();) {
      if (i < n && static_cast<int>(pending.size()) < inflight) {
        const auto t0 = Clock::now();
        pending.emplace_back(issue(c, i++), t0);
        continue;
      }
      pending.front().first();
      if (out) {
        out->push_back(
            std::chrono::duration<double, std::micro>(Clock::now() - pending.front().second)
                .count());
      }
      pending.pop_front();
    }
  };
  for (int c = 0; c < callers; ++c) run(c, std::max(3, iters / 10), nullptr);  // warm-up
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < callers; ++c) threads.emplace_back(run, c, iters, &us[c]);
  for (auto& t : threads) t.join();
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> all;
  for (auto& v : us) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  return {all[all.size() / 2], all[std::min(all.size() - 1, all.size() * 99 / 100)],
          all.size() / wall_s};
}

// Raw ZeroMQ: `servers` ROUTER threads (one per shard) that answer every multipart
// message with one 16-byte frame; a call sends its bytes split evenly over them.
class RawEcho {
 public:
  explicit RawEcho(int servers) : ctx_(1) {
    for (int s = 0; s < servers; ++s) {
      auto r = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::router);
      r->bind("tcp://127.0.0.1:0");
      endpoints_.push_back(r->get(zmq::sockopt::last_endpoint));
      threads_.emplace_back([this, sock = r.get()] { Loop(sock); });
      routers_.push_back(std::move(r));
    }
  }
  ~RawEcho() {
    stop_ = true;
    for (const std::string& ep : endpoints_) {
      zmq::socket_t d(ctx_, zmq::socket_type::dealer);
      d.connect(ep);
      d.send(zmq::buffer("x", 1), zmq::send_flags::none);
      threads_.front().join();
      threads_.erase(threads_.begin());
    }
  }
  // One caller's sockets: a DEALER to every server.
  class Caller {
   public:
    Caller(zmq::context_t& ctx, const std::vector<std::string>& eps) {
      for (const auto& ep : eps) {
        dealers_.emplace_back(ctx, zmq::socket_type::dealer);
        dealers_.back().connect(ep);
      }
    }
    // Sends one call: every frame split evenly over the servers.
    void Send(const std::vector<std::pair<const void*, size_t>>& frames) {
      const size_t n = dealers_.size();
      for (size_t s = 0; s < n; ++s) {
        for (size_t i = 0; i < frames.size(); ++i) {
          const size_t part = frames[i].second / n;
          zmq::message_t m(static_cast<const char*>(frames[i].first) + part * s, part);
          dealers_[s].send(
              m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
        }
      }
    }
    void Receive() {
      for (auto& d : dealers_) {
        zmq::message_t reply;
        (void)d.recv(reply);
      }
    }

   private:
    std::vector<zmq::socket_t> dealers_;
  };
  std::unique_ptr<Caller> NewCaller() { return std::make_unique<Caller>(ctx_, endpoints_); }

 private:
  void Loop(zmq::socket_t* router) {
    while (true) {
      std::vector<zmq::message_t> parts;
      zmq::message_t m;
      do {
        (void)router->recv(m);
        parts.emplace_back(std::move(m));
      } while (router->get(zmq::sockopt::rcvmore));
      if (stop_) return;
      router->send(parts[0], zmq::send_flags::sndmore);
      router->send(zmq::buffer("0123456789abcdef", 16), zmq::send_flags::none);
    }
  }
  zmq::context_t ctx_;
  std::vector<std::unique_ptr<zmq::socket_t>> routers_;
  std::vector<std::string> endpoints_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
};

class Bench {
 public:
  Bench(const Flags& f, std::vector<std::unique_ptr<PsClient>> clients)
      : f_(f), clients_(std::move(clients)), raw_(f.mem ? 1 : f.shards) {
    if (!f.csv.empty()) {
      csv_ = std::fopen(f.csv.c_str(), "w");
      if (!csv_) {
        std::fprintf(stderr, "ps_bench: cannot write %s: %s\n", f.csv.c_str(),
                     std::strerror(errno));
        std::exit(2);
      }
      std::fprintf(csv_, "figure,p50_us,p99_us,per_s,baseline_per_s,ratio\n");
    }
    for (int c = 0; c < f.clients; ++c) raw_callers_.push_back(raw_.NewCaller());
  }
  ~Bench() {
    if (csv_) std::fclose(csv_);
  }

  // One figure: the PS calls and the raw calls with the same callers and window.
  Stats Figure(const std::string& name, int iters, const std::function<Waiter(int, int)>& ps,
               const std::vector<std::pair<const void*, size_t>>& raw_frames,
               const std::string& extra_unit = "", double units_per_call = 0) {
    if (!f_.Wants(name)) return {};
    ++ran_;
    const Stats p = Load(f_.clients, f_.inflight, iters, ps);
    const Stats r = Load(f_.clients, f_.inflight, iters, [&](int c, int) -> Waiter {
      raw_callers_[c]->Send(raw_frames);
      return [this, c] { raw_callers_[c]->Receive(); };
    });
    char extra[96] = "";
    if (units_per_call > 0) {
      std::snprintf(extra, sizeof extra, " | %.2f %s (raw %.2f)", p.per_s * units_per_call,
                    extra_unit.c_str(), r.per_s * units_per_call);
    }
    std::printf(
        "%-40s p50 %8.1f us  p99 %8.1f us  %9.0f calls/s | raw zmq p50 %8.1f us  p99 %8.1f us  "
        "%9.0f calls/s | ratio %.2f%s\n",
        name.c_str(), p.p50_us, p.p99_us, p.per_s, r.p50_us, r.p99_us, r.per_s, p.per_s / r.per_s,
        extra);
    std::fflush(stdout);
    if (csv_) {
      std::fprintf(csv_, "%s,%.1f,%.1f,%.1f,%.1f,%.3f\n", name.c_str(), p.p50_us, p.p99_us, p.per_s,
                   r.per_s, p.per_s / r.per_s);
    }
    return p;
  }

  // The number of figures printed.
  int Run() {
    std::printf("onlineps ps_bench: %s, %d caller(s), %d call(s) in flight each, %d iterations\n",
                f_.mem ? "1 in-process shard on mem://"
                       : (std::to_string(f_.shards) + " shard(s) on tcp loopback").c_str(),
                f_.clients, f_.inflight, f_.iters);
    OneKey();
    SparseCase(1000, 16, f_.iters);
    SparseCase(10000, 64, std::max(20, f_.iters / 10));
    DenseCase(1 << 20, std::max(20, f_.iters / 20));
    if (f_.mem && f_.Wants("apply cost")) {
      ApplyCost(10000, 64);
      ++ran_;
    }
    return ran_;
  }

 private:
  PsClient& C(int c) { return *clients_[c]; }

  void OneKey() {
    const uint64_t key = 42;
    const float one = 0.5f;
    std::vector<float> out(f_.clients);
    Figure("push 1x1", f_.iters,
           [&](int c, int) -> Waiter {
             auto t =
                 std::make_shared<Ticket>(C(c).PushSparse("sparse1", &key, 1, &one, {}, nullptr));
             return [t] { (void)t->Wait(); };
           },
           {{"header-40-bytes-header-40-bytes-header-4", 40}, {&key, 8}, {&one, 4}});
    Figure("pull 1x1", f_.iters,
           [&](int c, int) -> Waiter {
             auto t =
                 std::make_shared<Ticket>(C(c).PullSparse("sparse1", &key, 1, &out[c], nullptr));
             return [t] { (void)t->Wait(); };
           },
           {{"header-40-bytes-header-40-bytes-header-4", 40}, {&key, 8}});
  }

  void SparseCase(size_t nkeys, uint32_t dim, int iters) {
    const std::string table = "sparse" + std::to_string(dim);
    const std::string shape = std::to_string(nkeys) + "x" + std::to_string(dim);
    // Disjoint keys per caller; the "same keys" figure has every caller on caller 0's.
    std::vector<std::vector<uint64_t>> keys(f_.clients, std::vector<uint64_t>(nkeys));
    for (int c = 0; c < f_.clients; ++c) {
      for (size_t i = 0; i < nkeys; ++i) keys[c][i] = (c * nkeys + i) * 0x9e3779b97f4a7c15ULL + 1;
    }
    const std::vector<float> vals(nkeys * dim, 0.001f);
    // One output buffer per call in flight (a pull writes it until it completes).
    std::vector<std::vector<float>> out(f_.clients * f_.inflight, std::vector<float>(nkeys * dim));
    const std::string header(64, 'h');
    // The zero-copy overload: the frames are shared with the client, as a worker's are.
    std::vector<Frame> key_frames;
    for (const auto& k : keys) key_frames.push_back(Frame::FromVector(k));
    const Frame val_frame = Frame::FromVector(vals);
    auto push = [&](bool same) {
      return [&, same](int c, int) -> Waiter {
        auto t = std::make_shared<Ticket>(
            C(c).PushSparse(table, key_frames[same ? 0 : c], val_frame, {}, nullptr));
        return [t] { (void)t->Wait(); };
      };
    };
    const Stats one =
        Figure("sparse push " + shape, iters, push(false),
               {{header.data(), 64}, {keys[0].data(), nkeys * 8}, {vals.data(), vals.size() * 4}},
               "M keys/s", nkeys / 1e6);
    Figure(
        "sparse pull " + shape, iters,
        [&](int c, int i) -> Waiter {
          auto t = std::make_shared<Ticket>(
              C(c).PullSparse(table, keys[c].data(), nkeys,
                              out[c * f_.inflight + i % f_.inflight].data(), nullptr));
          return [t] { (void)t->Wait(); };
        },
        {{header.data(), 64}, {keys[0].data(), nkeys * 8}, {vals.data(), vals.size() * 4}},
        "M keys/s", nkeys / 1e6);
    if (f_.clients > 1) {
      const Stats same =
          Figure("sparse push " + shape + " same keys", iters, push(true),
                 {{header.data(), 64}, {keys[0].data(), nkeys * 8}, {vals.data(), vals.size() * 4}},
                 "M keys/s", nkeys / 1e6);
      if (same.per_s > 0 && one.per_s > 0) {
        std::printf("  %d callers on the same keys: %.2f of disjoint keys' calls/s\n", f_.clients,
                    same.per_s / one.per_s);
      }
    }
  }

  void DenseCase(uint64_t elems, int iters) {
    std::vector<float> g(elems, 0.0001f);
    std::vector<std::vector<float>> out(f_.clients * f_.inflight, std::vector<float>(elems));
    const Frame gf = Frame::FromVector(g);  // the zero-copy overload: shared, not copied
    const std::string name = std::to_string(elems * 4 >> 20) + "MiB";
    Figure(
        "dense push " + name, iters,
        [&](int c, int) -> Waiter {
          auto t = std::make_shared<Ticket>(C(c).PushDense("dense", gf, {}, nullptr));
          return [t] { (void)t->Wait(); };
        },
        {{"h", 64}, {g.data(), elems * 4}}, "GB/s", elems * 4 / 1e9);
    // The raw baseline of a pull moves the same bytes the other way round.
    Figure(
        "dense pull " + name, iters,
        [&](int c, int i) -> Waiter {
          auto t = std::make_shared<Ticket>(
              C(c).PullDense("dense", out[c * f_.inflight + i % f_.inflight].data(), nullptr));
          return [t] { (void)t->Wait(); };
        },
        {{"h", 64}, {g.data(), elems * 4}}, "GB/s", elems * 4 / 1e9);
  }

  // The shard's apply cost per row (--mem) beside the memory-bandwidth bound of the same
  // work: a plain loop reading each gradient row and reading and writing a weight row.
  void ApplyCost(size_t nkeys, uint32_t dim);

  const Flags f_;
  std::vector<std::unique_ptr<PsClient>> clients_;
  RawEcho raw_;
  std::vector<std::unique_ptr<RawEcho::Caller>> raw_callers_;
  std::FILE* csv_ = nullptr;
  int ran_ = 0;
};

void Bench::ApplyCost(size_t nkeys, uint32_t dim) {
  std::vector<uint64_t> keys(nkeys);
  for (size_t i = 0; i < nkeys; ++i) keys[i] = i * 0x9e3779b97f4a7c15ULL + 1;
  const std::vector<float> g(nkeys * dim, 0.001f);
  const Frame key_frame = Frame::FromVector(keys), g_frame = Frame::FromVector(g);
  std::vector<double> ps_ns, loop_ns;
  // Rows of key + floats in a random order, as a table holds them.
  std::vector<float> w(nkeys * (dim + 2), 0.5f);
  std::vector<uint32_t> order(nkeys);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(1));
  for (int rep = 0; rep < 60; ++rep) {
    auto t0 = Clock::now();
    (void)C(0).PushSparse("sparse64", key_frame, g_frame, {}, nullptr).Wait();
    ps_ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / nkeys);
    t0 = Clock::now();
    for (size_t i = 0; i < nkeys; ++i) {
      float* __restrict row = w.data() + size_t{order[i]} * (dim + 2) + 2;
      const float* __restrict gr = g.data() + i * dim;
      for (uint32_t j = 0; j < dim; ++j) row[j] -= 0.01f * gr[j];
    }
    loop_ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / nkeys);
  }
  std::sort(ps_ns.begin(), ps_ns.end());
  std::sort(loop_ns.begin(), loop_ns.end());
  std::printf(
      "sparse push %zux%u SGD, whole call: %.1f ns per row; the same bytes read and written by a "
      "plain loop: %.1f ns per row (%.2fx)\n",
      nkeys, dim, ps_ns[ps_ns.size() / 2], loop_ns[loop_ns.size() / 2],
      ps_ns[ps_ns.size() / 2] / loop_ns[loop_ns.size() / 2]);
}

// p50 of fn's duration in microseconds, after a warm-up.
double MeasureP50(int iters, const std::function<void()>& fn) {
  for (int i = 0; i < std::max(3, iters / 10); ++i) fn();
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void ApplyRates(int reps) {
  const size_t n = 1 << 20;
  std::vector<float> w(n, 0.5f), g(n, 0.01f), bak(n, 0.4f), s1(n, 0.0f), s2(n, 0.0f);
  std::vector<float> scratch;
  auto rate = [&](const char* name, const char* opt, const char* pol, bool with_bak) {
    TableSpec spec;
    spec.name = "apply";
    spec.shape = {n};
    spec.optimizer = opt;
    spec.staleness = pol;
    auto rules = RuleSet::Create(spec);
    float* slots[2] = {s1.data(), s2.data()};
    float* pslots[1] = {s2.data()};
    auto run = [&] {
      rules->Apply(w.data(), slots, pslots, g.data(), with_bak ? bak.data() : nullptr, n, 1.0f, 1,
                   &scratch);
    };
    const double st = MeasureP50(reps, run);
    std::printf("apply %-28s %8.3f G elements/s (one core)\n", name, n / st / 1e3);
    return n / st / 1e3;
  };
  // Baseline: a bare w -= lr*g loop in the same run.
  const double base = MeasureP50(reps, [&] {
    float* __restrict pw = w.data();
    const float* __restrict pg = g.data();
    for (size_t i = 0; i < n; ++i) pw[i] -= 0.01f * pg[i];
  });
  std::printf("apply %-28s %8.3f G elements/s (baseline loop)\n", "bare w -= lr*g", n / base / 1e3);
  rate("sgd", "sgd", "none", false);
  rate("adagrad", "adagrad", "none", false);
  rate("sgd + dc_constant (DC-ASGD)", "sgd", "dc_constant", true);
  rate("sgd + dc_adaptive (DC-ASGD-a)", "sgd", "dc_adaptive", true);
}

int Main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  std::unique_ptr<ShardServer> server;
  std::vector<std::unique_ptr<onlineps::testing::Subprocess>> procs;
  std::vector<std::string> endpoints;
  if (f.shards == 1) {
    ShardServerOptions so;
    so.listen = f.mem ? "mem://ps_bench" : "tcp://127.0.0.1:0";
    server = std::make_unique<ShardServer>(so, std::make_shared<prometheus::Registry>());
    auto ep = server->Start();
    if (!ep.ok()) {
      std::fprintf(stderr, "ps_bench: %s\n", ep.status().ToString().c_str());
      return 1;
    }
    endpoints.push_back(*ep);
  } else {
    for (int s = 0; s < f.shards; ++s) {
      procs.push_back(std::make_unique<onlineps::testing::Subprocess>(std::vector<std::string>{
          f.bin_dir + "/onlineps_ps", "--shard-index", std::to_string(s), "--num-shards",
          std::to_string(f.shards), "--listen", "tcp://127.0.0.1:0", "--admin-port", "-1",
          "--log-level", "warn"}));
      endpoints.push_back(procs.back()->WaitForLine("LISTENING ", std::chrono::seconds(60)));
      if (endpoints.back().empty()) {
        std::fprintf(stderr, "ps_bench: %s/onlineps_ps (shard %d) did not start\n",
                     f.bin_dir.c_str(), s);
        return 1;
      }
    }
  }
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int c = 0; c < f.clients; ++c) {
    PsClientOptions co;
    co.shards = endpoints;
    if (f.pull_part_bytes >= 0) co.pull_part_bytes = static_cast<size_t>(f.pull_part_bytes);
    auto client = PsClient::Connect(co);
    if (!client.ok()) {
      std::fprintf(stderr, "ps_bench: %s\n", client.status().ToString().c_str());
      return 1;
    }
    clients.push_back(std::move(client).value());
  }
  for (uint32_t dim : {1u, 16u, 64u}) {
    TableSpec s;
    s.name = "sparse" + std::to_string(dim);
    s.kind = TableKind::kSparse;
    s.dim = dim;
    if (Status st = clients[0]->CreateTable(s); !st.ok()) {
      std::fprintf(stderr, "ps_bench: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  TableSpec d;
  d.name = "dense";
  d.shape = {1 << 20};
  (void)clients[0]->CreateTable(d);
  for (auto& c : clients) (void)c->OpenTable("dense");
  int ran = 0;
  {
    Bench bench(f, std::move(clients));
    ran = bench.Run();
  }
  if (f.clients == 1 && f.inflight == 1 && f.Wants("apply rates")) {
    ApplyRates(std::max(10, f.iters / 50));
    ++ran;
  }
  if (server) server->Stop();
  if (ran == 0) {
    std::fprintf(stderr, "ps_bench: --only '%s' matches no figure of this run\n", f.only.c_str());
    return 2;
  }
  return 0;
}

}  // namespace
}  // namespace onlineps::ps

int main(int argc, char** argv) { return onlineps::ps::Main(argc, argv); }
