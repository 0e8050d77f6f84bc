// replay_bench: logical replay speed (issue 6). Updates/s of Replayer::Run on in-process
// mem:// shards, beside the same training loop run directly in this process without
// the PS (the upper bound): same model, same batches, same number of steps, the PS's own
// update rules (ps::RuleSet) applied to local buffers, no staleness. The two alternate
// in rounds so machine noise hits both. Not a test.
//   replay_bench [--workload e1|e3|all] [--rounds N] [--updates N] [--datasets-dir DIR]
//                [--only replay|direct]
#include <spdlog/spdlog.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/rule_set.h"
#include "replay/batches.h"
#include "replay/dataset.h"
#include "replay/models.h"
#include "replay/replayer.h"
#include "replay/schedule.h"
#include "worker/model.h"
#include "worker/worker_service.h"

namespace onlineps::replay {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// CPU seconds of the whole process (every thread: shard, client I/O, caller). On a
// shared machine this is steadier than wall time.
double CpuSeconds() {
  timespec ts;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// One workload as onlineps_replay would run it (the flags in `command`).
struct Workload {
  const char* name;
  const char* command;  // the equivalent onlineps_replay flags, for the record
  const char* dataset;
  const char* model;  // mlp | sparse-lr
  uint32_t batch;
  uint32_t workers;
  const char* compute;    // delay spec (timing only matters for the event order)
  const char* staleness;  // "" or a staleness override
  const char* optimizer;
  uint64_t default_updates;
};

const Workload kWorkloads[] = {
    {"e1",
     "--dataset fashion-mnist --model mlp --batch 32 --workers 4 --compute exp:1 --optimizer sgd",
     "fashion-mnist", "mlp", 32, 4, "exp:1", "", "sgd", 1000},
    {"e3",
     "--dataset spam-assassin --model sparse-lr --batch 8 --workers 8 --staleness fixed:8 "
     "--optimizer ftrl",
     "spam-assassin", "sparse-lr", 8, 8, "fixed:1", "fixed:8", "ftrl", 600},
};

// The model exactly as replay_flags.cc MakeModel builds it for these flags.
StatusOr<std::unique_ptr<worker::Model>> MakeModel(const Workload& w, const Dataset& data) {
  if (std::strcmp(w.model, "sparse-lr") == 0) {
    SparseLrOptions s;
    s.labels = data.labels;
    return MakeSparseLrModel(s);
  }
  worker::ModelOptions o;
  o.hidden = {128};
  o.labels = data.labels;
  o.input_dim = static_cast<uint32_t>(data.dim);
  o.table_prefix = std::string(w.model) + "/";
  o.torch_threads = 1;
  return CreateReplayModel(w.model, o, worker::CreateModel);
}

// The rules of every table: as replay_flags.cc ReplayOptionsOf with --lr 0.1 --seed 1.
ps::TableSpec TableTemplate(const Workload& w) {
  ps::TableSpec t;
  t.optimizer = w.optimizer;
  t.optimizer_params[t.optimizer == "ftrl" ? "alpha" : "lr"] = 0.1;
  t.bound_mode = ps::BoundMode::kReject;
  t.seed = 1;
  return t;
}

struct Figure {
  double wall_s = 0;
  double cpu_s = 0;    // process CPU time
  double grad_s = 0;   // inside Model::Gradients
  double apply_s = 0;  // direct only: the update rules
  double loss = 0;     // mean training loss over the run
  double tau = 0;      // replay only: mean staleness measured by the shard
  double keys = 0;     // direct only: sparse rows read and updated per step
};

StatusOr<Figure> RunReplay(const Workload& w, const Dataset& data, worker::Model* model,
                           uint64_t updates) {
  DatasetBatches batches(&data, w.batch, /*seed=*/1, /*shuffle=*/true, /*test_rows=*/1);
  ScheduleOptions so;
  so.workers = w.workers;
  so.updates = updates;
  ONLINEPS_ASSIGN_OR_RETURN(so.compute, Delay::Parse(w.compute));
  if (*w.staleness) {
    ONLINEPS_ASSIGN_OR_RETURN(Delay d, Delay::Parse(w.staleness));
    so.staleness = d;
  }
  ONLINEPS_ASSIGN_OR_RETURN(auto scheduler, Scheduler::Create(so));
  ReplayOptions ro;
  ro.table_template = TableTemplate(w);
  ro.eval_every = std::numeric_limits<uint64_t>::max();  // only the final one-row evaluation
  ro.eval_rows = 1;
  ONLINEPS_ASSIGN_OR_RETURN(auto replayer, Replayer::Create(model, &batches, {}, ro));
  const auto t0 = Clock::now();
  const double c0 = CpuSeconds();
  ONLINEPS_ASSIGN_OR_RETURN(ReplayResult r,
                            replayer->Run([&](Event* e) { return scheduler->Next(e); }, updates));
  Figure f;
  f.wall_s = Seconds(t0);
  f.cpu_s = CpuSeconds() - c0;
  f.grad_s = r.compute_s;
  f.loss = r.curve.empty() ? 0 : r.curve.back().train_loss;
  f.tau = r.overall.Mean();
  if (r.pushes != updates) {
    return Internal("replay applied " + std::to_string(r.pushes) + " pushes, not " +
                    std::to_string(updates));
  }
  return f;
}

// One model parameter held locally, laid out as a shard lays it out (a sparse row is
// [w | optimizer slots | policy slots], each `dim` floats), updated by the PS's RuleSet.
class LocalParam {
 public:
  static StatusOr<LocalParam> Create(const worker::ParamInfo& p, const ps::TableSpec& tmpl) {
    ps::TableSpec spec = worker::TableSpecFor(p, tmpl);
    ONLINEPS_ASSIGN_OR_RETURN(ps::RuleSet rules, ps::RuleSet::Create(spec));
    return LocalParam(std::move(spec), std::move(rules));
  }

  const float* dense() const { return row_.data(); }

  // The current values of `keys`, as a pull would return them.
  void Read(const std::vector<uint64_t>& keys, worker::SparseRows* out) {
    out->keys = keys;
    out->values.resize(keys.size() * dim_);
    for (size_t i = 0; i < keys.size(); ++i) {
      std::memcpy(&out->values[i * dim_], Row(keys[i]), dim_ * sizeof(float));
    }
  }

  void ApplyDense(const std::vector<float>& g, uint64_t step) {
    Apply(row_.data(), g.data(), step);
  }

  void ApplySparse(const worker::SparseRows& g, uint64_t step) {
    for (size_t i = 0; i < g.keys.size(); ++i) Apply(Row(g.keys[i]), &g.values[i * dim_], step);
  }

 private:
  LocalParam(ps::TableSpec spec, ps::RuleSet rules)
      : spec_(std::move(spec)),
        rules_(std::move(rules)),
        sparse_(spec_.kind == ps::TableKind::kSparse),
        dim_(sparse_ ? spec_.dim : spec_.size()),
        row_floats_(dim_ * (1 + rules_.optimizer_slots() + rules_.policy_slots())) {
    if (!sparse_) row_ = NewRow(0);
  }

  std::vector<float> NewRow(uint64_t key) const {
    std::vector<float> row(row_floats_, 0.0f);
    ps::InitValues(spec_, key, row.data(), dim_, sparse_);
    for (int k = 0; k < rules_.optimizer_slots(); ++k) {
      std::fill_n(row.begin() + dim_ * (1 + k), dim_, rules_.InitialState(k));
    }
    return row;
  }

  float* Row(uint64_t key) {
    auto it = rows_.find(key);
    if (it == rows_.end()) it = rows_.emplace(key, NewRow(key)).first;
    return it->second.data();
  }

  // w sits at row[0, dim), then the optimizer's slots, then the policy's.
  void Apply(float* row, const float* g, uint64_t step) {
    float* opt[4];
    float* pol[4];
    for (int k = 0; k < rules_.optimizer_slots(); ++k) opt[k] = row + dim_ * (1 + k);
    for (int k = 0; k < rules_.policy_slots(); ++k) {
      pol[k] = row + dim_ * (1 + rules_.optimizer_slots() + k);
    }
    rules_.Apply(row, opt, pol, g, nullptr, dim_, rules_.policy().LrScale(0), step, &scratch_);
  }

  ps::TableSpec spec_;
  ps::RuleSet rules_;
  bool sparse_;
  size_t dim_, row_floats_;
  std::vector<float> row_;                                 // dense: the one row
  std::unordered_map<uint64_t, std::vector<float>> rows_;  // sparse: by key
  std::vector<float> scratch_;
};

// What a pull would give step k: dense params in place, sparse rows copied out.
worker::ParamView LocalView(const std::vector<worker::ParamInfo>& params,
                            const std::vector<std::vector<uint64_t>>& keys,
                            std::vector<LocalParam>* local, std::vector<worker::SparseRows>* rows) {
  worker::ParamView view;
  view.dense.assign(params.size(), nullptr);
  view.sparse.assign(params.size(), nullptr);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind == worker::ParamKind::kDense) {
      view.dense[i] = (*local)[i].dense();
    } else {
      (*local)[i].Read(keys[i], &(*rows)[i]);
      view.sparse[i] = &(*rows)[i];
    }
  }
  return view;
}

// The upper bound: step k learns batch k at the current local parameters, no PS.
StatusOr<Figure> RunDirect(const Workload& w, const Dataset& data, worker::Model* model,
                           uint64_t updates) {
  DatasetBatches batches(&data, w.batch, /*seed=*/1, /*shuffle=*/true, /*test_rows=*/1);
  const auto& params = model->params();
  std::vector<LocalParam> local;
  for (const worker::ParamInfo& p : params) {
    ONLINEPS_ASSIGN_OR_RETURN(LocalParam lp, LocalParam::Create(p, TableTemplate(w)));
    local.push_back(std::move(lp));
  }
  Figure f;
  std::vector<worker::SparseRows> rows(params.size());
  const auto t0 = Clock::now();
  const double c0 = CpuSeconds();
  for (uint64_t k = 0; k < updates; ++k) {
    ONLINEPS_ASSIGN_OR_RETURN(std::vector<worker::Example> batch, batches.Batch(k));
    ONLINEPS_ASSIGN_OR_RETURN(auto keys, model->SparseKeys(batch, {}));
    const worker::ParamView view = LocalView(params, keys, &local, &rows);
    for (const auto& param_keys : keys) f.keys += static_cast<double>(param_keys.size());
    const auto tg = Clock::now();
    ONLINEPS_ASSIGN_OR_RETURN(worker::GradOutput g, model->Gradients(batch, {}, view));
    const auto ta = Clock::now();
    f.grad_s += std::chrono::duration<double>(ta - tg).count();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].kind == worker::ParamKind::kDense) {
        local[i].ApplyDense(g.dense[i], k + 1);
      } else {
        local[i].ApplySparse(g.sparse[i], k + 1);
      }
    }
    f.apply_s += Seconds(ta);
    f.loss += g.loss;
  }
  f.wall_s = Seconds(t0);
  f.cpu_s = CpuSeconds() - c0;
  const double steps = static_cast<double>(std::max<uint64_t>(updates, 1));
  f.loss /= steps;
  f.keys /= steps;
  return f;
}

struct Options {
  std::vector<const Workload*> workloads;
  int rounds = 3;
  uint64_t updates = 0;  // 0: each workload's default
  bool replay = true, direct = true;
};

void PrintRound(const char* side, int round, uint64_t updates, const Figure& f) {
  std::printf(
      "  round %d %-6s %7.1f updates/s, %7.1f per CPU-s  (%5.2f s, CPU %5.2f s; gradients "
      "%4.1f%%",
      round, side, updates / f.wall_s, updates / f.cpu_s, f.wall_s, f.cpu_s,
      100 * f.grad_s / f.wall_s);
  if (f.apply_s > 0) std::printf(", rules %4.1f%%", 100 * f.apply_s / f.wall_s);
  std::printf("; train loss %.4f", f.loss);
  if (std::strcmp(side, "replay") == 0) std::printf("; mean tau %.2f", f.tau);
  if (f.keys > 0) std::printf("; %.0f sparse keys/step", f.keys);
  std::printf(")\n");
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::vector<double> Rates(const std::vector<Figure>& fs, uint64_t n, bool cpu) {
  std::vector<double> out;
  for (const Figure& f : fs) out.push_back(n / (cpu ? f.cpu_s : f.wall_s));
  return out;
}

// Medians over rounds. "At equal gradient cost" swaps the replay's time inside
// Model::Gradients for the direct loop's of the same round: the two sides train to
// different weights (the replay is stale), and this BLAS's cost depends on the values.
void PrintSummary(const Workload& w, uint64_t n, const std::vector<Figure>& replay,
                  const std::vector<Figure>& direct) {
  std::printf("%s: replay %.1f updates/s, direct %.1f updates/s (medians of %zu rounds)", w.name,
              Median(Rates(replay, n, false)), Median(Rates(direct, n, false)),
              std::max(replay.size(), direct.size()));
  std::vector<double> ratio, cpu_ratio, equal_grad;
  for (size_t i = 0; i < replay.size() && i < direct.size(); ++i) {
    ratio.push_back(direct[i].wall_s / replay[i].wall_s);
    cpu_ratio.push_back(direct[i].cpu_s / replay[i].cpu_s);
    equal_grad.push_back(direct[i].wall_s /
                         (replay[i].wall_s - replay[i].grad_s + direct[i].grad_s));
  }
  if (!ratio.empty()) {
    const double rr = Median(ratio);
    std::printf(
        "\n%s: ratio replay/direct %.2f (rounds %.2f..%.2f; per CPU-s %.2f; at equal gradient "
        "cost %.2f); target >= 0.90 (issue 23): %s",
        w.name, rr, *std::min_element(ratio.begin(), ratio.end()),
        *std::max_element(ratio.begin(), ratio.end()), Median(cpu_ratio), Median(equal_grad),
        rr >= 0.9 ? "met" : "MISSED");
  }
  std::printf("\n");
}

// Alternates replay and direct for `rounds`, after an untimed warm-up of each.
Status Bench(const Workload& w, const Options& o) {
  ONLINEPS_ASSIGN_OR_RETURN(Dataset data, LoadDataset(w.dataset, {}));
  ONLINEPS_ASSIGN_OR_RETURN(auto model, MakeModel(w, data));
  const uint64_t n = o.updates ? o.updates : w.default_updates;
  std::printf("%s: onlineps_replay %s, %llu updates per figure (train %zu, %zu tables)\n", w.name,
              w.command, static_cast<unsigned long long>(n), data.train_size(),
              model->params().size());
  const uint64_t warm = std::max<uint64_t>(1, n / 20);
  if (o.replay) ONLINEPS_RETURN_IF_ERROR(RunReplay(w, data, model.get(), warm).status());
  if (o.direct) ONLINEPS_RETURN_IF_ERROR(RunDirect(w, data, model.get(), warm).status());
  std::vector<Figure> replay, direct;
  for (int r = 1; r <= o.rounds; ++r) {
    // Odd rounds start with the replay, even ones with the direct loop.
    for (int side = 0; side < 2; ++side) {
      const bool do_replay = (side == 0) == (r % 2 == 1);
      if (do_replay ? !o.replay : !o.direct) continue;
      ONLINEPS_ASSIGN_OR_RETURN(Figure f, do_replay ? RunReplay(w, data, model.get(), n)
                                                    : RunDirect(w, data, model.get(), n));
      PrintRound(do_replay ? "replay" : "direct", r, n, f);
      (do_replay ? replay : direct).push_back(f);
    }
  }
  PrintSummary(w, n, replay, direct);
  return Status::Ok();
}

constexpr char kUsage[] =
    "usage: replay_bench [--workload e1|e3|all] [--rounds N] [--updates N]\n"
    "                    [--datasets-dir DIR] [--only replay|direct]\n"
    "  Logical replay (Replayer::Run, in-process mem:// shard, evaluation off) against the\n"
    "  same training loop run directly without the PS, in alternating rounds.\n"
    "  --workload      e1: fashion-mnist, mlp 128, batch 32, 4 workers exp:1, sgd\n"
    "                  e3: spam-assassin, sparse-lr, batch 8, 8 workers, staleness fixed:8,\n"
    "                  ftrl (default: all)\n"
    "  --rounds N      alternating rounds per workload (default 3)\n"
    "  --updates N     updates per figure (default: e1 1000, e3 600)\n"
    "  --datasets-dir  where the npm datasets are installed (sets ONLINEPS_DATASETS_DIR)\n"
    "  --only SIDE     run one side only (for profiling)\n";

// Returns 0 to go on, else the exit status.
int Parse(int argc, char** argv, Options* o) {
  std::string workload = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return -1;
    }
    if (a != "--workload" && a != "--rounds" && a != "--updates" && a != "--datasets-dir" &&
        a != "--only") {
      std::fprintf(stderr, "replay_bench: unknown flag %s\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "replay_bench: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--workload") {
      workload = v;
    } else if (a == "--rounds" || a == "--updates") {
      // Decimal digits only: "abc" and "-5" were read as 1 and as about 1.8e19.
      const bool digits =
          !v.empty() && v.size() <= 12 && v.find_first_not_of("0123456789") == std::string::npos;
      const uint64_t n = digits ? std::strtoull(v.c_str(), nullptr, 10) : 0;
      if (!digits || n == 0 || (a == "--rounds" && n > 1000)) {
        std::fprintf(stderr, "replay_bench: %s takes a whole number from 1%s, not '%s'\n%s",
                     a.c_str(), a == "--rounds" ? " to 1000" : "", v.c_str(), kUsage);
        return 2;
      }
      if (a == "--rounds") {
        o->rounds = static_cast<int>(n);
      } else {
        o->updates = n;
      }
    } else if (a == "--datasets-dir") {
      ::setenv("ONLINEPS_DATASETS_DIR", v.c_str(), 1);
    } else if (a == "--only" && (v == "replay" || v == "direct")) {
      o->replay = v == "replay";
      o->direct = v == "direct";
    } else {
      std::fprintf(stderr, "replay_bench: bad flag %s %s\n%s", a.c_str(), v.c_str(), kUsage);
      return 2;
    }
  }
  for (const Workload& w : kWorkloads) {
    if (workload == "all" || workload == w.name) o->workloads.push_back(&w);
  }
  if (o->workloads.empty()) {
    std::fprintf(stderr, "replay_bench: unknown workload '%s'\n%s", workload.c_str(), kUsage);
    return 2;
  }
  return 0;
}

int Main(int argc, char** argv) {
  Options o;
  spdlog::set_level(spdlog::level::warn);  // the shards' start / stop lines
  if (int rc = Parse(argc, argv, &o); rc != 0) return rc < 0 ? 0 : rc;
  std::printf(
      "replay_bench: logical replay on 1 in-process mem:// shard vs the direct loop; %d "
      "rounds\n",
      o.rounds);
  for (const Workload* w : o.workloads) {
    Status st = Bench(*w, o);
    if (!st.ok()) {
      std::fprintf(stderr, "replay_bench: %s: %s\n", w->name, st.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace onlineps::replay

int main(int argc, char** argv) { return onlineps::replay::Main(argc, argv); }
