// freshness_bench: how long after a learn on one worker another worker's infer reads
// the parameters it changed, with the shards' change notices (the default) beside the
// age-bound mode (--no-notices) in the same run, and what an idle cluster costs in each.
// Real processes on loopback: 2 PS shards and N workers (onlineps_ps, onlineps_worker).
//
// A trial: worker B infers the trial's input (so it holds what that input reads); worker
// A learns it; from the moment A's learn is acknowledged, B infers the input again and
// again until the versions its answer read are at least the versions A's push made
// (per table and shard, from the learn reply). The time to that answer is the trial's
// visibility delay. A and B rotate over the workers; trials are spaced by a random gap
// so the age mode's refresh timers are met at every phase.
//   freshness_bench [--trials N] [--workers 2,4] [--models mlp,text] [--modes notices,age]
//                   [--idle-s S] [--bin-dir DIR]
// Not a test.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/subprocess.h"
#include "worker/worker_client.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using onlineps::Op;
using onlineps::testing::CpuSeconds;
using onlineps::testing::Subprocess;

struct Flags {
  int trials = 200;
  std::vector<int> workers = {2, 4};
  std::vector<std::string> models = {"mlp", "text"};
  std::vector<std::string> modes = {"notices", "age"};
  double idle_s = 3.0;
  std::string bin_dir = ONLINEPS_BIN_DIR;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Prints the usage and exits: 0 to stdout for --help (empty problem), else 2 to stderr.
[[noreturn]] void Usage(const std::string& problem) {
  std::fprintf(
      problem.empty() ? stdout : stderr,
      "%s%s"
      "usage: freshness_bench [--trials N] [--workers 2,4] [--models mlp,text]\n"
      "                       [--modes notices,age] [--idle-s S] [--bin-dir DIR]\n"
      "  --trials   learn -> infer trials per configuration (default 200)\n"
      "  --workers  worker counts to run (default 2,4); always 2 shards\n"
      "  --models   mlp (dense tables) and/or text (sparse embedding rows)\n"
      "  --modes    notices (default flags) and/or age (--no-notices)\n"
      "  --idle-s   seconds of an idle cluster whose CPU is measured (default 3)\n"
      "  --bin-dir  where onlineps_ps and onlineps_worker are\n",
      problem.empty() ? "" : "freshness_bench: ", problem.empty() ? "" : (problem + "\n").c_str());
  std::exit(problem.empty() ? 0 : 2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") Usage("");
    static const char* const kKnown[] = {"--trials", "--workers", "--models",
                                         "--modes",  "--idle-s",  "--bin-dir"};
    if (std::find(std::begin(kKnown), std::end(kKnown), a) == std::end(kKnown)) {
      Usage("unknown flag " + a);
    }
    if (i + 1 >= argc) Usage("missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--trials") {
      f.trials = std::atoi(v.c_str());
      if (f.trials < 1) Usage("--trials must be at least 1");
    } else if (a == "--workers") {
      f.workers.clear();
      for (const auto& w : Split(v)) {
        const int n = std::atoi(w.c_str());
        if (n < 2 || n > 16) Usage("--workers takes counts from 2 to 16");
        f.workers.push_back(n);
      }
    } else if (a == "--models") {
      f.models = Split(v);
      for (const auto& m : f.models) {
        if (m != "mlp" && m != "text") Usage("unknown model '" + m + "' (mlp, text)");
      }
    } else if (a == "--modes") {
      f.modes = Split(v);
      for (const auto& m : f.modes) {
        if (m != "notices" && m != "age") Usage("unknown mode '" + m + "' (notices, age)");
      }
    } else if (a == "--idle-s") {
      f.idle_s = std::atof(v.c_str());
      if (f.idle_s <= 0) Usage("--idle-s must be positive");
    } else if (a == "--bin-dir") {
      f.bin_dir = v;
    } else {
      Usage("unknown argument '" + a + "'");
    }
  }
  return f;
}

struct Result {
  std::vector<double> ms;  // visibility delay per trial that saw the learn
  int timeouts = 0;
  int errors = 0;
  std::string first_error;
  double idle_cores = 0;
  double Quantile(double q) const {
    if (ms.empty()) return 0;
    std::vector<double> v = ms;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
  }
};

// Whether the versions an infer read cover those a learn's pushes made.
bool Covers(const json& read, const json& pushed) {
  if (!read.is_object() || !pushed.is_object()) return false;
  for (const auto& [table, shards] : pushed.items()) {
    auto it = read.find(table);
    if (it == read.end() || !it->is_array() || !shards.is_array()) return false;
    for (size_t s = 0; s < shards.size(); ++s) {
      const uint64_t want = shards[s].get<uint64_t>();
      if (want == 0) continue;  // the push touched no row there
      if (s >= it->size() || (*it)[s].get<uint64_t>() < want) return false;
    }
  }
  return true;
}

json Example(const std::string& model, int trial, std::mt19937* rng) {
  if (model == "text") {
    // Words of their own per trial, plus common ones: rows a worker holds and rows it
    // has not seen before this trial's first infer.
    return {{"text", "trial" + std::to_string(trial) + " signal word" + std::to_string(trial % 50) +
                         " good movie"},
            {"label", trial % 2 == 0 ? "positive" : "negative"}};
  }
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(64);
  for (float& v : x) v = d(*rng);
  return {{"features", x}, {"label", std::to_string(trial % 10)}};
}

Result RunOne(const Flags& flags, const std::string& model, int workers, const std::string& mode) {
  const std::string& b = flags.bin_dir;
  std::vector<std::unique_ptr<Subprocess>> procs;
  std::vector<std::string> shard_eps;
  for (int s = 0; s < 2; ++s) {
    procs.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        b + "/onlineps_ps", "--shard-index", std::to_string(s), "--num-shards", "2", "--listen",
        "tcp://127.0.0.1:0", "--admin-port", "-1", "--log-level", "warn"}));
    shard_eps.push_back(procs.back()->WaitForLine("LISTENING ", std::chrono::seconds(30)));
    if (shard_eps.back().empty()) {
      std::fprintf(stderr, "shard %d did not start\n", s);
      std::exit(1);
    }
  }
  const std::string ps = shard_eps[0] + "," + shard_eps[1];
  std::vector<std::string> worker_eps;
  std::vector<std::unique_ptr<onlineps::worker::WorkerClient>> clients;
  for (int w = 0; w < workers; ++w) {
    std::vector<std::string> argv =
        onlineps::testing::WorkerArgv(b, ps, {"--model", model, "--lr", "0.05"});
    if (model == "mlp") {
      for (const char* a :
           {"--input-dim", "64", "--hidden", "32", "--labels", "0,1,2,3,4,5,6,7,8,9"}) {
        argv.push_back(a);
      }
    } else {
      for (const char* a : {"--labels", "negative,positive"}) argv.push_back(a);
    }
    if (mode == "age") argv.push_back("--no-notices");
    procs.push_back(std::make_unique<Subprocess>(argv));
    worker_eps.push_back(procs.back()->WaitForLine("LISTENING ", std::chrono::seconds(120)));
    if (worker_eps.back().empty()) {
      std::fprintf(stderr, "worker %d did not start\n", w);
      std::exit(1);
    }
    onlineps::worker::WorkerClientOptions o;
    o.endpoint = worker_eps.back();
    o.timeout = std::chrono::milliseconds(10000);
    auto c = onlineps::worker::WorkerClient::Connect(o);
    if (!c.ok()) {
      std::fprintf(stderr, "connect to worker %d: %s\n", w, c.status().ToString().c_str());
      std::exit(1);
    }
    clients.push_back(std::move(c).value());
  }
  Result r;
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> gap_ms(0, 50);
  for (int t = 0; t < flags.trials; ++t) {
    const int a = t % workers, bw = (t + 1) % workers;
    const json ex = Example(model, t, &rng);
    json infer = {{"examples", json::array({ex})}};
    infer["examples"][0].erase("label");
    auto first = clients[bw]->Call(Op::kInfer, infer);
    auto learned = clients[a]->Call(Op::kLearn, {{"examples", json::array({ex})}});
    const auto acked = Clock::now();
    if (!first.ok() || !learned.ok()) {
      if (r.errors++ == 0) {
        r.first_error = (!first.ok() ? first.status() : learned.status()).ToString();
      }
      continue;
    }
    const json pushed = (*learned)["versions"];
    bool seen = false;
    while (Clock::now() - acked < std::chrono::seconds(3)) {
      auto again = clients[bw]->Call(Op::kInfer, infer);
      if (!again.ok()) {
        if (r.errors++ == 0) r.first_error = again.status().ToString();
        break;
      }
      if (Covers((*again)["versions"], pushed)) {
        r.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - acked).count());
        seen = true;
        break;
      }
    }
    if (!seen) ++r.timeouts;
    std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms(rng)));
  }
  // An idle cluster: nothing called for a second, then CPU over idle_s.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  double cpu0 = 0, cpu1 = 0;
  for (auto& p : procs) cpu0 += CpuSeconds(p->pid());
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(flags.idle_s));
  for (auto& p : procs) cpu1 += CpuSeconds(p->pid());
  r.idle_cores = (cpu1 - cpu0) / std::chrono::duration<double>(Clock::now() - t0).count();
  clients.clear();
  for (auto& p : procs) p->Stop(SIGTERM, std::chrono::seconds(10));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  std::printf(
      "freshness_bench: learn on worker A acknowledged -> infer on worker B reads it; 2 shards, "
      "%d trials per line, %u cores\n",
      flags.trials, std::thread::hardware_concurrency());
  std::printf("%-5s %-8s %-8s %9s %9s %9s %9s %8s %11s\n", "model", "workers", "mode", "p50 ms",
              "p90 ms", "p99 ms", "max ms", "timeouts", "idle cores");
  for (const std::string& model : flags.models) {
    for (int workers : flags.workers) {
      std::vector<double> p99;
      for (const std::string& mode : flags.modes) {
        const Result r = RunOne(flags, model, workers, mode);
        std::printf("%-5s %-8d %-8s %9.2f %9.2f %9.2f %9.2f %8d %11.3f\n", model.c_str(), workers,
                    mode.c_str(), r.Quantile(0.5), r.Quantile(0.9), r.Quantile(0.99),
                    r.Quantile(1.0), r.timeouts, r.idle_cores);
        if (r.errors > 0) {
          std::printf("      %d error(s), first: %s\n", r.errors, r.first_error.c_str());
        }
        std::fflush(stdout);
        p99.push_back(r.Quantile(0.99));
      }
      if (p99.size() == 2 && p99[0] > 0) {
        std::printf("%-5s %-8d p99 %s / %s = %.3f\n", model.c_str(), workers,
                    flags.modes[0].c_str(), flags.modes[1].c_str(), p99[0] / p99[1]);
      }
    }
  }
  return 0;
}
