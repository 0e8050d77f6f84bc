// onlineps_worker: a stateless libtorch worker serving infer / learn / context over
// ZeroMQ. Flags, ONLINEPS_* env vars and --config are documented in
// docs/configuration.md; `onlineps_worker --help` lists them.
#include <spdlog/spdlog.h>

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "common/admin_server.h"
#include "common/config.h"
#include "common/curve.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/periodic_thread.h"
#include "common/port_probe.h"
#include "common/signals.h"
#include "ps/ps_client.h"
#include "ps/update_rule.h"
#include "worker/gpu_config.h"
#include "worker/local_group.h"
#include "worker/model.h"
#if ONLINEPS_HAVE_NCCL
#include "worker/nccl_group.h"
#endif
#include "worker/worker_metrics.h"
#include "worker/worker_server.h"
#include "worker/worker_service.h"

namespace {

using onlineps::CondVar;
using onlineps::Mutex;
using onlineps::MutexLock;
using onlineps::Status;
using onlineps::StatusCode;
namespace worker = onlineps::worker;

struct Flags {
  std::vector<std::string> ps;
  worker::ModelOptions model;
  worker::WorkerServiceOptions service;
  worker::WorkerServerOptions server;
  std::string reply_when = "applied";
  double lr = 0.05;
  std::vector<std::string> opt_params, staleness_params, freshness;
  std::string bound_mode = "reject";
  int64_t context_ttl_s = 1800;
  int64_t ps_timeout_ms = 5000;
  int64_t infer_batch_wait_us = 0;
  uint64_t sender_id = 0;
  std::string admin_host = "127.0.0.1";
  int admin_port = 9200;
  std::string group = "none";
  int group_rank = 0, group_size = 1, group_device = 0;
  std::string group_endpoint, group_id_file, group_curve_keys;
  int64_t group_timeout_ms = 10000;
  onlineps::CurveFlags curve;
  onlineps::CurveOptions curve_options;  // loaded from `curve` in Finish
};

void AddModelFlags(CLI::App& app, Flags* f) {
  auto& m = f->model;
  app.add_option("--model", m.kind, "Model: text | mlp | torchscript")
      ->check(CLI::IsMember({"text", "mlp", "torchscript"}))
      ->capture_default_str();
  app.add_option("--labels", m.labels, "Output labels, comma separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--table-prefix", m.table_prefix,
                 "Prefix of every PS table name (default: '<model>/')");
  app.add_option("--embed-dim", m.embed_dim, "text: embedding row size")->capture_default_str();
  app.add_option("--hidden", m.hidden, "Hidden layer widths, comma separated (empty: linear)")
      ->delimiter(',');
  app.add_flag("!--no-bigrams", m.bigrams, "text: use words only, not word pairs");
  app.add_option("--context-weight", m.context_weight,
                 "text: weight of a context token against 1 for a request token")
      ->capture_default_str();
  app.add_option("--input-dim", m.input_dim, "mlp: input features")->capture_default_str();
  app.add_option("--context-dim", m.context_dim,
                 "mlp: extra input columns fed from the session's context features")
      ->capture_default_str();
  app.add_option("--model-file", m.model_file, "torchscript: module file (torch.jit.save)");
  app.add_option("--sparse-params", m.sparse_params,
                 "torchscript: parameters served as sparse tables, comma separated")
      ->delimiter(',');
  app.add_option("--trainable", m.trainable,
                 "torchscript: globs of the parameters that learn (PS tables), comma separated, "
                 "e.g. 'head.*,*.lora_*'; every other parameter is frozen (default: the file's "
                 "requires_grad decides)")
      ->delimiter(',');
  app.add_option("--frozen", m.frozen,
                 "torchscript: globs of the parameters to freeze (loaded from --model-file, "
                 "never pushed), comma separated; every other parameter learns")
      ->delimiter(',');
  app.add_option("--device", m.device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--torch-threads", m.torch_threads, "libtorch intra-op threads")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
}

void AddLearnFlags(CLI::App& app, Flags* f) {
  auto& s = f->service;
  app.add_option("--lr", f->lr, "Learning rate of the tables this worker creates")
      ->capture_default_str();
  app.add_option("--optimizer", s.table_template.optimizer, "sgd | adagrad | ftrl | adam")
      ->capture_default_str();
  app.add_option("--opt-param", f->opt_params, "Extra optimizer parameter NAME=VALUE (repeat)");
  app.add_option("--staleness-policy", s.table_template.staleness,
                 "none | lr_over_tau | dc_constant | dc_adaptive")
      ->capture_default_str();
  app.add_option("--staleness-param", f->staleness_params, "Policy parameter NAME=VALUE (repeat)");
  app.add_option("--max-staleness", s.table_template.max_staleness,
                 "Bounded staleness s (-1: unbounded)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--clip-norm", s.table_template.clip_norm,
                 "Shards scale each push of this worker's tables to at most this L2 norm (0: off)")
      ->check(onlineps::NumberIn(0, HUGE_VAL))
      ->capture_default_str();
  // Caps of the sparse tables this worker creates (docs/operations.md, "Memory"): a
  // stream of always-new keys (the text model hashes every word) cannot grow a shard
  // without bound. Fixed when a table is created; a table that exists keeps its own.
  s.table_template.max_rows = 1000000;
  app.add_option("--sparse-max-rows", s.table_template.max_rows,
                 "Sparse tables this worker creates: rows per shard, least recently used "
                 "evicted beyond (0: no cap)")
      ->capture_default_str();
  app.add_option("--sparse-ttl-ms", s.table_template.ttl_ms,
                 "... drop rows neither pushed nor pulled for this long (0: never)")
      ->capture_default_str();
  app.add_option("--sparse-admit-after", s.table_template.admit_after,
                 "... create a row on its N-th push (0 or 1: the first)")
      ->capture_default_str();
  app.add_option("--bound-mode", f->bound_mode, "reject | block (SSP)")
      ->check(CLI::IsMember({"reject", "block"}))
      ->capture_default_str();
  app.add_option("--accumulate-examples", s.accumulate_examples,
                 "Push dense gradients after this many examples")
      ->check(CLI::Range(1u, 1u << 30))
      ->capture_default_str();
  app.add_option("--accumulate-ms", s.accumulate_ms,
                 "... or when the oldest accumulated gradient is this old (0: off)")
      ->capture_default_str();
  app.add_option("--reply-when", f->reply_when,
                 "learn replies after the PS 'applied' the push, or once 'queued'")
      ->check(CLI::IsMember({"applied", "queued"}))
      ->capture_default_str();
  app.add_option("--local-steps", s.local_steps,
                 "Local-steps mode: push a parameter delta every N learns (0: off)")
      ->capture_default_str();
  app.add_option("--local-lr", s.local_lr, "Learning rate of local steps")->capture_default_str();
  app.add_option("--max-inflight-pushes", s.max_inflight_pushes,
                 "Pushes not yet acknowledged (learn waits beyond)")
      ->capture_default_str();
  app.add_option("--max-held-bytes", s.max_held_bytes,
                 "Accumulated pushes that failed are held and pushed again; learns are "
                 "refused while more than this many bytes are held")
      ->capture_default_str();
  app.add_option("--held-retry-ms", s.held_retry_ms, "How often held pushes are pushed again")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}))
      ->capture_default_str();
  app.add_flag("!--no-batch-pushes", s.batch_pushes,
               "Push each table in a message of its own (one per table and shard) "
               "instead of one push_batch per shard for all of a learn's tables");
}

// Per-request bounds (docs/reliability.md, "Worker memory per request").
void AddLimitFlags(CLI::App& app, Flags* f) {
  auto& l = f->service.limits;
  app.add_option("--max-request-bytes", l.max_request_bytes,
                 "Bytes of one request (all frames); larger ones get TOO_LARGE undecoded")
      ->check(CLI::Range(size_t{1} << 10, size_t{1} << 31))
      ->capture_default_str();
  app.add_option("--max-batch", l.max_batch, "Examples per infer or learn request")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--max-text-bytes", l.max_text_bytes, "Bytes of the text of one example")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--max-tokens", l.max_tokens,
                 "Words in all texts of one request (the text model looks up at most twice as "
                 "many embedding rows)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--max-features", l.max_features,
                 "Feature values of one example (mlp: at least --input-dim)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
}

void AddCacheFlags(CLI::App& app, Flags* f) {
  auto& c = f->service.cache;
  app.add_option("--dense-max-age-ms", c.dense.max_age_ms,
                 "Oldest dense parameter copy a call may read (-1: no bound)")
      ->capture_default_str();
  app.add_option("--dense-max-versions-behind", c.dense.max_versions_behind,
                 "Versions a dense copy may lag the newest seen (-1: no bound)")
      ->capture_default_str();
  app.add_option("--sparse-max-age-ms", c.sparse.max_age_ms, "Same for sparse rows")
      ->capture_default_str();
  app.add_option("--sparse-max-versions-behind", c.sparse.max_versions_behind,
                 "Same for sparse rows")
      ->capture_default_str();
  app.add_option("--freshness", f->freshness,
                 "Per-table bound PARAM=MAX_AGE_MS[:MAX_VERSIONS_BEHIND] (repeat; -1: none), "
                 "e.g. out.weight=50:2");
  app.add_flag("!--no-read-own-writes", f->service.read_own_writes,
               "Do not drop cached copies of what this worker pushed (faster learns; reads "
               "then see own pushes only within the freshness bounds)");
  app.add_option("--max-sparse-rows", c.max_sparse_rows, "Cached rows per sparse table (LRU)")
      ->capture_default_str();
  app.add_option("--refresh-interval-ms", c.refresh_interval_ms,
                 "Background refresh of hot dense tables (0: off)")
      ->capture_default_str();
  app.add_flag("!--no-notices", c.notices,
               "Do not watch the shards for table changes: copies are then fresh by the age "
               "and version bounds alone (with notices, a copy of a shard whose notices flow "
               "is fresh until that shard announces a change, whatever its age)");
  app.add_option("--notice-wait-ms", c.notice_wait_ms,
                 "A shard answers a quiet watch after this long; one silent for this plus "
                 "1 s counts as down, and the age bounds apply again")
      ->check(CLI::Range(int64_t{10}, int64_t{60000}))
      ->capture_default_str();
  app.add_option("--notice-grace-ms", c.notice_grace_ms,
                 "Reads may use a dense copy this long after a notice said it changed, while "
                 "the refresher pulls the new one (0: wait for the pull at once)")
      ->check(CLI::Range(int64_t{0}, int64_t{60000}))
      ->capture_default_str();
  auto& x = f->service.context;
  app.add_option("--context-max-sessions", x.max_sessions, "Sessions with context (LRU)")
      ->capture_default_str();
  app.add_option("--context-ttl-s", f->context_ttl_s,
                 "Idle seconds before a context is dropped (0: never)")
      ->check(onlineps::LifetimeS(0))
      ->capture_default_str();
  app.add_option("--context-max-items", x.max_items, "Text items kept per session")
      ->capture_default_str();
  app.add_option("--context-max-bytes", x.max_bytes, "Text bytes kept per session")
      ->capture_default_str();
}

void AddGroupFlags(CLI::App& app, Flags* f) {
  app.add_option("--group", f->group,
                 "Local group summing dense gradients before one push per round: none | "
                 "local (ZeroMQ, CPU) | nccl (GPUs; needs a CUDA+NCCL build)")
      ->check(CLI::IsMember({"none", "local", "nccl"}))
      ->capture_default_str();
  app.add_option("--group-rank", f->group_rank, "This worker's rank; rank 0 pushes")
      ->capture_default_str();
  app.add_option("--group-size", f->group_size, "Workers in the group")->capture_default_str();
  app.add_option("--group-endpoint", f->group_endpoint,
                 "local: rank 0 binds, others connect (e.g. ipc:///tmp/onlineps-group)");
  app.add_option("--group-curve-keys", f->group_curve_keys,
                 "local, with --curve-cert: file of the members' public keys, rank 0's first; "
                 "the leader admits only these, members expect the first. Default: every "
                 "member holds the same --curve-cert");
  app.add_option("--group-id-file", f->group_id_file,
                 "nccl: file through which rank 0 hands out the NCCL id (one per group)");
  app.add_option("--group-device", f->group_device, "nccl: CUDA device of this member")
      ->capture_default_str();
  app.add_option("--group-round-ms", f->service.group_round_ms, "Milliseconds between rounds")
      ->capture_default_str();
  app.add_option("--group-timeout-ms", f->group_timeout_ms,
                 "A round waiting longer for a member fails; the worker then pushes directly")
      ->check(onlineps::TimeoutMs())
      ->capture_default_str();
}

onlineps::StatusOr<worker::LocalGroupOptions> LocalGroupOptionsOf(const Flags& f) {
  worker::LocalGroupOptions o;
  o.rank = f.group_rank;
  o.size = f.group_size;
  o.endpoint = f.group_endpoint;
  o.timeout = std::chrono::milliseconds(f.group_timeout_ms);
  if (f.curve_options.enabled()) {
    o.curve.public_key = f.curve_options.public_key;
    o.curve.secret_key = f.curve_options.secret_key;
    std::vector<std::string> keys{f.curve_options.public_key};
    if (!f.group_curve_keys.empty()) {
      ONLINEPS_ASSIGN_OR_RETURN(keys, onlineps::ReadCurvePublicKeys(f.group_curve_keys));
    }
    o.curve.server_public_key = keys.front();
    o.curve.allowed_clients = keys;
  } else if (!f.group_curve_keys.empty()) {
    return onlineps::InvalidArgument("--group-curve-keys needs --curve-cert");
  }
  return o;
}

// The group flags alone, before the wait for the shards (which may take its whole
// timeout): a bad one is reported at once. Joining the group (MakeGroup) comes after.
Status CheckGroupFlags(const Flags& f) {
  if (f.group == "none") return Status::Ok();
  if (f.group == "local") {
    ONLINEPS_ASSIGN_OR_RETURN(worker::LocalGroupOptions o, LocalGroupOptionsOf(f));
    return worker::CheckLocalGroupOptions(o);
  }
#if ONLINEPS_HAVE_NCCL
  if (f.group_size < 1 || f.group_rank < 0 || f.group_rank >= f.group_size) {
    return onlineps::InvalidArgument("NCCL group: rank " + std::to_string(f.group_rank) +
                                     " out of range [0, " + std::to_string(f.group_size) + ")");
  }
  return Status::Ok();
#else
  return onlineps::Unavailable(
      "--group nccl: this build has no NCCL support (CUDA and NCCL were not found "
      "at configure time); use --group local");
#endif
}

onlineps::StatusOr<std::unique_ptr<worker::GroupReducer>> MakeGroup(const Flags& f) {
  if (f.group == "none") return std::unique_ptr<worker::GroupReducer>();
  if (f.group == "local") {
    ONLINEPS_ASSIGN_OR_RETURN(worker::LocalGroupOptions o, LocalGroupOptionsOf(f));
    return worker::NewLocalGroup(o);
  }
#if ONLINEPS_HAVE_NCCL
  worker::NcclGroupOptions o;
  o.rank = f.group_rank;
  o.size = f.group_size;
  o.device = f.group_device;
  o.id_file = f.group_id_file;
  o.timeout = std::chrono::milliseconds(f.group_timeout_ms);
  return worker::NewNcclGroup(o);
#else
  return onlineps::Unavailable(
      "--group nccl: this build has no NCCL support (CUDA and NCCL were not found "
      "at configure time); use --group local");
#endif
}

void AddServingFlags(CLI::App& app, Flags* f) {
  app.add_option("--ps", f->ps, "PS shard endpoints in shard order, comma separated")
      ->delimiter(',')
      ->required();
  app.add_option("--listen", f->server.listen, "Endpoint to serve the worker RPC on")
      ->capture_default_str();
  app.add_option("--handler-threads", f->server.handler_threads, "Threads running infer/learn")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--max-unsent-reply-bytes", f->server.max_unsent_reply_bytes,
                 "Replies a peer has not read, per peer, in bytes (as a count of the largest "
                 "reply); more are dropped")
      ->check(CLI::Range(size_t{1} << 20, size_t{1} << 40))
      ->capture_default_str();
  app.add_flag("!--no-infer-batching", f->service.batch_infer,
               "Run every infer call in its own forward pass (default: calls that arrive "
               "while the model is busy share the next pass)");
  app.add_option("--infer-passes", f->service.infer_passes,
                 "Infer forward passes run at once; calls are batched only while this many "
                 "run (0: one per CPU core, 1 on CUDA)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  app.add_option("--infer-batch-wait-us", f->infer_batch_wait_us,
                 "How long the first infer of a pass waits for more calls (0: none)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--ps-timeout-ms", f->ps_timeout_ms, "Deadline of each PS call")
      ->check(onlineps::TimeoutMs())
      ->capture_default_str();
  app.add_option("--sender-id", f->sender_id, "PS sender id (0: random per process)")
      ->capture_default_str();
  app.add_option("--admin-host", f->admin_host, "Address of the admin HTTP port")
      ->capture_default_str();
  app.add_option("--admin-port", f->admin_port,
                 "Admin HTTP port for /metrics, /healthz, /readyz (0: any free port, -1: off)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
}

Status ParseFreshness(const Flags& f, std::map<std::string, worker::FreshnessBound>* out) {
  for (const std::string& item : f.freshness) {
    const size_t eq = item.find('=');
    worker::FreshnessBound b;
    b.max_versions_behind = -1;
    char* end = nullptr;
    bool ok = eq != std::string::npos && eq > 0;
    if (ok) {
      b.max_age_ms = std::strtoll(item.c_str() + eq + 1, &end, 10);
      ok = end != item.c_str() + eq + 1;
      if (ok && *end == ':') {
        const char* v = end + 1;
        b.max_versions_behind = std::strtoll(v, &end, 10);
        ok = end != v;
      }
      ok = ok && *end == '\0';
    }
    if (!ok) {
      return onlineps::InvalidArgument("--freshness '" + item +
                                       "' is not PARAM=MAX_AGE_MS[:MAX_VERSIONS_BEHIND]");
    }
    std::string table = item.substr(0, eq);
    if (table.rfind(f.model.table_prefix, 0) != 0) table = f.model.table_prefix + table;
    (*out)[table] = b;
  }
  return Status::Ok();
}

Status Finish(Flags* f) {
  ONLINEPS_ASSIGN_OR_RETURN(f->curve_options, onlineps::LoadCurve(f->curve));
  f->server.transport.curve = f->curve_options;
  auto& t = f->service.table_template;
  t.optimizer_params["lr"] = f->lr;
  ONLINEPS_RETURN_IF_ERROR(
      onlineps::ParseNamedNumbers(f->opt_params, "--opt-param", &t.optimizer_params));
  ONLINEPS_RETURN_IF_ERROR(
      onlineps::ParseNamedNumbers(f->staleness_params, "--staleness-param", &t.staleness_params));
  t.bound_mode =
      f->bound_mode == "block" ? onlineps::ps::BoundMode::kBlock : onlineps::ps::BoundMode::kReject;
  f->service.reply_when =
      f->reply_when == "queued" ? worker::ReplyWhen::kQueued : worker::ReplyWhen::kApplied;
  f->service.context.ttl_ms = f->context_ttl_s * 1000;
  f->service.push_timeout = std::chrono::milliseconds(f->ps_timeout_ms);
  f->service.batch_wait = std::chrono::microseconds(f->infer_batch_wait_us);
  // Local steps move the weights by local_lr times the gradient, in floats: 0 would push
  // zero deltas (nothing learned), a negative rate climbs the loss, and one past the float
  // range pushes inf and nan into the shared tables.
  if (f->service.local_steps > 0 && !(f->service.local_lr > 0 && f->service.local_lr <= FLT_MAX)) {
    return onlineps::InvalidArgument(
        fmt::format("--local-lr must be > 0 and finite as a float, got {}", f->service.local_lr));
  }
  if (f->model.table_prefix.empty()) f->model.table_prefix = f->model.kind + "/";
  if (f->model.kind == "mlp" && f->model.input_dim > f->service.limits.max_features) {
    return onlineps::InvalidArgument("--input-dim " + std::to_string(f->model.input_dim) +
                                     " is above --max-features " +
                                     std::to_string(f->service.limits.max_features) +
                                     ": no request could be served; raise --max-features");
  }
  // What the PS would refuse at create_table, refused here: a typo in --optimizer or
  // --lr then fails at once, not after reaching every shard (up to 30 s).
  if (auto opt = onlineps::ps::CreateOptimizer(t.optimizer, t.optimizer_params); !opt.ok()) {
    return opt.status().WithContext("--optimizer " + t.optimizer + " (--lr, --opt-param)");
  }
  if (auto pol = onlineps::ps::CreateStalenessPolicy(t.staleness, t.staleness_params); !pol.ok()) {
    return pol.status().WithContext("--staleness-policy " + t.staleness + " (--staleness-param)");
  }
  ONLINEPS_RETURN_IF_ERROR(worker::CheckAccumulationRules(f->service, f->group != "none"));
  return ParseFreshness(*f, &f->service.cache.tables);
}

// The only thread that takes shutdown signals. Before the worker serves there is nothing
// to drain, so a signal then ends the process at once (a pod stopped while it waits for
// its shards must not wait for that wait); once serving, it hands the signal to main().
class SignalWatcher {
 public:
  SignalWatcher() {
    std::thread([this] {
      const int sig = onlineps::WaitForShutdownSignal();
      MutexLock lock(&mu_);
      if (!serving_) {
        spdlog::info("signal {} during start-up: exiting", sig);
        spdlog::shutdown();
        std::_Exit(0);
      }
      sig_ = sig;
      cv_.SignalAll();
    }).detach();
  }
  void Serving() {
    MutexLock lock(&mu_);
    serving_ = true;
  }
  int Wait() {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return sig_ != 0; });
    return sig_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool serving_ GUARDED_BY(mu_) = false;
  int sig_ GUARDED_BY(mu_) = 0;
};

// Pings every shard every 2 s on its own thread; /readyz reports the last result, so a
// probe never waits on a shard that is down.
class ShardProbe {
 public:
  explicit ShardProbe(onlineps::ps::PsClient* ps) {
    thread_.Start(
        std::chrono::seconds(2),
        [this, ps] {
          Status st = ps->WaitForShards(std::chrono::milliseconds(1000));
          MutexLock lock(&mu_);
          last_ = st;
        },
        /*tick_first=*/true);
  }
  Status last() {
    MutexLock lock(&mu_);
    return last_;
  }

 private:
  Mutex mu_;
  Status last_ GUARDED_BY(mu_) = onlineps::Unavailable("shards not probed yet");
  onlineps::PeriodicThread thread_;  // last: stopped before the members it writes go
};

int Run(Flags& f) {
  static SignalWatcher signals;  // lives as long as its detached thread
  onlineps::ps::PsClientOptions pso;
  pso.shards = f.ps;
  pso.sender_id = f.sender_id;
  pso.timeout = std::chrono::milliseconds(f.ps_timeout_ms);
  pso.transport.curve = f.curve_options;
  auto client = onlineps::ps::PsClient::Connect(pso);
  if (!client.ok()) {
    spdlog::error("PS client: {}", client.status().ToString());
    return 1;
  }
  // Probes are served from the start: /livez at once, /readyz once the worker serves and
  // reaches every shard.
  // Before admin: its ready check reads these until it stops.
  std::atomic<bool> serving{false};
  ShardProbe shards(client->get());
  auto admin = std::make_unique<onlineps::AdminServer>();
  admin->SetReadyCheck([&serving, &shards]() -> Status {
    if (!serving) {
      return onlineps::Unavailable("starting: connecting to the PS and loading the model");
    }
    return shards.last();
  });
  if (f.admin_port >= 0) {
    auto port = admin->Start(f.admin_host, f.admin_port);
    if (!port.ok()) {
      spdlog::error("admin port: {}", port.status().ToString());
      return 1;
    }
    spdlog::info("admin endpoints on http://{}:{}/metrics", f.admin_host, *port);
  }
  // The RPC port and the model first: a port taken, a bad --device, --model-file or
  // --trainable is reported at once, not after waiting for the shards.
  if (Status st = onlineps::ProbeEndpointBind(f.server.listen); !st.ok()) {
    spdlog::error("cannot serve on {} (--listen): {}", f.server.listen, st.ToString());
    return 1;
  }
  auto model = worker::CreateModel(f.model);
  if (!model.ok()) {
    spdlog::error("model: {}", model.status().ToString());
    return 2;
  }
  if (Status st = CheckGroupFlags(f); !st.ok()) {
    spdlog::error("--group {}: {}", f.group, st.ToString());
    return 2;
  }
  if (auto st = (*client)->WaitForShards(std::chrono::seconds(30)); !st.ok()) {
    spdlog::error("PS shards {} not reachable: {}", fmt::join(f.ps, ","), st.ToString());
    return 1;
  }
  auto group = MakeGroup(f);
  if (!group.ok()) {
    spdlog::error("--group {}: {}", f.group, group.status().ToString());
    return 2;
  }
  f.service.group = group->get();
  worker::WorkerService service(client->get(), model->get(), f.service);
  if (auto st = service.Start(); !st.ok()) {
    spdlog::error("worker: {}", st.ToString());
    return 1;
  }
  worker::WorkerServer server(&service, f.server);
  auto endpoint = server.Start();
  if (!endpoint.ok()) {
    spdlog::error("cannot serve on {} (--listen): {}", f.server.listen,
                  endpoint.status().ToString());
    return 1;
  }
  worker::WorkerMetrics metrics(&service, &server, admin->registry());
  metrics.Start();
  serving = true;  // tables exist and the RPC port is open
  spdlog::info("worker ({} model on {}, {} tables) serving on {}", f.model.kind, (*model)->device(),
               (*model)->params().size(), *endpoint);
  signals.Serving();
  std::cout << "LISTENING " << *endpoint << std::endl;
  const int sig = signals.Wait();
  spdlog::info("signal {}: draining", sig);
  server.Stop();
  Status st = service.Stop();  // pushes what is accumulated
  metrics.Stop();
  if (!st.ok()) spdlog::error("final flush: {}", st.ToString());
  admin->Stop();
  return st.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  onlineps::BlockShutdownSignals();
  Flags f;
  onlineps::LogOptions log;
  log.component = "worker";
  CLI::App app("onlineps worker: libtorch infer / learn against the parameter servers");
  AddServingFlags(app, &f);
  AddModelFlags(app, &f);
  AddLearnFlags(app, &f);
  AddLimitFlags(app, &f);
  AddCacheFlags(app, &f);
  AddGroupFlags(app, &f);
  onlineps::AddLoggingFlags(app, &log);
  onlineps::AddCurveFlags(app, &f.curve, /*server=*/true, /*client=*/true);
  auto parsed = onlineps::ParseFlags(app, argc, argv);
  if (!parsed.ok()) {
    std::cerr << "onlineps_worker: " << parsed.status().message() << "\n";
    return 2;
  }
  if (parsed->exit_now) return 0;
  if (auto st = onlineps::InitLogging(log); !st.ok()) {
    std::cerr << "onlineps_worker: " << st.message() << "\n";
    return 2;
  }
  if (auto st = Finish(&f); !st.ok()) {
    std::cerr << "onlineps_worker: " << st.message() << "\n";
    return 2;
  }
  spdlog::info("effective config:\n{}", onlineps::EffectiveConfig(app));
  return Run(f);
}
