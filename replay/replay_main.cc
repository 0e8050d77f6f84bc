// onlineps_replay: staleness experiments and trace replay (docs/replay.md). A workload
// (a dataset with a worker/delay model, or a recorded trace) is turned into pull/push
// events and run against an in-process or running PS cluster; results go to --out.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>
#include <thread>

#include "common/config.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "replay/batches.h"
#include "replay/bridge_replay.h"
#include "replay/models.h"
#include "replay/replay_flags.h"
#include "replay/report.h"
#include "replay/trace_steps.h"
#include "worker/model.h"

#ifndef ONLINEPS_GIT_COMMIT
#define ONLINEPS_GIT_COMMIT ""
#endif

namespace onlineps::replay {
namespace {

using Clock = std::chrono::steady_clock;

// "\r" progress on a terminal only: a log file gets the summary, not 1,000 lines.
class ProgressLine {
 public:
  explicit ProgressLine(bool quiet) : on_(!quiet && ::isatty(2)), start_(Clock::now()) {}
  void operator()(uint64_t done, uint64_t total) {
    if (!on_) return;
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    const double rate = s > 0 ? static_cast<double>(done) / s : 0;
    const double eta = rate > 0 && total > done ? static_cast<double>(total - done) / rate : 0;
    std::fprintf(stderr, "\rreplay: %llu/%llu updates  %.0f/s  ETA %d:%02d   ",
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total),
                 rate, static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    if (done >= total) std::fprintf(stderr, "\n");
  }

 private:
  bool on_;
  Clock::time_point start_;
};

// Set by SIGINT / SIGTERM: the run ends after the event in progress.
std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

void OnSignal(int sig) {
  g_signal = sig;
  g_stop = true;
}

// An interrupted run says so: in the manifest ("interrupted": the signal, null for a run
// that ended by itself, with what was planned) and in the exit code (128 + the signal,
// as a shell reports it), so a script cannot take its figures for a whole run's.
void MarkInterruption(nlohmann::json* manifest, const nlohmann::json& planned) {
  const int sig = g_signal.load();
  (*manifest)["interrupted"] =
      sig == 0
          ? nlohmann::json(nullptr)
          : nlohmann::json{{"signal", sig == SIGINT ? "SIGINT" : "SIGTERM"}, {"planned", planned}};
}
int ExitCodeOf(int code) {
  const int sig = g_signal.load();
  if (sig == 0) return code;
  std::fprintf(stderr, "replay: interrupted by %s: the figures cover the part replayed\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  return 128 + sig;
}

// Sleeps so events keep their recorded gaps, scaled by 1/speed and capped at max_gap_ms.
class Pacer {
 public:
  Pacer(double speed, double max_gap_ms) : speed_(speed), max_gap_ms_(max_gap_ms) {}
  // Sleeps until event time t_ms is due, in steps of at most 100 ms so that `stop`
  // (Ctrl-C) ends the wait at once.
  void Wait(double t_ms, const std::atomic<bool>* stop) {
    if (!started_) {
      started_ = true;
      start_ = Clock::now();
      last_t_ = t_ms;
    }
    double gap = std::max(0.0, t_ms - last_t_);
    if (max_gap_ms_ > 0) gap = std::min(gap, max_gap_ms_);
    last_t_ = std::max(last_t_, t_ms);
    elapsed_ms_ += gap / speed_;
    const auto until = PacedAt(start_, elapsed_ms_);
    for (auto now = Clock::now(); now < until && !stop->load(); now = Clock::now()) {
      std::this_thread::sleep_for(
          std::min<Clock::duration>(until - now, std::chrono::milliseconds(100)));
    }
  }

 private:
  double speed_, max_gap_ms_;
  bool started_ = false;
  Clock::time_point start_;
  double last_t_ = 0, elapsed_ms_ = 0;
};

nlohmann::json ParamsJson(const worker::Model& m) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : m.params()) {
    out.push_back({{"table", p.name},
                   {"kind", p.kind == worker::ParamKind::kDense ? "dense" : "sparse"},
                   {"shape", p.shape}});
  }
  return out;
}

// The manifest's model: kind and PS tables; for a model file also its path, SHA-256 and
// size, the frozen parameters, the frozen part's base hash and whether it is unchanged
// after the run (the replay must never write to a frozen backbone).
StatusOr<nlohmann::json> ModelJson(const Flags& f, const worker::Model& m) {
  nlohmann::json out = {{"kind", f.model}, {"params", ParamsJson(m)}};
  if (!f.model_file.empty()) {
    ONLINEPS_ASSIGN_OR_RETURN(std::string sha, FileSha256(f.model_file));
    std::error_code ec;
    out["file"] = {{"path", f.model_file},
                   {"sha256", sha},
                   {"bytes", std::filesystem::file_size(f.model_file, ec)}};
  }
  if (!m.frozen().empty()) {
    nlohmann::json frozen = nlohmann::json::array();
    for (const auto& p : m.frozen()) frozen.push_back({{"name", p.name}, {"shape", p.shape}});
    out["frozen"] = frozen;
    ONLINEPS_ASSIGN_OR_RETURN(std::string now, m.BaseNow());
    out["base"] = m.base();
    out["frozen_intact"] = now == m.base();
  }
  return out;
}

void PrintHistogram(const StalenessStats& s) {
  std::printf("staleness over %llu pushes: mean %.3f p50 %llu p90 %llu p99 %llu max %llu\n",
              static_cast<unsigned long long>(s.count()), s.Mean(),
              static_cast<unsigned long long>(s.Quantile(0.5)),
              static_cast<unsigned long long>(s.Quantile(0.9)),
              static_cast<unsigned long long>(s.Quantile(0.99)),
              static_cast<unsigned long long>(s.Max()));
  const auto& h = s.histogram();
  for (size_t t = 0; t < h.size() && t < 64; ++t) {
    if (!h[t]) continue;
    const double f = static_cast<double>(h[t]) / static_cast<double>(s.count());
    std::printf("  tau %3zu  %10llu  %6.2f%%  %s\n", t, static_cast<unsigned long long>(h[t]),
                100 * f, std::string(static_cast<size_t>(f * 50 + 0.5), '#').c_str());
  }
  if (h.size() > 64) std::printf("  (tau above 63 not shown)\n");
}

// The event stream and what describes it in the manifest.
struct Workload {
  std::unique_ptr<BatchSource> batches;
  std::unique_ptr<Scheduler> scheduler;  // dataset workloads
  std::vector<Event> events;             // trace workloads
  size_t next_event = 0;
  uint64_t expected_pushes = 0;
  nlohmann::json describe;
  bool Next(Event* e) {
    if (scheduler) return scheduler->Next(e);
    if (next_event >= events.size()) return false;
    *e = events[next_event++];
    return true;
  }
};

StatusOr<Workload> DatasetWorkload(const Flags& f, const Dataset& data) {
  Workload w;
  auto batches =
      std::make_unique<DatasetBatches>(&data, f.batch, f.seed, !f.no_shuffle, f.eval_rows);
  ONLINEPS_ASSIGN_OR_RETURN(ScheduleOptions so, ScheduleOptionsOf(f));
  if (so.updates == 0) so.updates = batches->BatchesPerEpoch() * std::max<uint32_t>(f.epochs, 1);
  w.expected_pushes = so.updates;
  ONLINEPS_ASSIGN_OR_RETURN(w.scheduler, Scheduler::Create(so));
  w.batches = std::move(batches);
  w.describe = {{"dataset", data.Describe()}, {"updates", so.updates}};
  return w;
}

StatusOr<Workload> TraceWorkload(const Flags& f, const TraceSteps& steps) {
  Workload w;
  std::optional<Delay> override;
  if (!f.staleness.empty()) {
    ONLINEPS_ASSIGN_OR_RETURN(Delay d, Delay::Parse(f.staleness));
    override = d;
  }
  if (steps.steps.empty()) return FailedPrecondition(f.trace + " has no successful learn");
  // A trace's events are built in memory, about 150 bytes a learn step and loop.
  constexpr uint64_t kMaxTraceSteps = 10'000'000;
  const uint64_t total = steps.steps.size() * uint64_t{std::max<uint32_t>(f.loop, 1)};
  if (total > kMaxTraceSteps) {
    return InvalidArgument("--loop " + std::to_string(f.loop) + " x " +
                           std::to_string(steps.steps.size()) + " learn steps of " + f.trace +
                           " = " + std::to_string(total) + " steps; one run replays at most " +
                           std::to_string(kMaxTraceSteps) +
                           " (its events are held in memory): lower --loop");
  }
  w.events = TraceEvents(steps, override, f.seed, f.loop);
  w.expected_pushes = steps.steps.size() * std::max<uint32_t>(f.loop, 1);
  w.batches = std::make_unique<TraceBatches>(&steps, std::vector<worker::Example>{});
  w.describe = {{"trace", f.trace},
                {"run_id", steps.header.run_id},
                {"source", steps.header.source},
                {"records", steps.records},
                {"learn_steps", steps.steps.size()},
                {"skipped_records", steps.skipped},
                {"truncated_tail", steps.truncated_tail},
                {"workers", steps.workers},
                {"staleness", override ? override->ToString() : "as recorded"}};
  return w;
}

// --dry-run: the staleness the PS would measure, and how long the run would take.
int DryRun(const Flags& f, Workload* w, double recorded_ms) {
  StalenessStats s;
  double last_ms = 0;
  Event e;
  while (w->Next(&e)) {
    if (e.kind == EventKind::kPush) s.Add(e.expected_tau);
    last_ms = std::max(last_ms, e.t_ms);
  }
  PrintHistogram(s);
  const double ms = std::max(recorded_ms * std::max<uint32_t>(f.loop, 1), last_ms);
  std::printf("virtual duration %.1f s; timed replay at --speed %g would take %.1f s\n", ms / 1000,
              f.speed, ms / 1000 / f.speed);
  return 0;
}

int Fail(const Status& st) {
  std::fprintf(stderr, "onlineps_replay: %s\n", st.ToString().c_str());
  return 1;
}

void PrintLatencyRow(const std::string& name, const ToolStats& t) {
  std::printf("  %-16s %7llu %7llu %7llu %7llu %9.1f %9.1f %9.1f", name.c_str(),
              static_cast<unsigned long long>(t.calls), static_cast<unsigned long long>(t.ok),
              static_cast<unsigned long long>(t.tool_errors + t.failures),
              static_cast<unsigned long long>(t.new_errors), t.latency.Quantile(0.5) / 1000,
              t.latency.Quantile(0.99) / 1000, t.latency.Max() / 1000);
  if (t.recorded_latency.count()) {
    std::printf("   (recorded p50 %.1f p99 %.1f)", t.recorded_latency.Quantile(0.5) / 1000,
                t.recorded_latency.Quantile(0.99) / 1000);
  }
  std::printf("\n");
}

// --bridge: the trace's tool calls, paced, against a running MCP bridge.
int BridgeMain(const Flags& f, const CLI::App& app, int argc, char** argv) {
  auto calls = LoadBridgeCalls(f.trace, f.limit);
  if (!calls.ok()) return Fail(calls.status());
  if (calls->truncated_tail) spdlog::warn("{}: the last line is cut off; it was skipped", f.trace);
  if (calls->skipped_by_ref) {
    spdlog::warn("{}: {} learn/infer records give their payload by reference; not sent", f.trace,
                 calls->skipped_by_ref);
  }
  const double paced_ms = PacedDurationMs(*calls, f.speed, f.max_gap_ms, f.loop);
  std::map<std::string, uint64_t> per_tool;
  for (const auto& c : calls->calls) ++per_tool[c.tool];
  if (f.dry_run || calls->calls.empty()) {
    std::printf("%zu tool calls in %llu sessions over %.1f s recorded:", calls->calls.size(),
                static_cast<unsigned long long>(calls->sessions), calls->span_ms / 1000);
    for (const auto& [tool, n] : per_tool) {
      std::printf(" %s %llu", tool.c_str(), static_cast<unsigned long long>(n));
    }
    std::printf("\nat --speed %g --max-gap-ms %g (0: no cap), %u loop(s) would take %.1f s\n",
                f.speed, f.max_gap_ms, f.loop, paced_ms / 1000);
    if (calls->calls.empty()) return Fail(FailedPrecondition(f.trace + " holds no tool calls"));
    return 0;
  }
  auto token = BridgeToken(f);
  if (!token.ok()) return Fail(token.status());
  BridgeReplayOptions o;
  o.url = f.bridge;
  o.token = *token;
  o.speed = f.speed;
  o.max_gap_ms = f.max_gap_ms;
  o.loop = f.loop;
  o.duration_s = f.duration_s;
  o.timeout_ms = f.call_timeout_ms;
  o.connections = f.connections;
  o.stop = &g_stop;
  o.csv_path = f.out + "/calls.csv";
  ProgressLine progress(f.quiet);
  o.progress = [&progress](uint64_t d, uint64_t t) { progress(d, t); };
  ::signal(SIGINT, OnSignal);
  ::signal(SIGTERM, OnSignal);
  spdlog::info("sending {} tool calls ({} sessions, {} loop(s)) to {}; pacing alone takes {:.1f} s",
               calls->calls.size() * f.loop, calls->sessions, f.loop, f.bridge, paced_ms / 1000);
  auto r = ReplayOnBridge(*calls, o);
  if (!r.ok()) return Fail(r.status());
  nlohmann::json manifest = {{"tool", "onlineps_replay"},
                             {"mode", "bridge"},
                             {"commit", ONLINEPS_GIT_COMMIT},
                             {"argv", std::vector<std::string>(argv, argv + argc)},
                             {"config", EffectiveConfig(app)},
                             {"workload",
                              {{"trace", f.trace},
                               {"run_id", calls->header.run_id},
                               {"source", calls->header.source},
                               {"records", calls->records},
                               {"calls", calls->calls.size()},
                               {"sessions", calls->sessions},
                               {"skipped_by_ref", calls->skipped_by_ref},
                               {"truncated_tail", calls->truncated_tail},
                               {"recorded_span_s", calls->span_ms / 1000}}},
                             {"libraries", LibraryVersions()},
                             {"result", r->ToJson()}};
  MarkInterruption(&manifest, {{"calls", calls->calls.size() * f.loop}});
  if (auto st = WriteJson(f.out + "/manifest.json", manifest); !st.ok()) return Fail(st);
  std::printf(
      "sent %llu calls in %.2f s (%.1f calls/s; pacing alone %.2f s)%s\n",
      static_cast<unsigned long long>(r->sent), r->wall_s,
      r->wall_s > 0 ? static_cast<double>(r->sent) / r->wall_s : 0.0, r->paced_s,
      r->not_sent ? (", " + std::to_string(r->not_sent) + " not sent (stopped)").c_str() : "");
  std::printf("  %-16s %7s %7s %7s %7s %9s %9s %9s\n", "tool", "calls", "ok", "errors", "new",
              "p50 ms", "p99 ms", "max ms");
  for (const auto& [tool, t] : r->tools) PrintLatencyRow(tool, t);
  PrintLatencyRow("all", r->all);
  if (r->tau.count() || r->recorded_tau.count()) {
    std::printf(
        "learn staleness: mean %.2f p99 %llu max %llu (recorded: mean %.2f p99 %llu max "
        "%llu)\n",
        r->tau.Mean(), static_cast<unsigned long long>(r->tau.Quantile(0.99)),
        static_cast<unsigned long long>(r->tau.Max()), r->recorded_tau.Mean(),
        static_cast<unsigned long long>(r->recorded_tau.Quantile(0.99)),
        static_cast<unsigned long long>(r->recorded_tau.Max()));
  }
  std::printf("schedule lag p99 %.1f ms; %llu MCP sessions opened, %llu re-initialized\n",
              r->lag.Quantile(0.99) / 1000, static_cast<unsigned long long>(r->sessions_opened),
              static_cast<unsigned long long>(r->reinitialized));
  for (const auto& e : r->first_errors) std::printf("  error: %s\n", e.c_str());
  std::printf("wrote %s/calls.csv and %s/manifest.json\n", f.out.c_str(), f.out.c_str());
  return ExitCodeOf(r->all.new_errors > 0 ? 3 : 0);
}

int Main(int argc, char** argv) {
  Flags f;
  LogOptions log;
  log.component = "replay";
  CLI::App app("onlineps_replay: staleness experiments and trace replay (docs/replay.md)");
  AddFlags(app, &f);
  AddLoggingFlags(app, &log);
  // Env names of its own, ONLINEPS_REPLAY_<FLAG>: a pod's ONLINEPS_PS (the live cluster)
  // or ONLINEPS_SHARDS (an endpoint list, not a count) must never steer an experiment.
  auto parsed = ParseFlags(app, argc, argv, std::cout, "ONLINEPS_REPLAY_");
  if (!parsed.ok()) {
    std::fprintf(stderr, "onlineps_replay: %s\n", parsed.status().message().c_str());
    return 2;
  }
  if (parsed->exit_now) return 0;
  if (auto st = InitLogging(log); !st.ok()) return Fail(st);
  if (auto st = CheckFlags(f); !st.ok()) {
    std::fprintf(stderr, "onlineps_replay: %s\n", st.message().c_str());
    return 2;
  }
  // Before any work: a run must not end in "cannot write" after minutes of replay.
  if (!f.dry_run) {
    std::error_code ec;
    std::filesystem::create_directories(f.out, ec);
    if (ec) return Fail(Unavailable("--out " + f.out + ": cannot create it: " + ec.message()));
  }

  if (!f.bridge.empty()) return BridgeMain(f, app, argc, argv);

  Dataset data;
  TraceSteps steps;
  StatusOr<Workload> workload = Internal("no workload");
  if (f.trace.empty()) {
    if (f.dataset != "none") {
      spdlog::info("loading dataset {}", f.dataset);
      auto d = LoadDataset(f.dataset, DatasetOptionsOf(f));
      if (!d.ok()) return Fail(d.status());
      data = std::move(*d);
    }
    workload = DatasetWorkload(f, data);
  } else {
    auto s = LoadTraceSteps(f.trace, f.labels, f.limit, f.learn_chunk);
    if (!s.ok()) return Fail(s.status());
    steps = std::move(*s);
    if (steps.truncated_tail) spdlog::warn("{}: the last line is cut off; it was skipped", f.trace);
    workload = TraceWorkload(f, steps);
  }
  if (!workload.ok()) return Fail(workload.status());
  if (f.dry_run) return DryRun(f, &*workload, f.trace.empty() ? 0 : steps.duration_ms);

  auto model = MakeModel(f, data, steps);
  if (!model.ok()) return Fail(model.status());
  if (auto st = CheckTraceTables(steps.header, **model); !st.ok()) return Fail(st);
  std::unique_ptr<TraceWriter> events;
  if (f.events) {
    TraceHeader h;
    h.run_id = NewRunId();
    h.source = "onlineps_replay";
    h.commit = ONLINEPS_GIT_COMMIT;
    h.model = {{"labels", (*model)->labels()}, {"tables", ParamsJson(**model)}};
    // docs/trace.md: a header's `dataset` is Dataset::Describe() (name, package, files,
    // split, ...), which the `ref`s of the records point into; a trace replay has no
    // dataset, and its refs point into the trace its description names.
    h.dataset =
        workload->describe.contains("dataset") ? workload->describe["dataset"] : workload->describe;
    h.seeds = {{"seed", f.seed}};
    auto w = TraceWriter::Create(f.out + "/events.jsonl", h, /*overwrite=*/true);
    if (!w.ok()) return Fail(w.status());
    events = std::move(*w);
  }
  ReplayOptions ro;
  if (auto st = ReplayOptionsOf(f, &ro); !st.ok()) return Fail(st);
  if (!f.ps.empty()) {
    // A running cluster remembers (sender, seq) pairs: a second replay with the same
    // sender ids would have every push dropped as a duplicate. Fresh random ids per run
    // (in process the shards are new each run, and fixed ids keep runs identical).
    std::random_device rd;
    ro.sender_base = ((uint64_t{rd()} << 32) | rd() | (uint64_t{1} << 62)) & ~uint64_t{0xffff};
  }
  ro.events = events.get();
  if (ro.eval_every == 0) ro.eval_every = std::max<uint64_t>(1, workload->expected_pushes / 20);
  ProgressLine progress(f.quiet);
  ro.progress = [&progress](uint64_t d, uint64_t t) { progress(d, t); };
  auto replayer = Replayer::Create(model->get(), workload->batches.get(), ClusterOptionsOf(f), ro);
  if (!replayer.ok()) return Fail(replayer.status());
  Pacer pacer(f.speed, f.max_gap_ms);
  // Ctrl-C or SIGTERM ends the run after the event in progress: the figures so far and
  // the manifest are written as for a run that ended.
  ::signal(SIGINT, OnSignal);
  ::signal(SIGTERM, OnSignal);
  // At most ten years: a larger --duration-s would overflow the clock (and means "none").
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                                           std::min(f.duration_s, 10 * 365 * 86400.0) * 1000));
  auto next = [&](Event* e) {
    if (!workload->Next(e)) return false;
    if (f.mode == "timed") pacer.Wait(e->t_ms, &g_stop);
    if (g_stop) return false;
    return f.duration_s <= 0 || Clock::now() < deadline;
  };
  spdlog::info("replaying {} updates on {} ({} mode)", workload->expected_pushes,
               f.ps.empty() ? std::to_string(f.shards) + " in-process shard(s)" : "the cluster",
               f.mode);
  auto result = (*replayer)->Run(next, workload->expected_pushes);
  if (!result.ok()) return Fail(result.status());
  if (events) static_cast<void>(events->Close());

  auto model_json = ModelJson(f, **model);
  if (!model_json.ok()) return Fail(model_json.status());
  nlohmann::json manifest = {{"tool", "onlineps_replay"},
                             {"commit", ONLINEPS_GIT_COMMIT},
                             {"argv", std::vector<std::string>(argv, argv + argc)},
                             {"config", EffectiveConfig(app)},
                             {"workload", workload->describe},
                             {"model", *model_json},
                             {"libraries", LibraryVersions()},
                             {"seeds", {{"seed", f.seed}, {"split_seed", f.split_seed}}},
                             {"result", ResultJson(*result)}};
  MarkInterruption(&manifest, {{"updates", workload->expected_pushes}});
  Status st = WriteOutputs(f, manifest, *result);
  if (!st.ok()) return Fail(st);
  PrintSummary(f, *result);
  return ExitCodeOf(0);
}

}  // namespace
}  // namespace onlineps::replay

int main(int argc, char** argv) { return onlineps::replay::Main(argc, argv); }
