// Real processes on loopback: onlineps_ps shards and onlineps_worker processes, driven
// over the worker RPC the way a serving client drives them. Each case learns a real
// task through `learn` and checks held-out accuracy through `infer`, or kills a worker
// and checks that no acknowledged update is lost. Every process is stopped with SIGTERM
// and must exit 0 (workers first: their final flush needs the shards).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "ps/ps_client.h"
#include "tests/subprocess.h"
#include "worker/worker_client.h"

namespace onlineps::worker {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using testing::Subprocess;

constexpr milliseconds kStartTimeout{30000};
constexpr milliseconds kStopTimeout{15000};
constexpr char kDigitsCsv[] = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr uint64_t kSeed = 20261202;

// Learning cases run with the default freshness: a worker drops its cached copy of
// what it pushed once the push is acknowledged (read-your-writes), so its next learn
// reads its own update and measured staleness stays small (tau <= ~2 with two workers).

// Shards and workers of one test. The Subprocess destructors SIGKILL whatever a failed
// test leaves running.
class Cluster {
 public:
  // Starts `n` shard processes; false if one did not report its endpoint.
  bool StartShards(int n) {
    for (int i = 0; i < n; ++i) {
      auto p = std::make_unique<Subprocess>(std::vector<std::string>{
          ONLINEPS_BIN_DIR "/onlineps_ps", "--shard-index", std::to_string(i), "--num-shards",
          std::to_string(n), "--listen", "tcp://127.0.0.1:0", "--admin-port", "-1", "--log-level",
          "warn"});
      const std::string ep = p->WaitForLine("LISTENING ", kStartTimeout);
      if (ep.empty()) return false;
      shards_.push_back(std::move(p));
      shard_endpoints_.push_back(ep);
    }
    return true;
  }

  // Starts a worker against every shard with `flags` added; returns its endpoint, or ""
  // if it did not start.
  std::string StartWorker(const std::vector<std::string>& flags) {
    std::string ps;
    for (const std::string& ep : shard_endpoints_) ps += (ps.empty() ? "" : ",") + ep;
    auto p = std::make_unique<Subprocess>(testing::WorkerArgv(ONLINEPS_BIN_DIR, ps, flags));
    const std::string ep = p->WaitForLine("LISTENING ", kStartTimeout);
    workers_.push_back(std::move(p));
    return ep;
  }

  // SIGKILLs worker `i` (in start order).
  void KillWorker(size_t i) {
    EXPECT_EQ(workers_[i]->Stop(SIGKILL, kStopTimeout), 128 + SIGKILL);
    workers_[i].reset();
  }

  // SIGTERMs every worker, then every shard; each must drain and exit 0.
  void StopAll() {
    for (auto& w : workers_) {
      if (w) {
        EXPECT_EQ(w->Stop(SIGTERM, kStopTimeout), 0) << "worker did not exit cleanly";
      }
    }
    for (auto& s : shards_) EXPECT_EQ(s->Stop(SIGTERM, kStopTimeout), 0) << "shard exit";
    workers_.clear();
    shards_.clear();
  }

  const std::vector<std::string>& shard_endpoints() const { return shard_endpoints_; }

 private:
  std::vector<std::unique_ptr<Subprocess>> shards_, workers_;
  std::vector<std::string> shard_endpoints_;
};

std::unique_ptr<WorkerClient> ConnectWorker(const std::string& endpoint,
                                            milliseconds timeout = milliseconds(10000)) {
  WorkerClientOptions o;
  o.endpoint = endpoint;
  o.timeout = timeout;
  auto c = WorkerClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Examples as the RPC takes them: `inputs[i]` is {"features": ...} or {"text": ...};
// `labels[i]` is the class index, `wire_labels[i]` what a learn request sends for it.
struct Dataset {
  std::vector<json> inputs;
  std::vector<int64_t> labels;
  std::vector<json> wire_labels;
  size_t size() const { return inputs.size(); }
};

// A deterministic Fisher-Yates shuffle (std::shuffle's output differs across libraries).
std::vector<size_t> Shuffled(size_t n, uint64_t seed) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::mt19937_64 rng(seed);
  for (size_t i = n; i > 1; --i) std::swap(idx[i - 1], idx[rng() % i]);
  return idx;
}

std::vector<size_t> Range(const std::vector<size_t>& v, size_t begin, size_t end) {
  return std::vector<size_t>(v.begin() + begin, v.begin() + end);
}

// sklearn's digits: 8x8 pixels in 0..16 (scaled to [0, 1]) then the label 0..9.
bool LoadDigits(Dataset* out) {
  FILE* f = popen((std::string("gzip -dc ") + kDigitsCsv).c_str(), "r");
  if (f == nullptr) return false;
  char line[2048];
  bool ok = true;
  while (ok && std::fgets(line, sizeof line, f) != nullptr) {
    std::vector<double> row;
    char* p = line;
    for (char* end = nullptr;; p = end + (*end == ',' ? 1 : 0)) {
      const double v = std::strtod(p, &end);
      if (end == p) break;
      row.push_back(v);
    }
    ok = row.size() == 65;
    if (!ok) break;
    std::vector<float> pixels;
    for (int i = 0; i < 64; ++i) pixels.push_back(static_cast<float>(row[i] / 16.0));
    out->inputs.push_back({{"features", pixels}});
    out->labels.push_back(static_cast<int64_t>(row[64]));
    out->wire_labels.push_back(static_cast<int64_t>(row[64]));
  }
  return pclose(f) == 0 && ok && out->size() == 1797;
}

constexpr size_t kNumTopics = 3, kWordsPerTopic = 25;
constexpr const char* kTopics[kNumTopics] = {"sports", "cooking", "tech"};
constexpr const char* kTopicWords[kNumTopics][kWordsPerTopic] = {
    {"football", "goal",     "referee", "league", "striker",  "tennis",     "racket",
     "match",    "coach",    "stadium", "season", "playoff",  "basketball", "dribble",
     "penalty",  "marathon", "sprint",  "medal",  "olympics", "tournament", "keeper",
     "offside",  "umpire",   "inning",  "pitcher"},
    {"recipe",   "oven",    "garlic",   "simmer", "saute", "flour", "butter",    "whisk", "skillet",
     "oregano",  "basil",   "roast",    "bake",   "dough", "pasta", "sauce",     "onion", "braise",
     "marinade", "spatula", "saucepan", "pepper", "knead", "broth", "caramelize"},
    {"software",  "compiler", "server",     "laptop",   "kernel",     "database", "python",
     "network",   "router",   "processor",  "debugger", "cloud",      "startup",  "algorithm",
     "keyboard",  "browser",  "encryption", "firmware", "smartphone", "gpu",      "silicon",
     "bandwidth", "latency",  "linux",      "protocol"}};
constexpr const char* kFiller[] = {
    "the",   "a",         "today",   "we",     "really", "about", "new",  "great", "after", "with",
    "some",  "very",      "this",    "that",   "our",    "my",    "big",  "small", "quite", "still",
    "again", "yesterday", "friends", "people", "best",   "first", "last", "time",  "good",  "and"};

// One sentence of `topic`: 3-5 topic words, 4-8 shared filler words and, one time in
// four, a distractor word of another topic, in random order.
std::string Sentence(size_t topic, std::mt19937_64& rng) {
  std::vector<std::string> words;
  for (size_t k = 3 + rng() % 3; k > 0; --k) {
    words.push_back(kTopicWords[topic][rng() % kWordsPerTopic]);
  }
  for (size_t k = 4 + rng() % 5; k > 0; --k) {
    words.push_back(kFiller[rng() % std::size(kFiller)]);
  }
  if (rng() % 4 == 0) {
    const size_t other = (topic + 1 + rng() % 2) % kNumTopics;
    words.push_back(kTopicWords[other][rng() % kWordsPerTopic]);
  }
  for (size_t i = words.size(); i > 1; --i) std::swap(words[i - 1], words[rng() % i]);
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

// `n` distinct sentences, topics in rotation; labels go on the wire by name. The first
// `train` of them and the rest share no sentence.
Dataset TopicSentences(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<std::string> seen;
  Dataset d;
  while (d.size() < n) {
    const size_t topic = d.size() % kNumTopics;
    std::string s = Sentence(topic, rng);
    if (!seen.insert(s).second) continue;
    d.inputs.push_back({{"text", s}});
    d.labels.push_back(static_cast<int64_t>(topic));
    d.wire_labels.push_back(std::string(kTopics[topic]));
  }
  return d;
}

// What the learn replies of one client said.
struct LearnLog {
  std::vector<double> losses;  // per reply
  size_t replies = 0, applied = 0, dense_pushed = 0, tau_positive = 0, errors = 0;
  uint64_t max_tau = 0;
  std::string first_error;
};

void Record(const StatusOr<json>& r, LearnLog* log) {
  if (!r.ok()) {
    if (log->errors++ == 0) log->first_error = r.status().ToString();
    return;
  }
  const json& b = *r;
  log->replies++;
  log->losses.push_back(b.at("loss").get<double>());
  if (b.at("outcome") == "applied") log->applied++;
  if (b.at("dense_pushed").get<bool>()) log->dense_pushed++;
  const auto tau = b.at("tau").get<uint64_t>();
  if (tau > 0) log->tau_positive++;
  log->max_tau = std::max(log->max_tau, tau);
}

json LearnBody(const Dataset& d, const std::vector<size_t>& idx, size_t begin, size_t end) {
  json examples = json::array();
  for (size_t i = begin; i < end; ++i) {
    json e = d.inputs[idx[i]];
    e["label"] = d.wire_labels[idx[i]];
    examples.push_back(std::move(e));
  }
  return {{"examples", examples}};
}

// Learns `idx` in mini-batches of `batch`, reshuffled every epoch.
void Train(WorkerClient* c, const Dataset& d, std::vector<size_t> idx, int epochs, size_t batch,
           uint64_t seed, LearnLog* log) {
  for (int e = 0; e < epochs; ++e) {
    const std::vector<size_t> order = Shuffled(idx.size(), seed + static_cast<uint64_t>(e));
    std::vector<size_t> epoch(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) epoch[i] = idx[order[i]];
    for (size_t b = 0; b < epoch.size(); b += batch) {
      Record(c->Call(Op::kLearn, LearnBody(d, epoch, b, std::min(b + batch, epoch.size()))), log);
    }
  }
}

// Fraction of `idx` that infer labels correctly; -1 if a call fails.
double Accuracy(WorkerClient* c, const Dataset& d, const std::vector<size_t>& idx) {
  constexpr size_t kBatch = 64;
  size_t correct = 0;
  for (size_t b = 0; b < idx.size(); b += kBatch) {
    json examples = json::array();
    const size_t end = std::min(b + kBatch, idx.size());
    for (size_t i = b; i < end; ++i) examples.push_back(d.inputs[idx[i]]);
    auto r = c->Call(Op::kInfer, {{"examples", examples}});
    if (!r.ok()) {
      ADD_FAILURE() << "infer: " << r.status().ToString();
      return -1;
    }
    const json& preds = r->at("predictions");
    if (preds.size() != end - b) return -1;
    for (size_t i = b; i < end; ++i) {
      if (preds[i - b].at("index").get<int64_t>() == d.labels[idx[i]]) ++correct;
    }
  }
  return static_cast<double>(correct) / static_cast<double>(idx.size());
}

double MeanOf(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

std::vector<std::string> DigitLabels() {
  std::vector<std::string> labels;
  for (int i = 0; i < 10; ++i) labels.push_back(std::to_string(i));
  return labels;
}

std::vector<std::string> TopicLabels() { return {std::begin(kTopics), std::end(kTopics)}; }

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// Two workers learn disjoint halves of digits concurrently through two shards (async SGD:
// each pushes gradients computed on parameters the other has moved since). Measured on
// 2 cores: held-out accuracy 0.965-0.970, ~60% of pushes with tau > 0 (max 3-7).
TEST(WorkerMultiProcessTest, TwoWorkersLearnDigitsAboveNinetyPercent) {
  if (!std::filesystem::exists(kDigitsCsv)) GTEST_SKIP() << kDigitsCsv << " missing";
  Dataset digits;
  ASSERT_TRUE(LoadDigits(&digits)) << "cannot parse " << kDigitsCsv;
  const std::vector<size_t> order = Shuffled(digits.size(), kSeed);
  const std::vector<size_t> heldout = Range(order, 1400, order.size());

  Cluster cluster;
  ASSERT_TRUE(cluster.StartShards(2));
  const std::vector<std::string> flags = {
      "--model", "mlp", "--input-dim", "64", "--labels", Joined(DigitLabels()), "--lr", "0.5"};
  const std::string ep[2] = {cluster.StartWorker(flags), cluster.StartWorker(flags)};
  ASSERT_FALSE(ep[0].empty() || ep[1].empty()) << "a worker did not start";
  std::unique_ptr<WorkerClient> clients[2] = {ConnectWorker(ep[0]), ConnectWorker(ep[1])};
  ASSERT_TRUE(clients[0] && clients[1]);

  LearnLog logs[2];
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      Train(clients[k].get(), digits, Range(order, k * 700, (k + 1) * 700), /*epochs=*/10,
            /*batch=*/10, kSeed + 100 * k, &logs[k]);
    });
  }
  for (auto& t : threads) t.join();

  size_t tau_positive = 0;
  for (const LearnLog& log : logs) {
    EXPECT_EQ(log.errors, 0u) << log.first_error;
    EXPECT_EQ(log.applied, log.replies) << "every learn reply should say \"applied\"";
    EXPECT_EQ(log.dense_pushed, log.replies);
    tau_positive += log.tau_positive;
  }
  EXPECT_GT(tau_positive, 0u) << "two workers pushing concurrently should see staleness";
  const double acc = Accuracy(clients[0].get(), digits, heldout);
  std::printf("digits: %zu learn replies, %zu with tau > 0 (max %llu); held-out accuracy %.4f\n",
              logs[0].replies + logs[1].replies, tau_positive,
              static_cast<unsigned long long>(std::max(logs[0].max_tau, logs[1].max_tau)), acc);
  RecordProperty("heldout_accuracy", std::to_string(acc));
  EXPECT_GT(acc, 0.90);
  cluster.StopAll();
}

// The text model (hashed words and bigrams -> sparse embedding -> linear) learns which of
// three topics a sentence is about, and labels sentences it never saw. Measured: held-out
// accuracy 0.25 before learning, 1.00 after.
TEST(WorkerMultiProcessTest, TextModelLearnsTopicsOfUnseenSentences) {
  const Dataset d = TopicSentences(900, kSeed);
  const std::vector<size_t> order = Shuffled(d.size(), kSeed);
  const std::vector<size_t> train = Range(order, 0, 600), heldout = Range(order, 600, d.size());

  Cluster cluster;
  ASSERT_TRUE(cluster.StartShards(2));
  const std::string ep = cluster.StartWorker(std::vector<std::string>{
      "--model", "text", "--labels", Joined(TopicLabels()), "--embed-dim", "16", "--lr", "0.5"});
  ASSERT_FALSE(ep.empty()) << "worker did not start";
  auto client = ConnectWorker(ep);
  ASSERT_TRUE(client);
  const double before = Accuracy(client.get(), d, heldout);

  LearnLog log;
  Train(client.get(), d, train, /*epochs=*/8, /*batch=*/8, kSeed, &log);
  EXPECT_EQ(log.errors, 0u) << log.first_error;
  EXPECT_EQ(log.applied, log.replies);
  const double acc = Accuracy(client.get(), d, heldout);
  std::printf("text: held-out accuracy %.4f before learning, %.4f after %zu learn calls\n", before,
              acc, log.replies);
  RecordProperty("heldout_accuracy", std::to_string(acc));
  EXPECT_GT(acc, 0.90);
  cluster.StopAll();
}

// Issue 20: with default flags, a learn acknowledged by worker A is read by worker B's
// next infers within milliseconds (the shards' change notices), not the 500 ms age bound:
// for dense tables (mlp) and for the sparse rows B holds (text). An infer has read a
// learn when its per-table, per-shard versions are at least the learn's.
bool Covers(const json& read, const json& pushed) {
  for (const auto& [table, shards] : pushed.items()) {
    if (!read.contains(table)) return false;
    for (size_t s = 0; s < shards.size(); ++s) {
      if (shards[s].get<uint64_t>() > 0 && read[table][s].get<uint64_t>() < shards[s]) {
        return false;
      }
    }
  }
  return true;
}

TEST(WorkerMultiProcessTest, ALearnOnOneWorkerIsReadByAnotherWithinMilliseconds) {
  Cluster cluster;
  ASSERT_TRUE(cluster.StartShards(2));
  for (const std::string model : {"mlp", "text"}) {
    std::vector<std::string> flags = {"--model", model};
    if (model == "mlp") {
      for (const char* f : {"--input-dim", "8", "--labels", "a,b,c"}) flags.push_back(f);
    } else {
      for (const char* f : {"--labels", "neg,pos", "--table-prefix", "t/"}) flags.push_back(f);
    }
    const std::string a = cluster.StartWorker(flags), b = cluster.StartWorker(flags);
    ASSERT_FALSE(a.empty() || b.empty()) << "workers did not start";
    auto ca = ConnectWorker(a), cb = ConnectWorker(b);
    std::vector<double> delays;
    for (int trial = 0; trial < 20; ++trial) {
      json ex = model == "mlp"
                    ? json{{"features", std::vector<float>(8, 0.1f * static_cast<float>(trial))}}
                    : json{{"text", "word" + std::to_string(trial) + " common words"}};
      ASSERT_TRUE(cb->Call(Op::kInfer, ex).ok());  // B holds what the input reads
      json labelled = ex;
      labelled["label"] = 1;
      auto learned = ca->Call(Op::kLearn, labelled);
      ASSERT_TRUE(learned.ok()) << learned.status().ToString();
      const auto acked = std::chrono::steady_clock::now();
      bool seen = false;
      while (!seen && std::chrono::steady_clock::now() - acked < milliseconds(2000)) {
        auto r = cb->Call(Op::kInfer, ex);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        seen = Covers((*r)["versions"], (*learned)["versions"]);
      }
      ASSERT_TRUE(seen) << model << ": worker B never read worker A's learn";
      delays.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - acked)
              .count());
      std::this_thread::sleep_for(milliseconds(trial % 7 * 5));  // meet refreshes at any phase
    }
    std::sort(delays.begin(), delays.end());
    std::printf("%s: learn on A -> read on B: median %.2f ms, max %.2f ms over %zu trials\n",
                model.c_str(), delays[delays.size() / 2], delays.back(), delays.size());
    // The age bound alone would take up to 500 ms; allow a loaded CI machine slack.
    EXPECT_LT(delays[delays.size() / 2], 50.0) << model;
  }
  cluster.StopAll();
}

// A user's TorchScript module (EmbeddingBag + Linear, embedding served as a sparse table)
// infers valid distributions and learns the same topic task. Measured: mean loss 1.11 over
// the first 30 learns, 0.55 over the last 30; held-out accuracy 0.97.
TEST(WorkerMultiProcessTest, TorchScriptModelInfersAndLearns) {
  const std::string model_file = ONLINEPS_TESTDATA_DIR "/tiny_model.pt";
  ASSERT_TRUE(std::filesystem::exists(model_file)) << model_file;
  const Dataset d = TopicSentences(600, kSeed + 1);
  const std::vector<size_t> order = Shuffled(d.size(), kSeed);
  const std::vector<size_t> train = Range(order, 0, 450), heldout = Range(order, 450, d.size());

  Cluster cluster;
  ASSERT_TRUE(cluster.StartShards(1));
  const std::string ep = cluster.StartWorker(std::vector<std::string>{
      "--model", "torchscript", "--model-file", model_file, "--sparse-params", "embed.weight",
      // The dense layer starts from the file's nn.Linear weights (uniform +-1/sqrt(8))
      // and the embedding rows from the PS's normal(0.1): small on both sides, so a
      // larger step than the other models need.
      "--labels", Joined(TopicLabels()), "--lr", "2.0"});
  ASSERT_FALSE(ep.empty()) << "worker did not start";
  auto client = ConnectWorker(ep);
  ASSERT_TRUE(client);

  auto r = client->Call(Op::kInfer, {{"examples", json::array({d.inputs[0]})}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const json& scores = r->at("predictions").at(0).at("scores");
  ASSERT_EQ(scores.size(), 3u);
  double sum = 0;
  for (const json& s : scores) sum += s.get<double>();
  EXPECT_NEAR(sum, 1.0, 1e-5);

  LearnLog log;
  Train(client.get(), d, train, /*epochs=*/6, /*batch=*/8, kSeed, &log);  // ~340 steps
  EXPECT_EQ(log.errors, 0u) << log.first_error;
  EXPECT_EQ(log.applied, log.replies);
  ASSERT_GE(log.losses.size(), 200u);
  const size_t n = log.losses.size(), w = 30;
  const double first = MeanOf(log.losses, 0, w), last = MeanOf(log.losses, n - w, n);
  const double acc = Accuracy(client.get(), d, heldout);
  std::printf(
      "torchscript: mean loss %.4f over the first %zu learns, %.4f over the last %zu; "
      "held-out accuracy %.4f\n",
      first, w, last, w, acc);
  RecordProperty("heldout_accuracy", std::to_string(acc));
  EXPECT_LT(last, 0.8 * first);
  EXPECT_GT(acc, 0.6) << "chance is 1/3";
  cluster.StopAll();
}

// Pulls a dense table straight from the shards.
std::vector<float> PullTable(ps::PsClient* ps, const std::string& table, ps::VersionVector* v) {
  auto spec = ps->OpenTable(table);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  if (!spec.ok()) return {};
  std::vector<float> values(spec->size());
  Status st = ps->PullDense(table, values.data(), v).Wait();
  EXPECT_TRUE(st.ok()) << st.ToString();
  return values;
}

// softmax(W x + b) for the linear mlp, computed here from values pulled off the PS.
std::vector<double> LinearScores(const std::vector<float>& w, const std::vector<float>& b,
                                 const json& features) {
  const size_t classes = b.size(), dim = features.size();
  std::vector<double> z(classes);
  for (size_t c = 0; c < classes; ++c) {
    z[c] = b[c];
    for (size_t j = 0; j < dim; ++j) z[c] += w[c * dim + j] * features[j].get<double>();
  }
  const double top = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (double& x : z) sum += (x = std::exp(x - top));
  for (double& x : z) x /= sum;
  return z;
}

// A worker killed mid-stream loses nothing it acknowledged: every "applied" learn is in
// the shards' versions (a learn in flight at the kill may or may not be), and a fresh
// worker serves infer at once from exactly those parameters.
TEST(WorkerMultiProcessTest, KilledWorkerLosesNoAcknowledgedUpdate) {
  if (!std::filesystem::exists(kDigitsCsv)) GTEST_SKIP() << kDigitsCsv << " missing";
  Dataset digits;
  ASSERT_TRUE(LoadDigits(&digits));
  Cluster cluster;
  ASSERT_TRUE(cluster.StartShards(2));
  const std::vector<std::string> flags = {
      "--model", "mlp", "--input-dim",    "64",   "--labels", Joined(DigitLabels()),
      "--lr",    "0.1", "--table-prefix", "kill/"};
  const std::string ep = cluster.StartWorker(flags);
  ASSERT_FALSE(ep.empty());
  auto client = ConnectWorker(ep, milliseconds(2000));
  ASSERT_TRUE(client);

  std::atomic<size_t> sent{0}, acked{0};
  std::atomic<bool> failed{false};
  std::thread learner([&] {
    const std::vector<size_t> order = Shuffled(digits.size(), kSeed);
    for (size_t b = 0; !failed.load(); b = (b + 8) % 1600) {
      sent++;
      auto r = client->Call(Op::kLearn, LearnBody(digits, order, b, b + 8));
      if (!r.ok()) {
        failed = true;
        break;
      }
      if (r->at("outcome") == "applied" && r->at("dense_pushed").get<bool>()) acked++;
    }
  });
  while (acked.load() < 100 && !failed.load()) std::this_thread::sleep_for(milliseconds(1));
  cluster.KillWorker(0);
  learner.join();
  ASSERT_GE(acked.load(), 100u);

  ps::PsClientOptions o;
  o.shards = cluster.shard_endpoints();
  auto ps = ps::PsClient::Connect(o);
  ASSERT_TRUE(ps.ok()) << ps.status().ToString();
  ps::VersionVector vw, vb;
  const std::vector<float> w = PullTable(ps->get(), "kill/out.weight", &vw);
  const std::vector<float> b = PullTable(ps->get(), "kill/out.bias", &vb);
  ASSERT_EQ(w.size(), 640u);
  ASSERT_EQ(b.size(), 10u);
  // Each learn pushes both tables once, and every table spans both shards.
  for (const auto* v : {&vw, &vb}) {
    ASSERT_EQ(v->size(), 2u);
    for (uint64_t shard_version : *v) {
      EXPECT_GE(shard_version, acked.load()) << "an acknowledged update is missing";
      EXPECT_LE(shard_version, sent.load());
    }
  }
  std::printf("kill: %zu learns sent, %zu acknowledged, shard versions %llu/%llu\n", sent.load(),
              acked.load(), static_cast<unsigned long long>(vw[0]),
              static_cast<unsigned long long>(vw[1]));

  const std::string fresh_ep = cluster.StartWorker(flags);
  ASSERT_FALSE(fresh_ep.empty());
  auto fresh = ConnectWorker(fresh_ep);
  ASSERT_TRUE(fresh);
  json examples = json::array();
  for (size_t i = 0; i < 16; ++i) examples.push_back(digits.inputs[i]);
  auto r = fresh->Call(Op::kInfer, {{"examples", examples}});
  ASSERT_TRUE(r.ok()) << "fresh worker: " << r.status().ToString();
  EXPECT_EQ(r->at("version").get<uint64_t>(), std::max({vw[0], vw[1], vb[0], vb[1]}));
  for (size_t i = 0; i < examples.size(); ++i) {
    const std::vector<double> want = LinearScores(w, b, examples[i].at("features"));
    const json& got = r->at("predictions").at(i).at("scores");
    for (size_t c = 0; c < want.size(); ++c) {
      EXPECT_NEAR(got[c].get<double>(), want[c], 1e-4) << "example " << i << " class " << c;
    }
  }
  cluster.StopAll();
}

// Issue 22: a frozen backbone + trainable head through real processes. Only the head is
// a PS table (the backbone's tables do not exist, and the bytes pushed are the head's),
// the backbone stays bit-identical through 100 learns (its hash, recomputed), infer
// changes, a worker with another backbone file is refused naming both hashes, and LoRA
// adapters with B = 0 answer exactly what the plain frozen model answers.
json FeatureExamples(size_t n, size_t offset) {
  json examples = json::array();
  for (size_t e = offset; e < offset + n; ++e) {
    json features = json::array();
    for (int j = 0; j < 6; ++j) features.push_back(2.0 * std::sin(1.7 * e + 0.9 * j));
    examples.push_back({{"features", features}, {"label", static_cast<int64_t>(e % 3)}});
  }
  return examples;
}

json InferScores(WorkerClient* client, const json& examples) {
  json inputs = json::array();
  for (const json& ex : examples) inputs.push_back({{"features", ex.at("features")}});
  auto r = client->Call(Op::kInfer, {{"examples", inputs}});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  json scores = json::array();
  if (r.ok()) {
    for (const json& p : r->at("predictions")) scores.push_back(p.at("scores"));
  }
  return scores;
}

// A model file damaged in storage or transfer (one bit of one weight) is refused at
// start, naming the file and the entry; libtorch, which checks no CRC, loaded it and the
// worker seeded the shards with the wrong weight.
TEST(WorkerMultiProcessTest, ADamagedModelFileIsRefusedAtStart) {
  std::string bytes;
  {
    std::ifstream f(ONLINEPS_TESTDATA_DIR "/frozen_head.pt", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  // The first weight entry's data: after its local header, name and extra field.
  size_t data = std::string::npos;
  for (size_t at = bytes.find("PK\x03\x04"); at != std::string::npos;
       at = bytes.find("PK\x03\x04", at + 4)) {
    auto u16 = [&](size_t i) {
      return static_cast<size_t>(static_cast<unsigned char>(bytes[i]) |
                                 static_cast<unsigned char>(bytes[i + 1]) << 8);
    };
    if (bytes.substr(at + 30, u16(at + 26)).find("/data/0") != std::string::npos) {
      data = at + 30 + u16(at + 26) + u16(at + 28);
      break;
    }
  }
  ASSERT_NE(data, std::string::npos);
  bytes[data + 2] ^= 0x04;
  const std::string damaged = ::testing::TempDir() + "/damaged_head.pt";
  std::ofstream(damaged, std::ios::binary) << bytes;
  Subprocess worker({ONLINEPS_BIN_DIR "/onlineps_worker", "--ps", "tcp://127.0.0.1:1", "--listen",
                     "tcp://127.0.0.1:0", "--admin-port", "-1", "--model", "torchscript",
                     "--model-file", damaged, "--labels", "a,b,c"},
                    /*with_stderr=*/true);
  const std::string said = worker.ReadToEnd(kStartTimeout);
  EXPECT_EQ(worker.Wait(kStopTimeout), 2) << said;
  EXPECT_NE(said.find("damaged_head.pt is damaged"), std::string::npos) << said;
  EXPECT_NE(said.find("fails its CRC-32 check"), std::string::npos) << said;
  EXPECT_EQ(said.find("LISTENING"), std::string::npos) << said;
}

TEST(WorkerMultiProcessTest, FrozenBackboneLearnsOnlyItsHead) {
  const std::string head_file = ONLINEPS_TESTDATA_DIR "/frozen_head.pt";
  const std::string other_file = ONLINEPS_TESTDATA_DIR "/frozen_head_other.pt";
  const std::string lora_file = ONLINEPS_TESTDATA_DIR "/lora_r2.pt";
  Cluster cluster;
  ASSERT_TRUE(cluster.StartShards(2));
  const std::vector<std::string> common = {"--model", "torchscript", "--labels",
                                           "a,b,c",   "--lr",        "0.5"};
  auto flags = [&](const std::string& file, const std::string& prefix) {
    std::vector<std::string> f = common;
    f.insert(f.end(), {"--model-file", file, "--table-prefix", prefix});
    return f;
  };
  const std::string ep = cluster.StartWorker(flags(head_file, "fz/"));
  ASSERT_FALSE(ep.empty()) << "worker did not start";
  auto client = ConnectWorker(ep);
  ASSERT_TRUE(client);

  auto info = client->Call(Op::kModelInfo, json::object());
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const std::string base = info->at("base").get<std::string>();
  ASSERT_EQ(base.rfind("sha256:", 0), 0u) << info->dump();
  EXPECT_EQ(info->at("trainable_floats").get<uint64_t>(), 3u * 8 + 3);
  EXPECT_EQ(info->at("frozen_floats").get<uint64_t>(), 8u * 6 + 8 + 8 * 8 + 8);
  const uint64_t push_bytes = info->at("dense_push_bytes").get<uint64_t>();
  EXPECT_EQ(push_bytes, (3u * 8 + 3) * sizeof(float));
  size_t frozen_listed = 0;
  for (const json& p : info->at("params")) frozen_listed += !p.at("trainable").get<bool>();
  EXPECT_EQ(frozen_listed, 4u);

  const json probe = FeatureExamples(6, 1000);
  const json before = InferScores(client.get(), probe);
  const int kLearns = 100;
  for (int i = 0; i < kLearns; ++i) {
    auto r = client->Call(Op::kLearn, {{"examples", FeatureExamples(1, i)}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->at("outcome"), "applied");
  }
  EXPECT_NE(InferScores(client.get(), probe), before) << "a head-only learn must change infer";

  auto verified = client->Call(Op::kModelInfo, {{"verify", true}});
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_EQ(verified->at("base_now"), base) << "the frozen backbone changed";
  EXPECT_TRUE(verified->at("frozen_intact").get<bool>());
  auto stats = client->Call(Op::kWorkerStats, json::object());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->at("push_bytes").get<uint64_t>(), kLearns * push_bytes);

  // On the PS: the head's tables, each updated once per learn and tagged with the base;
  // no table for any backbone parameter.
  ps::PsClientOptions o;
  o.shards = cluster.shard_endpoints();
  auto ps = ps::PsClient::Connect(o);
  ASSERT_TRUE(ps.ok()) << ps.status().ToString();
  for (const char* table : {"fz/head.weight", "fz/head.bias"}) {
    auto shards = (*ps)->TableInfo(table);
    ASSERT_TRUE(shards.ok()) << table << ": " << shards.status().ToString();
    uint64_t version = 0;
    for (auto& shard : *shards) {
      EXPECT_EQ(shard["base"], base) << table;
      version = std::max<uint64_t>(version, std::stoull(shard["stat.version"]));
    }
    // One seeding push of the file's head values, then one per learn.
    EXPECT_EQ(version, static_cast<uint64_t>(kLearns) + 1) << table;
  }
  for (const char* table : {"fz/backbone.fc0.weight", "fz/backbone.fc1.bias"}) {
    EXPECT_EQ((*ps)->TableInfo(table).status().code(), StatusCode::kNotFound) << table;
  }

  // Another backbone against the same tables: refused at start, naming both hashes.
  std::string shards_arg;
  for (const std::string& s : cluster.shard_endpoints()) {
    shards_arg += (shards_arg.empty() ? "" : ",") + s;
  }
  std::vector<std::string> argv = {ONLINEPS_BIN_DIR "/onlineps_worker",
                                   "--ps",
                                   shards_arg,
                                   "--listen",
                                   "tcp://127.0.0.1:0",
                                   "--admin-port",
                                   "-1"};
  for (const std::string& f : flags(other_file, "fz/")) argv.push_back(f);
  Subprocess other(argv, /*with_stderr=*/true);
  const std::string said = other.ReadToEnd(kStartTimeout);
  EXPECT_NE(other.Wait(kStopTimeout), 0) << said;
  EXPECT_NE(said.find(base), std::string::npos) << said;
  EXPECT_NE(said.find("frozen base"), std::string::npos) << said;
  EXPECT_EQ(said.find("LISTENING"), std::string::npos) << said;
  std::printf("another backbone: %s", said.c_str());

  // LoRA adapters (B = 0) on the same backbone and head, before any learn: the same
  // scores, bit for bit, as the plain model with its own untouched tables.
  const std::string lora_ep = cluster.StartWorker(flags(lora_file, "lora/"));
  const std::string plain_ep = cluster.StartWorker(flags(head_file, "plain/"));
  ASSERT_FALSE(lora_ep.empty());
  ASSERT_FALSE(plain_ep.empty());
  auto lora = ConnectWorker(lora_ep);
  auto plain = ConnectWorker(plain_ep);
  ASSERT_TRUE(lora && plain);
  const json lora_scores = InferScores(lora.get(), probe);
  ASSERT_EQ(lora_scores.size(), probe.size());
  EXPECT_EQ(lora_scores, InferScores(plain.get(), probe));
  auto lora_info = lora->Call(Op::kModelInfo, json::object());
  ASSERT_TRUE(lora_info.ok()) << lora_info.status().ToString();
  EXPECT_EQ(lora_info->at("base"), base) << "LoRA keeps the same frozen backbone";
  // A [2, 6] and B [8, 2] on fc0, A [2, 8] and B [8, 2] on fc1, and the head's 3 x 8 + 3.
  EXPECT_EQ(lora_info->at("trainable_floats").get<uint64_t>(), 12u + 16 + 16 + 16 + 27);
  cluster.StopAll();
}

// Regression: a worker waiting for shards that are not up took its shutdown signal only
// after that wait (up to 30 s), so a pod stopped then ran into SIGKILL.
// Issue 21: the sparse tables a worker creates get the caps of its flags, so a stream
// of always-new words (the text model hashes each one to a row) stops at --sparse-max-rows
// per shard, least recently used rows evicted. A second worker with other caps joins the
// table (it keeps the caps it was created with) instead of failing with ALREADY_EXISTS.
TEST(WorkerMultiProcessTest, SparseTablesOfAWorkerAreCappedByItsFlags) {
  constexpr uint64_t kCap = 1024;
  Cluster cluster;
  ASSERT_TRUE(cluster.StartShards(2));
  const std::vector<std::string> flags = {"--model",     "text", "--labels",       "a,b",
                                          "--embed-dim", "4",    "--table-prefix", "capped/"};
  std::vector<std::string> a_flags = flags, b_flags = flags;
  a_flags.insert(a_flags.end(), {"--sparse-max-rows", std::to_string(kCap)});
  b_flags.insert(b_flags.end(), {"--sparse-max-rows", "0", "--sparse-ttl-ms", "60000"});
  const std::string a = cluster.StartWorker(a_flags);
  ASSERT_FALSE(a.empty()) << "worker did not start";
  auto client = ConnectWorker(a);
  ASSERT_TRUE(client);
  // 40 learns x 8 sentences x 16 new words: ~5,000 words and as many pairs, 5x the cap of
  // both shards together.
  std::mt19937_64 rng(kSeed);
  for (int call = 0; call < 40; ++call) {
    json examples = json::array();
    for (int e = 0; e < 8; ++e) {
      std::string text;
      for (int w = 0; w < 16; ++w) text += "w" + std::to_string(rng()) + " ";
      examples.push_back({{"text", text}, {"label", e % 2 ? "a" : "b"}});
    }
    auto r = client->Call(Op::kLearn, {{"examples", examples}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  ps::PsClientOptions o;
  o.shards = cluster.shard_endpoints();
  auto ps = ps::PsClient::Connect(o);
  ASSERT_TRUE(ps.ok()) << ps.status().ToString();
  auto info = (*ps)->TableInfo("capped/embed");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_EQ(info->size(), 2u);
  uint64_t evicted = 0;
  for (const auto& shard : *info) {
    EXPECT_EQ(shard.at("max_rows"), std::to_string(kCap));
    EXPECT_LE(std::stoull(shard.at("stat.rows")), kCap);
    EXPECT_GT(std::stoull(shard.at("stat.rows")), kCap / 2);  // both shards filled up
    evicted += std::stoull(shard.at("stat.evicted_rows"));
  }
  EXPECT_GT(evicted, 4 * kCap);
  // What an operator reads: onlineps_ps_cli info.
  std::string shards = o.shards[0] + "," + o.shards[1];
  Subprocess cli(
      {ONLINEPS_BIN_DIR "/onlineps_ps_cli", "--shards", shards, "info", "--table", "capped/embed"});
  EXPECT_EQ(cli.WaitForLine("  max_rows = ", kStartTimeout), std::to_string(kCap));
  const std::string shard0 = cli.WaitForLine("shard 0 ", kStartTimeout);
  EXPECT_NE(shard0.find("evicted_rows="), std::string::npos) << shard0;
  EXPECT_EQ(cli.Wait(kStopTimeout), 0);

  const std::string b = cluster.StartWorker(b_flags);
  ASSERT_FALSE(b.empty()) << "a worker with other caps did not join the table";
  auto b_client = ConnectWorker(b);
  ASSERT_TRUE(b_client);
  auto r = b_client->Call(Op::kLearn,
                          {{"examples", json::array({{{"text", "hello there"}, {"label", "a"}}})}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  info = (*ps)->TableInfo("capped/embed");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->at(0).at("max_rows"), std::to_string(kCap));
  EXPECT_EQ(info->at(0).at("ttl_ms"), "0");
  cluster.StopAll();
}

// A bad group flag is refused before the wait for the shards: before, the worker waited
// out that wait (30 s, with no shard there) before saying what was wrong.
TEST(WorkerMultiProcessTest, ABadGroupFlagIsRefusedBeforeWaitingForTheShards) {
  const auto start = std::chrono::steady_clock::now();
  Subprocess w({ONLINEPS_BIN_DIR "/onlineps_worker", "--ps", "tcp://127.0.0.1:9", "--listen",
                "tcp://127.0.0.1:0", "--admin-port", "-1", "--group", "local", "--group-size", "2",
                "--group-rank", "2", "--group-endpoint", "ipc:///tmp/onlineps-bad-group-test"},
               /*with_stderr=*/true);
  ASSERT_TRUE(w.started());
  const std::string said = w.ReadToEnd(std::chrono::seconds(20));
  EXPECT_EQ(w.Wait(std::chrono::seconds(1)), 2) << said;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20)) << said;
  EXPECT_NE(said.find("rank 2 out of range [0, 2)"), std::string::npos) << said;
  EXPECT_EQ(said.find("not reachable"), std::string::npos) << said;
}

TEST(WorkerMultiProcessTest, SigtermWhileWaitingForShardsExitsAtOnce) {
  Subprocess w({ONLINEPS_BIN_DIR "/onlineps_worker", "--ps", "tcp://127.0.0.1:9", "--listen",
                "tcp://127.0.0.1:0", "--admin-port", "-1", "--log-level", "warn"});
  ASSERT_TRUE(w.started());
  // Loading libtorch can take seconds on a busy machine: wait until main() has blocked
  // SIGTERM (the first thing it does), then a little more, into the wait for the shards.
  bool blocked = false;
  for (int i = 0; i < 600 && !blocked; ++i) {
    std::ifstream status("/proc/" + std::to_string(w.pid()) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("SigBlk:", 0) == 0) {
        blocked = (std::stoull(line.substr(7), nullptr, 16) >> (SIGTERM - 1)) & 1;
      }
    }
    if (!blocked) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(blocked) << "the worker never blocked SIGTERM";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(w.Stop(SIGTERM, std::chrono::milliseconds(5000)), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

}  // namespace
}  // namespace onlineps::worker
