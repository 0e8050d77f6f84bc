// onlineps_replica_sim: runs the deterministic replication simulation (tests/ps/replica_sim.h)
// over many seeds (the long mode: --seeds 100000) or replays one (--seed N --verbose).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "tests/ps/replica_sim.h"

int main(int argc, char** argv) {
  CLI::App app("onlineps replication simulation");
  uint64_t first = 1, seeds = 1000, seed = 0;
  onlineps::sim::SimOptions o;
  bool async = false;
  app.add_option("--first", first, "First seed")->capture_default_str();
  app.add_option("--seeds", seeds, "Number of seeds to run")->capture_default_str();
  app.add_option("--seed", seed, "Run this one seed only (with --verbose: every event)");
  app.add_option("--replicas", o.replicas, "Replicas per group (0: 2 or 3 from the seed)")
      ->capture_default_str();
  app.add_option("--fault-ms", o.fault_ms, "Simulated time with faults")->capture_default_str();
  app.add_option("--settle-ms", o.settle_ms, "Simulated time after healing")->capture_default_str();
  app.add_flag("--unsafe-kills", o.unsafe_kills,
               "Kill regardless of the ISR (checks liveness and convergence only)");
  app.add_flag("--async", async, "Asynchronous replication (checks liveness and convergence)");
  app.add_flag("--verbose", o.verbose, "Log every fault and protocol event to stderr");
  CLI11_PARSE(app, argc, argv);
  o.sync = !async;
  if (async) o.unsafe_kills = true;  // async promises no acknowledged push
  if (seed != 0) {
    first = seed;
    seeds = 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t failed = 0, acked = 0, kills = 0, lost = 0;
  for (uint64_t s = first; s < first + seeds; ++s) {
    o.seed = s;
    auto r = onlineps::sim::RunSim(o);
    acked += r.acked;
    kills += r.kills;
    lost += r.lost;
    if (!r.ok || seeds == 1)
      std::printf("seed %llu: %s\n", (unsigned long long)s, r.Summary().c_str());
    if (!r.ok) ++failed;
    if ((s - first + 1) % 1000 == 0) {
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%llu/%llu seeds, %llu failed, %.0f s elapsed, ETA %.0f s\n",
                  (unsigned long long)(s - first + 1), (unsigned long long)seeds,
                  (unsigned long long)failed, el, el / (s - first + 1) * (seeds - (s - first + 1)));
      std::fflush(stdout);
    }
  }
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "%llu seeds from %llu: %llu failed; %llu pushes acknowledged, %llu kills, %llu "
      "acknowledged pushes lost; %.1f s\n",
      (unsigned long long)seeds, (unsigned long long)first, (unsigned long long)failed,
      (unsigned long long)acked, (unsigned long long)kills, (unsigned long long)lost, el);
  return failed == 0 ? 0 : 1;
}
