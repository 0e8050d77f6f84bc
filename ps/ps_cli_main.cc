// onlineps_ps_cli: talk to a running PS cluster.
//   demo          train a linear-regression model with M asynchronous workers and print
//                 loss, versions and staleness as pushes are applied
//   push-pattern  push a deterministic integer gradient pattern (used by the
//                 multi-process test; the expected parameters are computable exactly)
//   pull          print a dense table or sparse rows
//   checkpoint    ask every shard to write a checkpoint now
#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "common/config.h"
#include "common/curve.h"
#include "common/flags.h"
#include "common/logging.h"
#include "ps/ps_client.h"

namespace onlineps::ps {
namespace {

struct Common {
  std::vector<std::string> shards;
  int timeout_ms = 5000;
  CurveOptions curve;
};

StatusOr<std::unique_ptr<PsClient>> Connect(const Common& c) {
  PsClientOptions o;
  o.shards = c.shards;
  o.timeout = std::chrono::milliseconds(c.timeout_ms);
  o.transport.curve = c.curve;
  auto client = PsClient::Connect(o);
  if (!client.ok()) return client.status();
  ONLINEPS_RETURN_IF_ERROR((*client)->WaitForShards(std::chrono::milliseconds(c.timeout_ms)));
  return client;
}

// Gradient element i of push `step` by `worker`: small integers, exact in float.
float PatternValue(int worker, int step, uint64_t i) {
  return static_cast<float>(static_cast<int>((worker * 7 + step * 3 + i) % 5) - 2);
}

struct PatternArgs {
  int worker = 0, pushes = 100;
  uint64_t dense_size = 1000;
  uint64_t sparse_keys = 64;
  uint32_t dim = 4;
};

Status RunPattern(const Common& c, const PatternArgs& a) {
  ONLINEPS_ASSIGN_OR_RETURN(auto client, Connect(c));
  TableSpec dense;
  dense.name = "pattern_dense";
  dense.shape = {a.dense_size};
  dense.optimizer_params = {{"lr", 1.0}};
  ONLINEPS_RETURN_IF_ERROR(client->CreateTable(dense));
  TableSpec sparse;
  sparse.name = "pattern_sparse";
  sparse.kind = TableKind::kSparse;
  sparse.dim = a.dim;
  sparse.optimizer_params = {{"lr", 1.0}};
  ONLINEPS_RETURN_IF_ERROR(client->CreateTable(sparse));
  std::vector<float> g(a.dense_size), sg(a.sparse_keys * a.dim);
  std::vector<uint64_t> keys(a.sparse_keys);
  VersionVector base;
  for (int step = 0; step < a.pushes; ++step) {
    for (uint64_t i = 0; i < a.dense_size; ++i) g[i] = PatternValue(a.worker, step, i);
    for (uint64_t k = 0; k < a.sparse_keys; ++k) {
      keys[k] = k * 0x9e3779b97f4a7c15ULL;  // spread over the whole key space
      for (uint32_t j = 0; j < a.dim; ++j) sg[k * a.dim + j] = PatternValue(a.worker, step, k + j);
    }
    Ticket t1 = client->PushDense("pattern_dense", g.data(), base, nullptr);
    Ticket t2 =
        client->PushSparse("pattern_sparse", keys.data(), keys.size(), sg.data(), base, nullptr);
    ONLINEPS_RETURN_IF_ERROR(t1.Wait());
    ONLINEPS_RETURN_IF_ERROR(t2.Wait());
  }
  std::cout << "worker " << a.worker << " pushed " << a.pushes << " dense and sparse gradients\n";
  return Status::Ok();
}

struct DemoArgs {
  int workers = 4, steps = 300, features = 64, batch = 16;
  double lr = 0.05;
  std::string staleness = "lr_over_tau";
};

// Asynchronous SGD on least squares y = X w*: each worker pulls, computes a minibatch
// gradient at the pulled weights, and pushes it with that base version.
Status RunDemo(const Common& c, const DemoArgs& a) {
  ONLINEPS_ASSIGN_OR_RETURN(auto client, Connect(c));
  TableSpec spec;
  spec.name = "demo_linear";
  spec.shape = {static_cast<uint64_t>(a.features)};
  spec.optimizer_params = {{"lr", a.lr}};
  spec.staleness = a.staleness;
  ONLINEPS_RETURN_IF_ERROR(client->CreateTable(spec));
  std::vector<float> w_star(a.features);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& x : w_star) x = normal(rng);
  std::atomic<int> done{0};
  std::atomic<bool> failed{false}, stop{false};
  std::atomic<uint64_t> tau_sum{0}, tau_max{0};
  std::vector<std::thread> threads;
  std::vector<Status> errors(a.workers);
  for (int m = 0; m < a.workers; ++m) {
    threads.emplace_back([&, m] {
      std::mt19937 r(100 + m);
      std::normal_distribution<float> n01;
      std::vector<float> w(a.features), g(a.features), x(a.features);
      VersionVector v;
      for (int step = 0; step < a.steps && !stop.load(); ++step) {
        if (auto st = client->PullDense(spec.name, w.data(), &v).Wait(); !st.ok()) {
          errors[m] = st;
          failed = true;
          return;
        }
        std::fill(g.begin(), g.end(), 0.0f);
        for (int b = 0; b < a.batch; ++b) {
          float err = 0;
          for (int i = 0; i < a.features; ++i) {
            x[i] = n01(r);
            err += x[i] * (w[i] - w_star[i]);
          }
          for (int i = 0; i < a.features; ++i) g[i] += err * x[i] / a.batch;
        }
        PushReply reply;
        if (auto st = client->PushDense(spec.name, g.data(), v, &reply).Wait(); !st.ok()) {
          errors[m] = st;
          failed = true;
          return;
        }
        tau_sum += reply.max_tau;
        uint64_t prev = tau_max.load();
        while (reply.max_tau > prev && !tau_max.compare_exchange_weak(prev, reply.max_tau)) {
        }
        done++;
      }
    });
  }
  std::vector<float> w(a.features);
  VersionVector v;
  const int total = a.workers * a.steps;
  // The monitor's own failure ends the run too, once the workers have stopped (returning
  // with their threads still running aborted the process).
  Status monitor;
  for (int last = -1; last < total;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    int now = done.load();
    if (now == last && failed.load()) break;
    last = now;
    if (Status st = client->PullDense(spec.name, w.data(), &v).Wait(); !st.ok()) {
      monitor = st;
      break;
    }
    double dist = 0;
    for (int i = 0; i < a.features; ++i) dist += (w[i] - w_star[i]) * (w[i] - w_star[i]);
    uint64_t version = 0;
    for (uint64_t x : v) version += x;
    std::cout << "pushes applied " << now << "/" << total << "  version(sum over shards) "
              << version << "  ||w - w*||^2 " << dist << "  mean staleness "
              << (now ? static_cast<double>(tau_sum) / now : 0.0) << "  max " << tau_max
              << std::endl;
    if (now == total) break;
  }
  stop = true;
  for (auto& t : threads) t.join();
  for (const Status& e : errors) ONLINEPS_RETURN_IF_ERROR(e);
  return monitor;
}

Status RunPull(const Common& c, const std::string& table, const std::vector<uint64_t>& keys) {
  ONLINEPS_ASSIGN_OR_RETURN(auto client, Connect(c));
  ONLINEPS_ASSIGN_OR_RETURN(TableSpec spec, client->OpenTable(table));
  std::vector<float> out(spec.kind == TableKind::kDense ? spec.size() : keys.size() * spec.dim);
  VersionVector v;
  Ticket t = spec.kind == TableKind::kDense
                 ? client->PullDense(table, out.data(), &v)
                 : client->PullSparse(table, keys.data(), keys.size(), out.data(), &v);
  ONLINEPS_RETURN_IF_ERROR(t.Wait());
  std::cout << "versions";
  for (uint64_t x : v) std::cout << " " << x;
  std::cout << "\nvalues";
  for (float x : out) std::cout << " " << x;
  std::cout << "\n";
  return Status::Ok();
}

// The spec once (every shard holds the same), then each shard's figures.
Status RunInfo(const Common& c, const std::string& table) {
  ONLINEPS_ASSIGN_OR_RETURN(auto client, Connect(c));
  ONLINEPS_ASSIGN_OR_RETURN(auto shards, client->TableInfo(table));
  std::cout << "table " << table << "\n";
  for (const auto& [k, v] : shards.at(0)) {
    if (k.rfind("stat.", 0) != 0) std::cout << "  " << k << " = " << v << "\n";
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    std::cout << "shard " << s;
    for (const auto& [k, v] : shards[s]) {
      if (k.rfind("stat.", 0) == 0) std::cout << " " << k.substr(5) << "=" << v;
    }
    std::cout << "\n";
  }
  return Status::Ok();
}

}  // namespace
}  // namespace onlineps::ps

int main(int argc, char** argv) {
  using namespace onlineps::ps;
  Common common;
  PatternArgs pattern;
  DemoArgs demo;
  std::string table;
  std::vector<uint64_t> keys;
  onlineps::LogOptions log;
  log.component = "ps-cli";
  CLI::App app("onlineps_ps_cli: talk to a running onlineps PS cluster");
  app.require_subcommand(1);
  app.add_option("--shards", common.shards,
                 "Shard endpoints in shard order (comma separated; all but curve-keygen)")
      ->delimiter(',');
  app.add_option("--timeout-ms", common.timeout_ms, "Per-call timeout")
      ->check(onlineps::TimeoutMs())
      ->capture_default_str();
  onlineps::AddLoggingFlags(app, &log);
  onlineps::CurveFlags curve;
  onlineps::AddCurveFlags(app, &curve, /*server=*/false, /*client=*/true);
  std::string keygen_path;
  auto* keygen = app.add_subcommand(
      "curve-keygen", "Write a new CURVE certificate FILE (mode 0600) and its public key FILE.pub");
  keygen->add_option("file", keygen_path, "Certificate path")->required();
  auto* demo_cmd = app.add_subcommand("demo", "Asynchronous linear-regression workload");
  demo_cmd->add_option("--workers", demo.workers, "Worker threads")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  demo_cmd->add_option("--steps", demo.steps, "Pushes per worker")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  demo_cmd->add_option("--lr", demo.lr, "SGD learning rate")->capture_default_str();
  demo_cmd->add_option("--staleness", demo.staleness, "Staleness policy")->capture_default_str();
  auto* pat = app.add_subcommand("push-pattern", "Push a deterministic gradient pattern");
  pat->add_option("--worker", pattern.worker, "Worker number (changes the pattern)");
  pat->add_option("--pushes", pattern.pushes, "Pushes to each table")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  pat->add_option("--dense-size", pattern.dense_size, "Dense elements")->capture_default_str();
  pat->add_option("--sparse-keys", pattern.sparse_keys, "Sparse keys")->capture_default_str();
  auto* pull = app.add_subcommand("pull", "Print a table (dense) or rows (sparse)");
  pull->add_option("--table", table, "Table name")->required();
  pull->add_option("--keys", keys, "Sparse row ids")->delimiter(',');
  auto* info =
      app.add_subcommand("info", "Print a table's spec and each shard's row and memory figures");
  info->add_option("--table", table, "Table name")->required();
  auto* ckpt = app.add_subcommand("checkpoint", "Checkpoint every shard now");
  auto parsed = onlineps::ParseFlags(app, argc, argv);
  if (!parsed.ok()) {
    std::cerr << "onlineps_ps_cli: " << parsed.status().message() << "\n";
    return 2;
  }
  if (parsed->exit_now) return 0;
  if (auto st = onlineps::InitLogging(log); !st.ok()) {
    std::cerr << "onlineps_ps_cli: " << st.message() << "\n";
    return 2;
  }
  if (keygen->parsed()) {
    auto keys = onlineps::NewCurveKeyPair();
    onlineps::Status st = keys.ok() ? onlineps::WriteCurveCert(keygen_path, *keys) : keys.status();
    if (!st.ok()) {
      std::cerr << "onlineps_ps_cli: " << st.ToString() << "\n";
      return 1;
    }
    std::cout << "wrote " << keygen_path << " (secret) and " << keygen_path << ".pub; public key "
              << keys->public_key << "\n";
    return 0;
  }
  if (common.shards.empty()) {
    std::cerr << "onlineps_ps_cli: --shards is required\n";
    return 2;
  }
  auto loaded = onlineps::LoadCurve(curve);
  if (!loaded.ok()) {
    std::cerr << "onlineps_ps_cli: " << loaded.status().message() << "\n";
    return 2;
  }
  common.curve = *loaded;
  onlineps::Status st;
  if (demo_cmd->parsed()) st = RunDemo(common, demo);
  if (pat->parsed()) st = RunPattern(common, pattern);
  if (pull->parsed()) st = RunPull(common, table, keys);
  if (info->parsed()) st = RunInfo(common, table);
  if (ckpt->parsed()) {
    auto client = Connect(common);
    st = client.ok() ? (*client)->Checkpoint() : client.status();
    if (st.ok()) std::cout << "checkpoint written on " << common.shards.size() << " shard(s)\n";
  }
  if (!st.ok()) {
    std::cerr << "onlineps_ps_cli: " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}
