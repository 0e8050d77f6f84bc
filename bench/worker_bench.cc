// worker_bench: worker RPC figures on tcp loopback, each printed beside an in-process
// upper bound measured in the same run: the same Model's Infer / Gradients (plus a local
// SGD apply for learn) called directly on parameter vectors this program owns, with the
// same batch sizes and thread counts. Shards, worker and clients share this process and
// its cores, as they would share a small host. With --torch (the default when Debian's
// python3-torch is installed), it also runs bench/torch_rpc_baseline.py in the same run:
// what a PyTorch user would build (torch.distributed.rpc, caller -> trainer -> one PS, the
// same mlp 64-32-10 b1) and prints our figures over its. Not a test.
//   worker_bench [--seconds S] [--threads N] [--shards N] [--quick] [--no-read-own-writes]
//                [--no-torch] [--no-infer-batching] [--handler-threads N] [--infer-passes N]
//                [--processes-only]
#include <prometheus/registry.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "ps/ps_client.h"
#include "ps/shard_server.h"
#include "tests/subprocess.h"
#include "worker/model.h"
#include "worker/msgpack_json.h"
#include "worker/worker_client.h"
#include "worker/worker_server.h"
#include "worker/worker_service.h"

namespace onlineps::worker {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr char kDigitsCsv[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr double kLr = 0.05;

struct Flags {
  double seconds = 2.0;  // per figure and side, after a warm-up
  int threads = 4;       // client threads for the throughput figures
  int shards = 1;
  bool read_own_writes = true;  // --no-read-own-writes: learn reads may miss own pushes
  bool torch = true;            // --no-torch: skip the torch.distributed.rpc baseline
  bool batch_infer = true;      // --no-infer-batching: one forward pass per infer call
  int handler_threads = WorkerServerOptions{}.handler_threads;  // --handler-threads
  int infer_passes = 0;  // --infer-passes (WorkerServiceOptions::infer_passes)
  // --processes-only: only learn b1 against worker and shard processes (and the torch
  // baseline beside it), for A/B runs of the learn path.
  bool processes_only = false;
};

struct Figure {
  double per_s = 0;  // calls per second, all threads together
  double p50_us = 0, p99_us = 0;
};

using Call = std::function<Status(int thread)>;

// Latencies of completed calls over `seconds` of wall time, plus failed calls.
struct Samples {
  std::vector<double> us;
  double seconds = 0;
  uint64_t errors = 0;
  std::string first_error;
};

// Calls `call` from `threads` threads for `seconds`, adding to `s`. A call that fails
// counts as an error, never as a completion.
void Sample(int threads, double seconds, const Call& call, Samples* s) {
  std::mutex mu;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<double> mine;
      uint64_t errors = 0;
      std::string first;
      while (Clock::now() < end) {
        const auto t0 = Clock::now();
        Status st = call(t);
        if (!st.ok()) {
          if (errors++ == 0) first = st.ToString();
          continue;
        }
        mine.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      std::lock_guard<std::mutex> lock(mu);
      s->us.insert(s->us.end(), mine.begin(), mine.end());
      if (s->errors == 0 && errors > 0) s->first_error = first;
      s->errors += errors;
    });
  }
  for (auto& t : pool) t.join();
  s->seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

Figure Summarize(Samples s, const std::string& what) {
  Figure f;
  if (s.errors > 0) {
    std::fprintf(stderr, "worker_bench: %s: %llu errors, first: %s\n", what.c_str(),
                 static_cast<unsigned long long>(s.errors), s.first_error.c_str());
  }
  if (s.us.empty()) return f;
  std::sort(s.us.begin(), s.us.end());
  f.per_s = static_cast<double>(s.us.size()) / s.seconds;
  f.p50_us = s.us[s.us.size() / 2];
  f.p99_us = s.us[std::min(s.us.size() - 1, s.us.size() * 99 / 100)];
  return f;
}

// A warm-up of a quarter of `seconds`, then `seconds` measured.
Figure Run(int threads, double seconds, const Call& call, const std::string& what) {
  Samples warm, s;
  Sample(threads, seconds / 4, call, &warm);
  Sample(threads, seconds, call, &s);
  return Summarize(std::move(s), what);
}

// Measures `a` and `b` for `seconds` each, alternating in slices after a warm-up of
// each, so load that drifts on a shared machine hits both sides alike.
std::pair<Figure, Figure> Paired(int threads, double seconds, const Call& a, const Call& b,
                                 const std::string& what) {
  constexpr int kRounds = 4;
  Samples warm, sa, sb;
  Sample(threads, seconds / 8, a, &warm);
  Sample(threads, seconds / 8, b, &warm);
  for (int r = 0; r < kRounds; ++r) {
    Sample(threads, seconds / kRounds, a, &sa);
    Sample(threads, seconds / kRounds, b, &sb);
  }
  return {Summarize(std::move(sa), what + " (worker)"),
          Summarize(std::move(sb), what + " (in-process)")};
}

// ---- data -------------------------------------------------------------------------

// sklearn digits scaled to [0, 1]; uniform noise of the same shape if the file is absent.
std::vector<uint8_t> FloatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Reads an idx file (gzip) from Debian's dataset-fashion-mnist; empty if absent.
std::string ReadGz(const std::string& path) {
  std::string bytes;
  if (!std::filesystem::exists(path)) return bytes;
  FILE* f = popen(("gzip -dc " + path).c_str(), "r");
  char buf[1 << 16];
  for (size_t n; f != nullptr && (n = std::fread(buf, 1, sizeof buf, f)) > 0;) bytes.append(buf, n);
  if (f != nullptr) pclose(f);
  return bytes;
}

// 1,024 Fashion-MNIST test images (784 pixels / 255) with labels; random if absent.
std::vector<Example> FashionExamples() {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  const std::string images = ReadGz(dir + "t10k-images-idx3-ubyte.gz");
  const std::string labels = ReadGz(dir + "t10k-labels-idx1-ubyte.gz");
  std::vector<Example> out;
  std::mt19937_64 rng(11);
  for (size_t i = 0; i < 1024; ++i) {
    Example e;
    const bool real = images.size() >= 16 + (i + 1) * 784 && labels.size() >= 8 + i + 1;
    for (size_t j = 0; j < 784; ++j) {
      e.features.push_back(real ? static_cast<uint8_t>(images[16 + i * 784 + j]) / 255.0f
                                : static_cast<float>(rng() % 256) / 255.0f);
    }
    e.label = real ? static_cast<uint8_t>(labels[8 + i]) : static_cast<int64_t>(rng() % 10);
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<Example> DigitExamples() {
  std::vector<Example> out;
  if (std::filesystem::exists(kDigitsCsv)) {
    FILE* f = popen((std::string("gzip -dc ") + kDigitsCsv).c_str(), "r");
    char line[2048];
    while (f != nullptr && std::fgets(line, sizeof line, f) != nullptr) {
      Example e;
      char* p = line;
      for (char* end = nullptr;; p = end + (*end == ',' ? 1 : 0)) {
        const double v = std::strtod(p, &end);
        if (end == p) break;
        e.features.push_back(static_cast<float>(v / 16.0));
      }
      if (e.features.size() != 65) continue;
      e.label = static_cast<int64_t>(e.features.back() * 16.0 + 0.5);
      e.features.pop_back();
      out.push_back(std::move(e));
    }
    if (f != nullptr) pclose(f);
  }
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(0, 1);
  while (out.size() < 1024) {
    Example e;
    for (int i = 0; i < 64; ++i) e.features.push_back(u(rng));
    e.label = static_cast<int64_t>(rng() % 10);
    out.push_back(std::move(e));
  }
  return out;
}

// Sentences of three topics: 3-5 topic words among 4-8 shared filler words.
std::vector<Example> TextExamples() {
  const std::vector<std::vector<std::string>> topics = {
      {"football", "goal", "referee", "league", "striker", "tennis", "racket", "match", "coach",
       "stadium", "season", "playoff", "basketball", "penalty", "marathon", "medal"},
      {"recipe", "oven", "garlic", "simmer", "saute", "flour", "butter", "whisk", "skillet",
       "basil", "roast", "bake", "dough", "pasta", "sauce", "onion"},
      {"software", "compiler", "server", "laptop", "kernel", "database", "python", "network",
       "router", "processor", "debugger", "cloud", "algorithm", "browser", "linux", "gpu"}};
  const std::vector<std::string> filler = {"the", "a",     "today", "we",    "really", "about",
                                           "new", "great", "after", "with",  "some",   "very",
                                           "our", "my",    "big",   "small", "still",  "good"};
  std::mt19937_64 rng(11);
  std::vector<Example> out;
  for (size_t i = 0; i < 2048; ++i) {
    const size_t t = i % topics.size();
    std::string s;
    for (size_t k = 3 + rng() % 3; k > 0; --k) s += topics[t][rng() % topics[t].size()] + " ";
    for (size_t k = 4 + rng() % 5; k > 0; --k) s += filler[rng() % filler.size()] + " ";
    Example e;
    e.text = s;
    e.label = static_cast<int64_t>(t);
    out.push_back(std::move(e));
  }
  return out;
}

// `count` batches of `size` consecutive examples (wrapping around the pool).
std::vector<std::vector<Example>> Batches(const std::vector<Example>& pool, size_t size,
                                          size_t count) {
  std::vector<std::vector<Example>> out(count);
  size_t next = 0;
  for (auto& b : out) {
    for (size_t i = 0; i < size; ++i) b.push_back(pool[next++ % pool.size()]);
  }
  return out;
}

json Body(const std::vector<Example>& batch, const std::vector<std::string>& labels, bool learn) {
  json examples = json::array();
  for (const Example& e : batch) {
    // Features travel as float32 binary: the fast form of the worker RPC.
    json j = e.text.empty() ? json{{"features", json::binary(FloatBytes(e.features))}}
                            : json{{"text", e.text}};
    if (learn) j["label"] = labels[static_cast<size_t>(e.label)];
    examples.push_back(std::move(j));
  }
  return {{"examples", examples}};
}

// ---- the in-process upper bound ---------------------------------------------------

// The model's parameters held in this process: dense vectors pulled once from the PS,
// sparse rows created on first touch. Learn calls read a private copy and apply plain
// SGD under a lock, as the PS does for the worker.
class LocalParams {
 public:
  LocalParams(Model* model, ps::PsClient* ps) : model_(model) {
    const auto& params = model_->params();
    dense_.resize(params.size());
    sparse_.resize(params.size());
    std::mt19937_64 rng(3);
    std::normal_distribution<float> n(0, 0.05f);
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].kind != ParamKind::kDense) continue;
      dense_[i].resize(params[i].size());
      for (float& x : dense_[i]) x = n(rng);
      if (ps->OpenTable(params[i].name).ok()) {
        static_cast<void>(ps->PullDense(params[i].name, dense_[i].data(), nullptr).Wait());
      }
    }
  }

  // A view for `batch` over copies of the current values (rows in SparseKeys order).
  struct Snapshot {
    std::vector<std::vector<float>> dense;
    std::vector<SparseRows> rows;
    ParamView view;
  };
  Status Read(const std::vector<Example>& batch, bool copy_dense, Snapshot* s) {
    ONLINEPS_ASSIGN_OR_RETURN(auto keys, model_->SparseKeys(batch, {}));
    const auto& params = model_->params();
    s->view.dense.assign(params.size(), nullptr);
    s->view.sparse.assign(params.size(), nullptr);
    s->rows.resize(params.size());
    s->dense.resize(params.size());
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].kind == ParamKind::kDense) {
        if (copy_dense) s->dense[i] = dense_[i];
        s->view.dense[i] = copy_dense ? s->dense[i].data() : dense_[i].data();
        continue;
      }
      const size_t dim = params[i].size();
      SparseRows& rows = s->rows[i];
      rows.keys = std::move(keys[i]);
      rows.values.resize(rows.keys.size() * dim);
      for (size_t r = 0; r < rows.keys.size(); ++r) {
        const std::vector<float>& row = RowOf(i, rows.keys[r], dim);
        std::copy(row.begin(), row.end(), rows.values.begin() + r * dim);
      }
      s->view.sparse[i] = &rows;
    }
    return Status::Ok();
  }

  void Apply(const GradOutput& g, float lr) {
    const auto& params = model_->params();
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].kind == ParamKind::kDense) {
        float* w = dense_[i].data();
        for (size_t j = 0; j < g.dense[i].size(); ++j) w[j] -= lr * g.dense[i][j];
        continue;
      }
      const size_t dim = params[i].size();
      for (size_t r = 0; r < g.sparse[i].keys.size(); ++r) {
        std::vector<float>& row = RowOf(i, g.sparse[i].keys[r], dim);
        for (size_t j = 0; j < dim; ++j) row[j] -= lr * g.sparse[i].values[r * dim + j];
      }
    }
  }

 private:
  // REQUIRES: mu_ held.
  std::vector<float>& RowOf(size_t param, uint64_t key, size_t dim) {
    auto [it, added] = sparse_[param].try_emplace(key);
    if (added) {
      std::mt19937_64 rng(key);
      std::normal_distribution<float> n(0, 0.1f);
      it->second.resize(dim);
      for (float& x : it->second) x = n(rng);
    }
    return it->second;
  }

  Model* const model_;
  std::mutex mu_;
  std::vector<std::vector<float>> dense_;  // guarded by mu_ while learn figures run
  std::vector<std::unordered_map<uint64_t, std::vector<float>>> sparse_;  // guarded by mu_
};

// ---- one model through the worker and in process ----------------------------------

struct Row {
  std::string figure;
  double worker = 0, local = 0;
  double target = 0;  // 0: informational (latency); else the ratio it must reach
  bool higher_better = true;
};

void PrintRows(const std::vector<Row>& rows) {
  std::printf("%-40s %12s %12s %7s  %s\n", "figure", "worker", "in-process", "ratio", "target");
  for (const Row& r : rows) {
    const double ratio = r.higher_better ? r.worker / r.local : r.local / r.worker;
    char target[32] = "-";
    if (r.target > 0) {
      std::snprintf(target, sizeof target, ">= %.2f %s", r.target,
                    ratio >= r.target ? "met" : "MISSED");
    }
    std::printf("%-40s %12.1f %12.1f %7.2f  %s\n", r.figure.c_str(), r.worker, r.local, ratio,
                target);
  }
}

class ModelBench {
 public:
  ModelBench(std::string name, Model* model, ps::PsClient* ps, WorkerClient* client,
             std::vector<Example> pool, const Flags& flags)
      : name_(std::move(name)),
        model_(model),
        client_(client),
        local_(model, ps),
        pool_(std::move(pool)),
        flags_(flags) {}

  // The msgpack body codec alone for one b32 infer request: the client encodes, the
  // worker decodes (MsgpackToJson; before it, nlohmann::json::from_msgpack, shown beside). Printed
  // to explain the b32 gap; no target.
  void PrintCodecFloor() {
    const std::vector<uint8_t> bytes =
        json::to_msgpack(Body(Batches(pool_, 32, 1)[0], model_->labels(), false));
    const json body = json::from_msgpack(bytes);
    const Figure encode = Run(
        1, flags_.seconds / 4,
        [&](int) { return json::to_msgpack(body).empty() ? Internal("empty") : Status::Ok(); },
        "encode");
    const Figure decode = Run(
        1, flags_.seconds / 4,
        [&](int) {
          auto v = MsgpackToJson(bytes.data(), bytes.size());
          return v.ok() && v->is_object() ? Status::Ok() : Internal("not a map");
        },
        "decode");
    const Figure nlohmann_decode = Run(
        1, flags_.seconds / 4,
        [&](int) {
          return json::from_msgpack(bytes).is_object() ? Status::Ok() : Internal("not a map");
        },
        "decode (nlohmann)");
    std::printf(
        "floor: %s b32 infer body (%zu bytes): msgpack encode p50 %.1f us, decode %.1f us "
        "(nlohmann::json::from_msgpack %.1f us)\n",
        name_.c_str(), bytes.size(), encode.p50_us, decode.p50_us, nlohmann_decode.p50_us);
  }

  std::vector<Row> RunAll() {
    PrintCodecFloor();
    std::vector<Row> rows;
    const double kInfer = 0.70, kLearn = 0.60;
    const int n = flags_.threads;
    const std::string thr = " (" + std::to_string(n) + " thr)";
    for (size_t b : {size_t{1}, size_t{32}}) {
      const std::string tag = name_ + " infer b" + std::to_string(b);
      auto [w, l] =
          Paired(n, flags_.seconds, WorkerCall(Op::kInfer, b, n), LocalInfer(b, n), tag + thr);
      rows.push_back({tag + " req/s" + thr, w.per_s, l.per_s, kInfer});
      std::tie(w, l) =
          Paired(1, flags_.seconds, WorkerCall(Op::kInfer, b, 1), LocalInfer(b, 1), tag);
      rows.push_back({tag + " p50 us (1 thr)", w.p50_us, l.p50_us, 0, false});
      rows.push_back({tag + " p99 us (1 thr)", w.p99_us, l.p99_us, 0, false});
    }
    for (size_t b : {size_t{1}, size_t{32}}) {
      const std::string tag = name_ + " learn b" + std::to_string(b);
      const auto [w, l] =
          Paired(n, flags_.seconds, WorkerCall(Op::kLearn, b, n), LocalLearn(b, n), tag + thr);
      rows.push_back({tag + " ex/s" + thr, w.per_s * b, l.per_s * b, kLearn});
    }
    return rows;
  }

  // Worker learn b1 alone for `seconds` with `threads` callers: calls/s and the process's
  // CPU per learn (worker, shards and this bench's callers: all share the process).
  std::pair<double, double> LearnCpu(int threads) {
    return LearnCpuWith(client_, threads, ProcessCpuSeconds);
  }
  // The same against another worker (`client`, e.g. an onlineps_worker process): calls/s
  // and the CPU of the processes `pids` (that worker and its shards) per learn, which is
  // how the torch baseline counts its trainer and PS processes.
  std::pair<double, double> LearnCpuOf(WorkerClient* client, int threads,
                                       const std::vector<pid_t>& pids) {
    return LearnCpuWith(client, threads, [&pids] {
      double s = 0;
      for (pid_t p : pids) s += onlineps::testing::CpuSeconds(p);
      return s;
    });
  }
  // Worker infer b1 alone for `seconds` with `threads` callers: calls/s.
  double InferRate(int threads) {
    return Run(threads, flags_.seconds, WorkerCall(Op::kInfer, 1, threads), "infer").per_s;
  }
  // The model in-process, `threads` callers each running batches of `batch`: examples/s
  // (= requests/s of one example each, served `batch` at a time).
  double LocalInferExamples(size_t batch, int threads) {
    return Run(threads, flags_.seconds, LocalInfer(batch, threads), "local infer").per_s *
           static_cast<double>(batch);
  }

  static double ProcessCpuSeconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
  }

 private:
  // learn b1 on `client` for `seconds` with `threads` callers: calls/s and the CPU seconds
  // `cpu` counts, per learn, in ms.
  std::pair<double, double> LearnCpuWith(WorkerClient* client, int threads,
                                         const std::function<double()>& cpu) {
    const double cpu0 = cpu();
    const Figure f =
        Run(threads, flags_.seconds, WorkerCall(Op::kLearn, 1, threads, client), "learn cpu");
    const double used = cpu() - cpu0;
    const double learns = f.per_s * flags_.seconds;
    return {f.per_s, learns > 0 ? used / learns * 1e3 : 0};
  }

  // Each caller cycles through 64 prepared batches; thread t starts at batch t.
  Call WorkerCall(Op op, size_t batch, int threads, WorkerClient* client = nullptr) {
    auto bodies = std::make_shared<std::vector<json>>();
    for (const auto& b : Batches(pool_, batch, 64)) {
      bodies->push_back(Body(b, model_->labels(), op == Op::kLearn));
    }
    auto next = std::make_shared<std::vector<size_t>>(threads);
    WorkerClient* to = client != nullptr ? client : client_;
    return [to, op, bodies, next, threads](int t) {
      const json& body = (*bodies)[((*next)[t]++ * threads + t) % bodies->size()];
      return to->Call(op, body).status();
    };
  }

  Call LocalInfer(size_t batch, int threads) {
    auto batches = std::make_shared<std::vector<std::vector<Example>>>(Batches(pool_, batch, 64));
    auto next = std::make_shared<std::vector<size_t>>(threads);
    return [this, batches, next, threads](int t) -> Status {
      const auto& b = (*batches)[((*next)[t]++ * threads + t) % batches->size()];
      LocalParams::Snapshot s;
      ONLINEPS_RETURN_IF_ERROR(local_.Read(b, /*copy_dense=*/false, &s));
      return model_->Infer(b, {}, s.view).status();
    };
  }

  Call LocalLearn(size_t batch, int threads) {
    auto batches = std::make_shared<std::vector<std::vector<Example>>>(Batches(pool_, batch, 64));
    auto next = std::make_shared<std::vector<size_t>>(threads);
    return [this, batches, next, threads](int t) -> Status {
      const auto& b = (*batches)[((*next)[t]++ * threads + t) % batches->size()];
      LocalParams::Snapshot s;
      ONLINEPS_RETURN_IF_ERROR(local_.Read(b, /*copy_dense=*/true, &s));
      ONLINEPS_ASSIGN_OR_RETURN(GradOutput g, model_->Gradients(b, {}, s.view));
      local_.Apply(g, static_cast<float>(kLr));
      return Status::Ok();
    };
  }

  const std::string name_;
  Model* const model_;
  WorkerClient* const client_;
  LocalParams local_;
  const std::vector<Example> pool_;
  const Flags flags_;
};

// What no model work costs: a worker RPC that touches neither model nor PS
// (context_get of an unknown session), and a PS round trip (pull of a 10-float table).
// They explain the gap between the worker and in-process columns; no target.
void PrintFloors(WorkerClient* client, ps::PsClient* ps, const Flags& flags) {
  const json body = {{"session", "bench-floor"}};
  auto rpc = [&](int) { return client->Call(Op::kContextGet, body).status(); };
  const Figure one = Run(1, flags.seconds, rpc, "rpc floor");
  const Figure many = Run(flags.threads, flags.seconds, rpc, "rpc floor");
  std::vector<float> out(10);
  const Figure pull = Run(
      1, flags.seconds,
      [&](int) { return ps->PullDense("bench_mlp/out.bias", out.data(), nullptr).Wait(); },
      "ps floor");
  std::vector<float> zeros(10, 0.0f);
  const Figure push = Run(
      1, flags.seconds,
      [&](int) { return ps->PushDense("bench_mlp/out.bias", zeros.data(), {}, nullptr).Wait(); },
      "ps push floor");
  std::printf(
      "floor: worker RPC without model or PS (context_get): p50 %.1f us, p99 %.1f us (1 thr), "
      "%.0f req/s (%d thr)\n"
      "floor: PS round trip (1 thr): pull 10 floats p50 %.1f us, p99 %.1f us; push 10 zeros "
      "p50 %.1f us, p99 %.1f us\n",
      one.p50_us, one.p99_us, many.per_s, flags.threads, pull.p50_us, pull.p99_us, push.p50_us,
      push.p99_us);
}

// The torch.distributed.rpc baseline (bench/torch_rpc_baseline.py, Debian python3-torch),
// measured now, beside this worker's infer and learn b1 at 1 and --threads callers.
void ProcessLearnCpu(ModelBench* bench, const Flags& flags, const json& torch);

void TorchComparison(ModelBench* bench, const Flags& flags) {
  const std::string cmd = "/usr/bin/python3 " ONLINEPS_SOURCE_DIR
                          "/bench/torch_rpc_baseline.py --json --seconds " +
                          std::to_string(flags.seconds) + " --callers 1," +
                          std::to_string(flags.threads) + " 2>/dev/null";
  std::FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; p && (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = p ? pclose(p) : -1;
  json t = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (rc != 0 || !t.is_object()) {
    std::printf(
        "torch baseline: not measured (%s exited %d; apt-get install python3-torch, or "
        "--no-torch)\n",
        cmd.c_str(), rc);
    return;
  }
  std::printf("%-44s %12s %12s %7s\n", "mlp 64-32-10 b1 vs torch.distributed.rpc", "onlineps",
              "torch rpc", "ratio");
  for (int c : {1, flags.threads}) {
    const std::string k = "_c" + std::to_string(c);
    const std::string callers = std::to_string(c) + " caller(s)";
    const double ti = t.value("infer_b1" + k + "_per_s", 0.0);
    const double tl = t.value("learn_b1" + k + "_per_s", 0.0);
    const double tcpu = t.value("cpu_ms_per_learn" + k, 0.0);
    const double infer = bench->InferRate(c);
    const auto [learn, cpu_ms] = bench->LearnCpu(c);
    std::printf("%-44s %12.1f %12.1f %7.2f\n", ("infer b1 calls/s, " + callers).c_str(), infer, ti,
                ti > 0 ? infer / ti : 0);
    std::printf("%-44s %12.1f %12.1f %7.2f\n", ("learn b1 calls/s, " + callers).c_str(), learn, tl,
                tl > 0 ? learn / tl : 0);
    std::printf("%-44s %12.3f %12.3f %7.2f\n", ("CPU ms per learn (*), " + callers).c_str(), cpu_ms,
                tcpu, cpu_ms > 0 ? tcpu / cpu_ms : 0);
  }
  std::printf(
      "(*) onlineps: the whole bench process (worker, shards and its own callers); torch: the "
      "trainer and PS processes; ratio = torch / onlineps\n");
  ProcessLearnCpu(bench, flags, t);
}

// learn b1 against an onlineps_ps and an onlineps_worker started as processes (mlp
// 64-32-10, default flags but --lr and --handler-threads), the callers here: calls/s and the
// CPU of the two processes per learn, counted as the torch baseline counts its trainer and
// PS processes (`torch`: that baseline's JSON).
void ProcessLearnCpu(ModelBench* bench, const Flags& flags, const json& torch) {
  using onlineps::testing::Subprocess;
  const std::string bin = ONLINEPS_BIN_DIR;
  Subprocess shard({bin + "/onlineps_ps", "--listen", "tcp://127.0.0.1:0", "--admin-port", "-1",
                    "--log-level", "warn"});
  const std::string ps = shard.WaitForLine("LISTENING ", std::chrono::seconds(30));
  std::unique_ptr<Subprocess> worker;
  std::string ep;
  if (!ps.empty()) {
    worker = std::make_unique<Subprocess>(onlineps::testing::WorkerArgv(
        bin, ps,
        {"--model", "mlp", "--input-dim", "64", "--hidden", "32", "--labels", "0,1,2,3,4,5,6,7,8,9",
         "--lr", std::to_string(kLr), "--handler-threads", std::to_string(flags.handler_threads)}));
    ep = worker->WaitForLine("LISTENING ", std::chrono::seconds(120));
  }
  WorkerClientOptions co;
  co.endpoint = ep;
  auto client = ep.empty() ? StatusOr<std::unique_ptr<WorkerClient>>(Unavailable("not started"))
                           : WorkerClient::Connect(co);
  if (!client.ok()) {
    std::printf("worker + shard processes: not measured (%s/onlineps_ps, onlineps_worker: %s)\n",
                bin.c_str(), client.status().ToString().c_str());
    return;
  }
  (void)bench->LearnCpuOf(client->get(), flags.threads, {});  // warm-up: tables, caches
  for (int c : {1, flags.threads}) {
    const std::string k = "_c" + std::to_string(c);
    const double tl = torch.value("learn_b1" + k + "_per_s", 0.0);
    const double tcpu = torch.value("cpu_ms_per_learn" + k, 0.0);
    const auto [rate, cpu_ms] = bench->LearnCpuOf(client->get(), c, {shard.pid(), worker->pid()});
    const std::string callers = std::to_string(c) + " caller(s)";
    std::printf("%-44s %12.1f %12.1f %7.2f\n", ("processes: learn b1 calls/s, " + callers).c_str(),
                rate, tl, tl > 0 ? rate / tl : 0);
    std::printf("%-44s %12.3f %12.3f %7.2f\n",
                ("processes: CPU ms per learn (**), " + callers).c_str(), cpu_ms, tcpu,
                cpu_ms > 0 ? tcpu / cpu_ms : 0);
  }
  std::printf(
      "(**) onlineps_worker and onlineps_ps started as processes, the callers in this bench: "
      "their CPU per learn, as torch's trainer and PS\n");
}

// Serves `options` through a WorkerService + WorkerServer on tcp loopback, then measures.
int BenchModel(const std::string& name, const ModelOptions& options, ps::PsClient* ps,
               std::vector<Example> pool, const Flags& flags, std::vector<Row>* rows) {
  auto model = CreateModel(options);
  if (!model.ok()) {
    std::fprintf(stderr, "worker_bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  WorkerServiceOptions so;
  so.table_template.optimizer_params["lr"] = kLr;
  so.read_own_writes = flags.read_own_writes;
  so.batch_infer = flags.batch_infer;
  so.infer_passes = flags.infer_passes;
  WorkerService service(ps, model->get(), so);
  WorkerServerOptions wso;
  wso.handler_threads = flags.handler_threads;
  WorkerServer server(&service, wso);
  Status st = service.Start();
  auto ep = st.ok() ? server.Start() : StatusOr<std::string>(st);
  if (!ep.ok()) {
    std::fprintf(stderr, "worker_bench: %s\n", ep.status().ToString().c_str());
    return 1;
  }
  WorkerClientOptions co;
  co.endpoint = *ep;
  auto client = WorkerClient::Connect(co);
  if (!client.ok()) return 1;
  ModelBench bench(name, model->get(), ps, client->get(), std::move(pool), flags);
  if (flags.processes_only) {
    if (flags.torch) {
      TorchComparison(&bench, flags);
    } else {
      ProcessLearnCpu(&bench, flags, json::object());
    }
    server.Stop();
    return service.Stop().ok() ? 0 : 1;
  }
  for (Row& r : bench.RunAll()) rows->push_back(std::move(r));
  {
    // Dynamic batching: infer b1 from --threads callers, beside the model in-process at the
    // batch size the batcher formed (mean calls per forward pass), same thread count.
    const WorkerStats s0 = service.stats();
    const double rate = bench.InferRate(flags.threads);
    const WorkerStats s1 = service.stats();
    const double per_pass =
        static_cast<double>(s1.infer_requests - s0.infer_requests) /
        static_cast<double>(std::max<uint64_t>(1, s1.infer_passes - s0.infer_passes));
    const auto b = static_cast<size_t>(std::max(1.0, std::round(per_pass)));
    char figure[96];
    std::snprintf(figure, sizeof figure, "%s infer b1 req/s (%d thr), %.2f per pass", name.c_str(),
                  flags.threads, per_pass);
    rows->push_back({figure, rate, bench.LocalInferExamples(b, flags.threads), 0.5});
  }
  if (options.kind == "mlp" && options.input_dim == 64 && flags.torch) {
    TorchComparison(&bench, flags);
  }
  const WorkerStats ws = service.stats();
  std::printf(
      "cache: %s: dense %llu hits, %llu pulls, %llu refresher pulls; sparse %llu hits, %llu "
      "misses, %llu pulls; %llu pushes, max tau %llu\n",
      name.c_str(), static_cast<unsigned long long>(ws.cache.dense_hits),
      static_cast<unsigned long long>(ws.cache.dense_pulls),
      static_cast<unsigned long long>(ws.cache.refresher_pulls),
      static_cast<unsigned long long>(ws.cache.sparse_hits),
      static_cast<unsigned long long>(ws.cache.sparse_misses),
      static_cast<unsigned long long>(ws.cache.sparse_pulls),
      static_cast<unsigned long long>(ws.pushes), static_cast<unsigned long long>(ws.max_tau));
  if (options.kind == "mlp") PrintFloors(client->get(), ps, flags);
  server.Stop();
  return service.Stop().ok() ? 0 : 1;
}

int Main(int argc, char** argv) {
  Flags flags;
  const char* usage =
      "usage: worker_bench [--seconds S] [--threads N] [--shards N] [--quick] "
      "[--no-read-own-writes] [--no-torch] [--no-infer-batching] [--handler-threads N]\n"
      "                    [--infer-passes N] [--processes-only]\n";
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::fputs(usage, stdout);
      return 0;
    }
    if (!std::strcmp(argv[i], "--quick")) {
      flags.seconds = 0.5;
    } else if (!std::strcmp(argv[i], "--no-read-own-writes")) {
      flags.read_own_writes = false;
    } else if (!std::strcmp(argv[i], "--no-torch")) {
      flags.torch = false;
    } else if (!std::strcmp(argv[i], "--processes-only")) {
      flags.processes_only = true;
    } else if (!std::strcmp(argv[i], "--no-infer-batching")) {
      flags.batch_infer = false;
    } else if (!std::strcmp(argv[i], "--infer-passes") && has_value) {
      flags.infer_passes = std::max(0, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--handler-threads") && has_value) {
      flags.handler_threads = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--seconds") && has_value) {
      flags.seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--threads") && has_value) {
      flags.threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--shards") && has_value) {
      flags.shards = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "worker_bench: unknown or incomplete argument '%s'\n%s", argv[i], usage);
      return 2;
    }
  }
  if (flags.seconds <= 0 || flags.threads < 1 || flags.shards < 1) {
    std::fprintf(stderr, "worker_bench: --seconds, --threads and --shards must be positive\n%s",
                 usage);
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  std::vector<std::unique_ptr<ps::ShardServer>> shards;
  ps::PsClientOptions po;
  for (int i = 0; i < flags.shards; ++i) {
    ps::ShardServerOptions o;
    o.shard = static_cast<uint32_t>(i);
    o.num_shards = static_cast<uint32_t>(flags.shards);
    o.listen = "tcp://127.0.0.1:0";
    shards.push_back(
        std::make_unique<ps::ShardServer>(o, std::make_shared<prometheus::Registry>()));
    auto ep = shards.back()->Start();
    if (!ep.ok()) return 1;
    po.shards.push_back(*ep);
  }
  auto ps = ps::PsClient::Connect(po);
  if (!ps.ok()) return 1;
  std::printf(
      "worker_bench: %d shard(s), worker with %d handler threads, tcp loopback, %u cores;\n"
      "throughput with %d client threads, latency with 1; %.1f s per figure and side\n",
      flags.shards, flags.handler_threads, std::thread::hardware_concurrency(), flags.threads,
      flags.seconds);
  std::vector<Row> rows;
  ModelOptions mlp;
  mlp.kind = "mlp";
  mlp.input_dim = 64;
  mlp.hidden = {32};
  mlp.labels = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  mlp.table_prefix = "bench_mlp/";
  int rc = BenchModel("mlp 64-32-10", mlp, ps->get(), DigitExamples(), flags, &rows);
  if (flags.processes_only) {
    for (auto& s : shards) s->Stop();
    return rc;
  }
  ModelOptions fashion = mlp;
  fashion.input_dim = 784;
  fashion.hidden = {128};
  fashion.table_prefix = "bench_fashion/";
  rc |= BenchModel("mlp 784-128-10", fashion, ps->get(), FashionExamples(), flags, &rows);
  ModelOptions text;
  text.kind = "text";
  text.labels = {"sports", "cooking", "tech"};
  text.table_prefix = "bench_text/";
  rc |= BenchModel("text d32", text, ps->get(), TextExamples(), flags, &rows);
  PrintRows(rows);
  for (auto& s : shards) s->Stop();
  return rc;
}

}  // namespace
}  // namespace onlineps::worker

int main(int argc, char** argv) { return onlineps::worker::Main(argc, argv); }
