#include "replay/replay_flags.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/config.h"
#include "common/flags.h"
#include "replay/models.h"
#include "replay/report.h"

namespace onlineps::replay {
namespace {

// "a:b:c" -> numbers; kInvalidArgument naming the flag and the expected form.
StatusOr<std::vector<double>> Fields(const std::string& s, size_t n, const std::string& flag,
                                     const std::string& form) {
  std::vector<double> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ':')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0') break;
    out.push_back(v);
  }
  if (out.size() != n) return InvalidArgument(flag + " '" + s + "' is not " + form);
  if (!(out[0] >= 0 && out[0] < 4294967296.0 && out[0] == std::floor(out[0]))) {
    return InvalidArgument(flag + " '" + s + "': W must be a worker index (0, 1, ...)");
  }
  for (double v : out) {
    if (std::isnan(v)) return InvalidArgument(flag + " '" + s + "' holds nan");
  }
  return out;
}

void AddWorkloadFlags(CLI::App& app, Flags* f) {
  app.add_option("--dataset", f->dataset,
                 "fashion-mnist | digits | spam-assassin | none | csv:PATH | npz:PATH | "
                 "libsvm:PATH (your own data: a CSV of numeric features and a label column, "
                 "a NumPy archive with x, y[, x_test, y_test], or sparse features in "
                 "libsvm/svmlight format for --model sparse-lr; docs/replay.md)")
      ->capture_default_str();
  app.add_option("--label-column", f->label_column,
                 "csv: the label column, by header name or 0-based index (default: the last)");
  app.add_option("--csv-header", f->csv_header,
                 "csv: auto | yes | no (auto: the first row is a header when a feature cell "
                 "in it is not a number, or --label-column is a name)")
      ->check(CLI::IsMember({"auto", "yes", "no"}))
      ->capture_default_str();
  app.add_option("--test-file", f->test_file,
                 "csv, libsvm: the test split from this file (default: a seeded split with "
                 "--test-fraction)");
  app.add_option("--normalize", f->normalize,
                 "csv, npz: feature scaling fitted on the training rows: standard (z-score) | "
                 "minmax ([0, 1]) | none")
      ->check(CLI::IsMember({"standard", "minmax", "none"}))
      ->capture_default_str();
  app.add_option("--trace", f->trace, "Replay this recorded trace instead of a dataset");
  app.add_option("--data-dir", f->data_dir,
                 "Dataset directory (default: where its package puts it)");
  app.add_option("--max-train", f->max_train, "Training examples used (0: all)")
      ->capture_default_str();
  app.add_option("--max-test", f->max_test, "Test examples kept (0: all)")->capture_default_str();
  app.add_option("--split-seed", f->split_seed,
                 "Seed of the train/test split (digits, spam-assassin, csv, npz)")
      ->capture_default_str();
  app.add_option("--test-fraction", f->test_fraction, "Share held out for testing (seeded splits)")
      ->check(NumberIn(0.01, 0.99))
      ->capture_default_str();
  app.add_flag("--no-shuffle", f->no_shuffle, "Keep the file order (online setting)");
  app.add_option("--batch", f->batch, "Examples per push")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--epochs", f->epochs, "Passes over the training set when --updates is 0")
      ->capture_default_str();
  app.add_option("--updates", f->updates, "Pushes to run (0: --epochs passes)")
      ->capture_default_str();
  app.add_option("--learn-chunk", f->learn_chunk,
                 "Trace: examples per push of a learn call (the bridge's)")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--loop", f->loop, "Trace: replay it this many times")
      ->check(CLI::Range(1u, 1000000u))
      ->capture_default_str();
  app.add_option("--limit", f->limit, "Trace: use only the first N learn records (0: all)")
      ->capture_default_str();
}

void AddModelFlags(CLI::App& app, Flags* f) {
  app.add_option("--model", f->model, "mlp | text | sparse-lr | quadratic | torchscript")
      ->capture_default_str();
  app.add_option("--hidden", f->hidden,
                 "Hidden layer widths, comma separated (default: mlp 128, text none; 0: none)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--embed-dim", f->embed_dim, "text: embedding width")->capture_default_str();
  app.add_option("--labels", f->labels, "Labels of a trace whose header has none")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--buckets", f->buckets, "sparse-lr: hashed feature buckets")
      ->capture_default_str();
  app.add_flag("--bigrams", f->bigrams, "sparse-lr: add word-pair features");
  app.add_option("--model-file", f->model_file, "torchscript: the .pt file");
  app.add_option("--trainable", f->trainable,
                 "torchscript: globs of the parameters that learn (PS tables), comma separated, "
                 "e.g. 'head.*,*.lora_*'; every other parameter is frozen (default: the file's "
                 "requires_grad decides)")
      ->delimiter(',');
  app.add_option("--frozen", f->frozen,
                 "torchscript: globs of the parameters to freeze (loaded from --model-file, "
                 "never pushed), comma separated; every other parameter learns")
      ->delimiter(',');
  app.add_option("--torch-threads", f->torch_threads, "Intra-op threads of libtorch models")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--quad-h", f->quad_h, "quadratic: curvature h of f(x) = h x^2 / 2")
      ->capture_default_str();
  app.add_option("--quad-x0", f->quad_x0, "quadratic: starting point")->capture_default_str();
}

void AddScheduleFlags(CLI::App& app, Flags* f) {
  app.add_option("--workers", f->workers, "Virtual workers")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  app.add_option("--compute", f->compute,
                 "Compute time per step, ms (a delay spec, docs/replay.md)")
      ->capture_default_str();
  app.add_option("--message", f->message, "Network delay per message, ms (a delay spec)")
      ->capture_default_str();
  app.add_option("--staleness", f->staleness,
                 "Staleness override (a delay spec in pushes); replaces timing. A trace "
                 "without it keeps its recorded staleness");
  app.add_option("--worker-speed", f->worker_speed,
                 "Per-worker compute-time multipliers, e.g. 1,1,1,4")
      ->delimiter(',');
  app.add_option("--straggler", f->stragglers, "W:FROM_MS:TO_MS:FACTOR, worker W slower (repeat)");
  app.add_option("--churn", f->churn,
                 "W:JOIN_MS:LEAVE_MS, worker W active only then (repeat; LEAVE -1: never)");
  app.add_flag("--sync", f->sync, "Synchronous rounds, averaged on the PS (accumulate = workers)");
  app.add_option("--seed", f->seed, "Seed of the schedule, batch order and table init")
      ->capture_default_str();
}

void AddPsFlags(CLI::App& app, Flags* f) {
  app.add_option("--ps", f->ps, "Shard endpoints of a running cluster (default: in-process)")
      ->delimiter(',');
  app.add_option("--shards", f->shards, "In-process shards")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  app.add_option("--ps-timeout-ms", f->ps_timeout_ms, "Per PS call")
      ->check(TimeoutMs())
      ->capture_default_str();
  app.add_option("--optimizer", f->optimizer, "sgd | adagrad | ftrl | adam")->capture_default_str();
  app.add_option("--lr", f->lr,
                 "Learning rate (ftrl: its alpha unless --opt-param alpha= is given)")
      ->capture_default_str();
  app.add_option("--opt-param", f->opt_params, "Optimizer parameter NAME=VALUE (repeat)");
  app.add_option("--staleness-policy", f->staleness_policy,
                 "none | lr_over_tau | dc_constant | dc_adaptive")
      ->capture_default_str();
  app.add_option("--staleness-param", f->staleness_params, "Policy parameter NAME=VALUE (repeat)");
  app.add_option("--max-staleness", f->max_staleness,
                 "Bounded staleness s, pushes beyond are rejected (-1: off)")
      ->capture_default_str();
  app.add_option("--accumulate", f->accumulate,
                 "Apply once per K pushes (0: 1, or --workers with --sync)")
      ->capture_default_str();
  app.add_flag("--polyak", f->polyak, "Keep a Polyak-averaged copy on the PS");
  app.add_option("--polyak-start", f->polyak_start, "Average over versions after this one")
      ->capture_default_str();
  app.add_flag("--eval-averaged", f->eval_averaged, "Evaluate the averaged copy (needs --polyak)");
}

void AddOutputFlags(CLI::App& app, Flags* f) {
  app.add_option("--mode", f->mode, "logical (as fast as possible) | timed (keeps the gaps)")
      ->check(CLI::IsMember({"logical", "timed"}))
      ->capture_default_str();
  app.add_option("--speed", f->speed, "timed: gaps divided by this factor")
      ->check(NumberIn(1e-9, 1e12))
      ->capture_default_str();
  app.add_option("--max-gap-ms", f->max_gap_ms, "timed: longest wait between events (0: no cap)")
      ->capture_default_str();
  app.add_option("--duration-s", f->duration_s, "Stop after this much wall time (0: no limit)")
      ->capture_default_str();
  app.add_flag("--dry-run", f->dry_run,
               "Print the expected staleness histogram and duration; run nothing");
  app.add_option("--out", f->out, "Output directory")->capture_default_str();
  app.add_option("--run-name", f->run_name,
                 "Value of the CSV 'run' column (default: the --out name)");
  app.add_flag("--events", f->events,
               "Write every pull and push to OUT/events.jsonl (trace format)");
  app.add_flag("--no-plots", f->no_plots, "Skip the gnuplot PNG/SVG plots");
  app.add_option("--eval-every", f->eval_every, "Pushes between evaluations (0: 20 per run)")
      ->capture_default_str();
  app.add_option("--eval-rows", f->eval_rows, "Test examples per evaluation (0: all)")
      ->capture_default_str();
  app.add_flag("--progressive", f->progressive,
               "Score each batch before learning it (online accuracy)");
  app.add_flag("--quiet", f->quiet, "No progress line");
}

void AddBridgeFlags(CLI::App& app, Flags* f) {
  app.add_option("--bridge", f->bridge,
                 "Send the --trace's tool calls to this MCP bridge (http://HOST:PORT/mcp), paced "
                 "by --speed and --max-gap-ms");
  app.add_option("--bridge-token-file", f->bridge_token_file,
                 "--bridge: file holding the bearer token (else $ONLINEPS_BRIDGE_TOKEN)");
  app.add_option("--connections", f->connections, "--bridge: concurrent calls at most")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--call-timeout-ms", f->call_timeout_ms, "--bridge: per tool call")
      ->check(TimeoutMs())
      ->capture_default_str();
}

}  // namespace

void AddFlags(CLI::App& app, Flags* f) {
  AddWorkloadFlags(app, f);
  AddModelFlags(app, f);
  AddScheduleFlags(app, f);
  AddPsFlags(app, f);
  AddOutputFlags(app, f);
  AddBridgeFlags(app, f);
}

StatusOr<std::string> BridgeToken(const Flags& f) {
  if (f.bridge_token_file.empty()) {
    const char* env = std::getenv("ONLINEPS_BRIDGE_TOKEN");
    return std::string(env ? env : "");
  }
  std::ifstream in(f.bridge_token_file);
  if (!in) return NotFound("--bridge-token-file " + f.bridge_token_file + ": cannot be read");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find_first_not_of(" \t\r");
    if (a == std::string::npos || line[a] == '#') continue;
    const size_t b = line.find_last_not_of(" \t\r");
    return line.substr(a, b - a + 1);
  }
  return InvalidArgument("--bridge-token-file " + f.bridge_token_file + " holds no token");
}

Status CheckFlags(const Flags& f) {
  if (f.sync && !f.churn.empty()) return InvalidArgument("--sync cannot be combined with --churn");
  if (f.sync && !f.staleness.empty())
    return InvalidArgument("--sync cannot be combined with --staleness");
  if (f.eval_averaged && !f.polyak) return InvalidArgument("--eval-averaged needs --polyak");
  if (f.trace.empty() && f.dataset == "none" && f.model != "quadratic") {
    return InvalidArgument("--dataset none only works with --model quadratic");
  }
  const bool csv = f.dataset.rfind("csv:", 0) == 0, libsvm = f.dataset.rfind("libsvm:", 0) == 0;
  if (!csv && !f.label_column.empty()) {
    return InvalidArgument("--label-column is for --dataset csv:PATH");
  }
  if (!csv && !libsvm && !f.test_file.empty()) {
    return InvalidArgument("--test-file is for --dataset csv:PATH or libsvm:PATH");
  }
  if (f.trace.empty() && f.dataset == "none" && f.updates == 0) {
    return InvalidArgument("--dataset none has no examples to count epochs in: give --updates N");
  }
  if (!f.trace.empty() && f.sync)
    return InvalidArgument("--sync applies to dataset runs, not --trace");
  if (!f.bridge.empty() && f.trace.empty()) return InvalidArgument("--bridge needs --trace");
  if (!f.bridge.empty() && (!f.staleness.empty() || !f.ps.empty())) {
    return InvalidArgument(
        "--bridge sends tool calls; the bridge's own cluster makes the staleness: drop "
        "--staleness and --ps");
  }
  return Status::Ok();
}

DatasetOptions DatasetOptionsOf(const Flags& f) {
  DatasetOptions o;
  o.dir = f.data_dir;
  o.max_train = f.max_train;
  o.max_test = f.max_test;
  o.split_seed = f.split_seed;
  o.test_fraction = f.test_fraction;
  o.label_column = f.label_column;
  o.header = f.csv_header;
  o.test_file = f.test_file;
  o.normalize = f.normalize;
  return o;
}

StatusOr<ScheduleOptions> ScheduleOptionsOf(const Flags& f) {
  ScheduleOptions o;
  o.workers = f.workers;
  o.updates = f.updates;
  ONLINEPS_ASSIGN_OR_RETURN(o.compute, Delay::Parse(f.compute));
  ONLINEPS_ASSIGN_OR_RETURN(o.message, Delay::Parse(f.message));
  if (!f.staleness.empty()) {
    ONLINEPS_ASSIGN_OR_RETURN(Delay d, Delay::Parse(f.staleness));
    o.staleness = d;
  }
  o.speed = f.worker_speed;
  for (const std::string& s : f.stragglers) {
    ONLINEPS_ASSIGN_OR_RETURN(auto v, Fields(s, 4, "--straggler", "W:FROM_MS:TO_MS:FACTOR"));
    o.stragglers.push_back({static_cast<uint32_t>(v[0]), v[1], v[2], v[3]});
  }
  for (const std::string& s : f.churn) {
    ONLINEPS_ASSIGN_OR_RETURN(auto v, Fields(s, 3, "--churn", "W:JOIN_MS:LEAVE_MS"));
    Churn c;
    c.worker = static_cast<uint32_t>(v[0]);
    c.join_ms = v[1];
    if (v[2] >= 0) c.leave_ms = v[2];
    o.churn.push_back(c);
  }
  o.mode = f.sync ? SyncMode::kSync : SyncMode::kAsync;
  o.seed = f.seed;
  return o;
}

Status ReplayOptionsOf(const Flags& f, ReplayOptions* out) {
  ps::TableSpec& t = out->table_template;
  t.optimizer = f.optimizer;
  t.optimizer_params[f.optimizer == "ftrl" ? "alpha" : "lr"] = f.lr;
  ONLINEPS_RETURN_IF_ERROR(ParseNamedNumbers(f.opt_params, "--opt-param", &t.optimizer_params));
  t.staleness = f.staleness_policy;
  ONLINEPS_RETURN_IF_ERROR(
      ParseNamedNumbers(f.staleness_params, "--staleness-param", &t.staleness_params));
  t.max_staleness = f.max_staleness;
  t.bound_mode = ps::BoundMode::kReject;
  t.accumulate = f.accumulate ? f.accumulate : (f.sync ? f.workers : 1);
  t.polyak = f.polyak;
  t.polyak_start = f.polyak_start;
  t.seed = f.seed;
  // Validates names and parameters the way a shard will, before anything starts.
  t.name = "check";
  t.shape = {1};
  ONLINEPS_RETURN_IF_ERROR(ps::DecodeSpec(ps::EncodeSpec(t)).status());
  out->eval_every = f.eval_every;
  out->eval_rows = f.eval_rows;
  out->eval_averaged = f.eval_averaged;
  out->progressive = f.progressive;
  return Status::Ok();
}

ClusterOptions ClusterOptionsOf(const Flags& f) {
  ClusterOptions c;
  c.shards = f.ps;
  c.inproc_shards = f.shards;
  c.timeout = std::chrono::milliseconds(f.ps_timeout_ms);
  return c;
}

StatusOr<std::unique_ptr<worker::Model>> MakeModel(const Flags& f, const Dataset& data,
                                                   const TraceSteps& steps) {
  if (f.model == "quadratic") {
    QuadraticOptions q;
    q.h = f.quad_h;
    q.x0 = f.quad_x0;
    return MakeQuadraticModel(q);
  }
  if (data.sparse && f.model != "sparse-lr") {
    return InvalidArgument("--dataset " + data.name +
                           " has sparse features: use --model sparse-lr");
  }
  worker::ModelOptions o;
  o.hidden = f.hidden;
  if (o.hidden.empty() && f.model == "mlp") o.hidden = {128};
  if (o.hidden.size() == 1 && o.hidden[0] == 0) o.hidden.clear();
  o.embed_dim = f.embed_dim;
  o.torch_threads = f.torch_threads;
  o.model_file = f.model_file;
  o.trainable = f.trainable;
  o.frozen = f.frozen;
  o.bigrams = f.trace.empty() ? f.bigrams : true;
  o.labels = f.trace.empty() ? data.labels : steps.labels;
  o.input_dim = static_cast<uint32_t>(data.dim);
  o.table_prefix = f.model + "/";  // what onlineps_worker uses, so traces line up
  if (f.model == "sparse-lr") {
    SparseLrOptions s;
    s.buckets = f.buckets;
    s.bigrams = f.bigrams;
    s.labels = o.labels;
    if (s.labels.size() != 2) return InvalidArgument("--model sparse-lr needs a 2-class dataset");
    return MakeSparseLrModel(s);
  }
  return CreateReplayModel(f.model, o, worker::CreateModel);
}

Status CheckTraceTables(const TraceHeader& header, const worker::Model& model) {
  if (!header.model.is_object() || !header.model.contains("tables")) return Status::Ok();
  const nlohmann::json& tables = header.model["tables"];
  if (!tables.is_array()) return InvalidArgument("the trace header's model.tables is not an array");
  for (const auto& t : tables) {
    if (!t.is_object() || !t.contains("table") || !t["table"].is_string()) {
      return InvalidArgument("the trace header's model.tables holds " + t.dump().substr(0, 80) +
                             ", not {\"table\": NAME, ...}");
    }
    const std::string name = t["table"].get<std::string>();
    bool found = false;
    for (const auto& p : model.params()) {
      if (p.name != name) continue;
      found = true;
      if (t.contains("shape") && t["shape"] != nlohmann::json(p.shape)) {
        return InvalidArgument("the trace's table '" + name + "' has shape " + t["shape"].dump() +
                               " but the model's has " + nlohmann::json(p.shape).dump() +
                               " (check --model, --embed-dim, --hidden)");
      }
    }
    if (!found) {
      return InvalidArgument("the trace was recorded with table '" + name +
                             "', which this model does not have (check --model)");
    }
  }
  return Status::Ok();
}

nlohmann::json ResultJson(const ReplayResult& r) {
  nlohmann::json workers = nlohmann::json::array(), shards = nlohmann::json::array();
  for (const auto& s : r.per_worker) workers.push_back(s.ToJson());
  for (const auto& s : r.per_shard) shards.push_back(s.ToJson());
  nlohmann::json j = {
      {"pulls", r.pulls},
      {"pushes", r.pushes},
      {"rejected", r.rejected},
      {"queued_at_end", r.queued_at_end},
      {"wall_s", r.wall_s},
      {"compute_s", r.compute_s},
      {"updates_per_s", r.wall_s > 0 ? static_cast<double>(r.pushes) / r.wall_s : 0},
      {"params_sha256", r.params_sha256},
      {"staleness", r.overall.ToJson()},
      {"staleness_per_worker", workers},
      {"staleness_per_shard", shards}};
  if (!r.curve.empty()) {
    const EvalRow& e = r.curve.back();
    j["final"] = {{"updates", e.updates},
                  {"test_accuracy", e.test_accuracy},
                  {"test_loss", e.test_loss},
                  {"train_loss", e.train_loss},
                  {"progressive_accuracy", e.progressive_accuracy}};
  }
  return j;
}

Status WriteOutputs(const Flags& f, const nlohmann::json& manifest, const ReplayResult& r) {
  std::string run = f.run_name;
  if (run.empty()) {
    const size_t slash = f.out.find_last_of('/');
    run = slash == std::string::npos ? f.out : f.out.substr(slash + 1);
  }
  ONLINEPS_RETURN_IF_ERROR(WriteJson(f.out + "/manifest.json", manifest));
  ONLINEPS_RETURN_IF_ERROR(WriteCurveCsv(f.out + "/curve.csv", run, r));
  ONLINEPS_RETURN_IF_ERROR(WriteStalenessCsv(f.out + "/staleness.csv", run, r));
  ONLINEPS_RETURN_IF_ERROR(WriteHistogramCsv(f.out + "/tau_histogram.csv", run, r));
  if (!f.no_plots) {
    Status st = Plot(f.out, r);
    if (!st.ok()) std::fprintf(stderr, "onlineps_replay: %s\n", st.message().c_str());
  }
  return Status::Ok();
}

void PrintSummary(const Flags& f, const ReplayResult& r) {
  std::printf("pushes %llu (rejected %llu) in %.2f s: %.0f updates/s\n",
              static_cast<unsigned long long>(r.pushes),
              static_cast<unsigned long long>(r.rejected), r.wall_s,
              r.wall_s > 0 ? static_cast<double>(r.pushes) / r.wall_s : 0.0);
  if (r.queued_at_end > 0) {
    std::printf(
        "note: the last %llu push(es) are still queued in the shards' accumulators "
        "(--accumulate, or --sync with fewer pushes in the last round than workers): the final "
        "parameters and params_sha256 do not include them; make --updates a multiple of the "
        "accumulation count to apply every push\n",
        static_cast<unsigned long long>(r.queued_at_end));
  }
  std::printf("staleness mean %.3f p50 %llu p99 %llu max %llu\n", r.overall.Mean(),
              static_cast<unsigned long long>(r.overall.Quantile(0.5)),
              static_cast<unsigned long long>(r.overall.Quantile(0.99)),
              static_cast<unsigned long long>(r.overall.Max()));
  if (!r.curve.empty()) {
    const EvalRow& e = r.curve.back();
    // A trace or --dataset none has no test split: "test accuracy nan" read as a failure.
    if (std::isfinite(e.test_accuracy)) {
      std::printf("final test accuracy %.4f, test loss %.4f", e.test_accuracy, e.test_loss);
    } else {
      std::printf("final train loss %.4f (no test split to evaluate)", e.train_loss);
    }
    if (e.progressive_accuracy >= 0)
      std::printf(", progressive accuracy %.4f", e.progressive_accuracy);
    std::printf("\n");
  }
  std::printf(
      "params sha256 %s\nwrote %s/{manifest.json,curve.csv,staleness.csv,tau_histogram.csv}\n",
      r.params_sha256.c_str(), f.out.c_str());
}

}  // namespace onlineps::replay
