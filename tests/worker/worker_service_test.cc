// The worker service against real shard servers (ZeroMQ on loopback), with real libtorch
// models: accumulation, freshness, context isolation, what a push carries, non-finite
// refusal, local steps, reply modes, and the RPC's answers to bad requests.
#include "worker/worker_service.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <msgpack.hpp>
#include <mutex>
#include <set>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/clock.h"
#include "ps/dedup.h"
#include "ps/ps_client.h"
#include "ps/shard_server.h"
#include "tests/etcd_server.h"
#include "worker/local_group.h"
#include "worker/model.h"
#include "worker/worker_client.h"
#include "worker/worker_rpc.h"
#include "worker/worker_server.h"

namespace onlineps::worker {
namespace {

using nlohmann::json;

// A ZeroMQ proxy in front of one shard that records every request frame the worker
// sends: the test inspects exactly what leaves the worker.
class Tap {
 public:
  explicit Tap(const std::string& shard)
      : front_(ctx_, zmq::socket_type::router), back_(ctx_, zmq::socket_type::dealer) {
    front_.bind("tcp://127.0.0.1:0");
    endpoint_ = front_.get(zmq::sockopt::last_endpoint);
    back_.connect(shard);
    thread_ = std::thread([this] { Run(); });
  }
  ~Tap() {
    stop_ = true;
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  // While set, requests are recorded and not passed on (a shard cut off by the network).
  void set_drop(bool drop) { drop_ = drop; }
  std::vector<std::vector<std::string>> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void Run() {
    std::string peer;
    zmq::pollitem_t items[] = {{front_.handle(), 0, ZMQ_POLLIN, 0},
                               {back_.handle(), 0, ZMQ_POLLIN, 0}};
    while (!stop_) {
      zmq::poll(items, 2, std::chrono::milliseconds(20));
      if (items[0].revents & ZMQ_POLLIN) {
        std::vector<zmq::message_t> parts;
        static_cast<void>(zmq::recv_multipart(front_, std::back_inserter(parts)));
        peer = parts[0].to_string();
        std::vector<std::string> frames;
        for (size_t i = 1; i < parts.size(); ++i) frames.push_back(parts[i].to_string());
        {
          std::lock_guard<std::mutex> lock(mu_);
          requests_.push_back(frames);
        }
        for (size_t i = 1; i < parts.size() && !drop_; ++i) {
          back_.send(parts[i],
                     i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
        }
      }
      if (items[1].revents & ZMQ_POLLIN) {
        std::vector<zmq::message_t> parts;
        static_cast<void>(zmq::recv_multipart(back_, std::back_inserter(parts)));
        front_.send(zmq::buffer(peer), zmq::send_flags::sndmore);
        for (size_t i = 0; i < parts.size(); ++i) {
          front_.send(parts[i],
                      i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
        }
      }
    }
  }

  zmq::context_t ctx_;
  zmq::socket_t front_, back_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> drop_{false};
  std::mutex mu_;
  std::vector<std::vector<std::string>> requests_;
  std::thread thread_;
};

// A model that throws from its forward pass (as libtorch throws bad_alloc or c10::Error)
// for examples whose first feature is kThrowOn; otherwise the wrapped model.
class ThrowingModel : public Model {
 public:
  static constexpr float kThrowOn = 999;
  explicit ThrowingModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const std::vector<ParamInfo>& params() const override { return inner_->params(); }
  const std::vector<std::string>& labels() const override { return inner_->labels(); }
  std::string device() const override { return inner_->device(); }
  StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(
      const std::vector<Example>& batch, const ContextInput& context) const override {
    return inner_->SparseKeys(batch, context);
  }
  StatusOr<InferOutput> Infer(const std::vector<Example>& batch, const ContextInput& context,
                              const ParamView& params) override {
    Throw(batch);
    return inner_->Infer(batch, context, params);
  }
  StatusOr<GradOutput> Gradients(const std::vector<Example>& batch, const ContextInput& context,
                                 const ParamView& params) override {
    Throw(batch);
    return inner_->Gradients(batch, context, params);
  }

 private:
  static void Throw(const std::vector<Example>& batch) {
    for (const Example& e : batch) {
      if (!e.features.empty() && e.features[0] == kThrowOn) throw std::bad_alloc();
    }
  }
  std::unique_ptr<Model> inner_;
};

// Two shard servers on loopback; a worker (service + RPC server) in front of them.
class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (uint32_t i = 0; i < 2; ++i) {
      ps::ShardServerOptions o;
      o.shard = i;
      o.num_shards = 2;
      o.listen = "tcp://127.0.0.1:0";
      shards_.push_back(
          std::make_unique<ps::ShardServer>(o, std::make_shared<prometheus::Registry>()));
      auto ep = shards_.back()->Start();
      ASSERT_TRUE(ep.ok()) << ep.status().ToString();
      endpoints_.push_back(*ep);
    }
    peek_ = Client(endpoints_);
  }
  void TearDown() override {
    if (server_) server_->Stop();
    if (service_) {
      EXPECT_TRUE(service_->Stop().ok());
    }
    server_.reset();
    service_.reset();
    taps_.clear();
    for (auto& s : shards_) s->Stop();
  }

  // With a shard down the final flush may fail: stops without the fixture's check.
  void StopWithAShardDown() {
    server_->Stop();
    server_.reset();
    static_cast<void>(service_->Stop());
    service_.reset();
  }

  // ps_timeout (0: the client's default): the call timeout, with 4 attempts in it.
  static std::unique_ptr<ps::PsClient> Client(
      const std::vector<std::string>& shards,
      std::chrono::milliseconds ps_timeout = std::chrono::milliseconds(0)) {
    ps::PsClientOptions o;
    o.shards = shards;
    if (ps_timeout.count() > 0) {
      o.timeout = ps_timeout;
      o.attempt_timeout = ps_timeout / 4;
    }
    auto c = ps::PsClient::Connect(o);
    EXPECT_TRUE(c.ok());
    return std::move(*c);
  }

  // Mlp() with tables of their own (a table's rules are fixed at creation).
  static ModelOptions MlpFor(const std::string& prefix) {
    ModelOptions m = Mlp();
    m.table_prefix = prefix + "/";
    return m;
  }
  // With --accumulate-examples 2 on tables made from `table_template`, a learn answered
  // "accumulated" whose push then fails (shard 1 down) is held, or the worker refused to
  // start with INVALID_ARGUMENT naming `flag`.
  void ExpectNoLearnAnsweredAccumulatedIsLost(ps::TableSpec table_template,
                                              const std::string& flag);

  static ModelOptions Mlp() {
    ModelOptions m;
    m.kind = "mlp";
    m.input_dim = 4;
    m.labels = {"a", "b", "c"};
    m.table_prefix = "mlp/";
    return m;
  }
  static ModelOptions Text() {
    ModelOptions m;
    m.kind = "text";
    m.labels = {"neg", "pos"};
    m.embed_dim = 8;
    m.table_prefix = "text/";
    return m;
  }

  // Starts model + service (+ RPC server) with `o`; through taps when `tap` is set.
  void StartWorker(const ModelOptions& m, WorkerServiceOptions o, bool tap = false,
                   std::chrono::milliseconds ps_timeout = std::chrono::milliseconds(0)) {
    auto model = CreateModel(m);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(*model);
    if (throwing_model_) model_ = std::make_unique<ThrowingModel>(std::move(model_));
    std::vector<std::string> shards = endpoints_;
    if (tap) {
      shards.clear();
      for (const auto& ep : endpoints_) {
        taps_.push_back(std::make_unique<Tap>(ep));
        shards.push_back(taps_.back()->endpoint());
      }
    }
    client_ = Client(shards, ps_timeout);
    if (o.table_template.optimizer_params.empty()) o.table_template.optimizer_params["lr"] = 0.5;
    service_ = std::make_unique<WorkerService>(client_.get(), model_.get(), o);
    ASSERT_TRUE(service_->Start().ok());
    WorkerServerOptions so;
    server_ = std::make_unique<WorkerServer>(service_.get(), so);
    auto ep = server_->Start();
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    worker_endpoint_ = *ep;
    WorkerClientOptions co;
    co.endpoint = *ep;
    auto rpc = WorkerClient::Connect(co);
    ASSERT_TRUE(rpc.ok());
    rpc_ = std::move(*rpc);
  }

  std::vector<float> PullDense(const std::string& table, ps::VersionVector* v = nullptr) {
    auto spec = peek_->OpenTable(table);
    EXPECT_TRUE(spec.ok());
    std::vector<float> out(spec->size());
    EXPECT_TRUE(peek_->PullDense(table, out.data(), v).Wait().ok());
    return out;
  }

  // A learn whose pushes one shard applied and another refused (here a shard restarted
  // empty on the same address: "no such table") must not be reported as not applied: its
  // error names the part that landed (kPartlyApplied), since a retry would apply it twice.
  // `learn` runs one learn of one example after the restart (the worker's cache is warm,
  // so it pushes without a pull) and returns its status.
  void ExpectAPartlyAppliedLearnSaysSo(const std::function<Status()>& learn) {
    ASSERT_TRUE(service_->Learn("", Feats({{1, -1, 2, 0}}, {1})).ok());
    shards_[1]->Stop();
    ps::ShardServerOptions fresh;
    fresh.shard = 1;
    fresh.num_shards = 2;
    fresh.listen = endpoints_[1];
    // The old socket closes in the background: its port may be busy for a moment.
    StatusOr<std::string> started = Unavailable("not started");
    for (int attempt = 0; attempt < 60 && !started.ok(); ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      shards_[1] =
          std::make_unique<ps::ShardServer>(fresh, std::make_shared<prometheus::Registry>());
      started = shards_[1]->Start();
    }
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    std::map<std::string, uint64_t> before;
    for (const auto& p : model_->params()) {
      if (auto t = shards_[0]->FindTable(p.name)) before[p.name] = t->version();
    }
    ASSERT_FALSE(before.empty()) << "no table of the model on shard 0";
    const Status st = learn();
    bool landed = false;
    for (const auto& [name, v] : before) landed |= shards_[0]->FindTable(name)->version() > v;
    ASSERT_FALSE(st.ok()) << "shard 1 holds none of the tables";
    ASSERT_TRUE(landed) << "shard 0 applied nothing: " << st.ToString();
    EXPECT_NE(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
    EXPECT_NE(st.message().find(kPartlyApplied), std::string::npos)
        << "a learn part of which was applied reads as not applied: " << st.ToString();
  }

  // One example whose gradient at `w` is finite with some element past half the float
  // range (two of them sum past it); empty if no feature value makes one.
  static std::vector<Example> HugeExample(Model& model, std::vector<std::vector<float>>& w) {
    ParamView view;
    for (auto& x : w) view.dense.push_back(x.data());
    view.sparse.assign(w.size(), nullptr);
    for (float v = 1e30f; v < 3e38f; v *= 1.5f) {
      const auto batch = Feats({{v, 0, 0, 0}}, {1});
      auto g = model.Gradients(batch, {}, view);
      if (!g.ok()) return {};
      bool finite = std::isfinite(g->loss), over_half = false;
      for (const auto& d : g->dense) {
        for (float x : d) {
          finite &= std::isfinite(x);
          over_half |= std::fabs(x) > std::numeric_limits<float>::max() / 2;
        }
      }
      if (finite && over_half) return batch;
    }
    return {};
  }

  static std::vector<Example> Feats(std::vector<std::vector<float>> xs, std::vector<int> ys) {
    std::vector<Example> out(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      out[i].features = xs[i];
      out[i].label = i < ys.size() ? ys[i] : -1;
    }
    return out;
  }

  // One service per member of `groups` (started in rank order: the leader waits for the
  // others' calls), each learning one example before the first round, until every
  // member gave up on the group: then each member's gradient must be in every table
  // exactly once, whoever pushed it.
  void RunGroupUntilItBreaks(std::vector<std::unique_ptr<GroupReducer>> groups) {
    auto model = CreateModel(Mlp());
    ASSERT_TRUE(model.ok());
    std::vector<std::unique_ptr<ps::PsClient>> clients;
    std::vector<std::unique_ptr<WorkerService>> members;
    for (auto& g : groups) {
      WorkerServiceOptions wo;
      wo.group = g.get();
      wo.group_round_ms = 1000;
      wo.table_template.optimizer_params["lr"] = 0.5;
      clients.push_back(Client(endpoints_));
      members.push_back(std::make_unique<WorkerService>(clients.back().get(), model->get(), wo));
      ASSERT_TRUE(members.back()->Start().ok());
    }
    const auto& params = (*model)->params();
    std::vector<std::vector<float>> w0;
    for (const auto& p : params) w0.push_back(PullDense(p.name));
    ParamView view;
    for (auto& w : w0) view.dense.push_back(w.data());
    view.sparse.assign(w0.size(), nullptr);
    const auto batch =
        Feats({{1, 0, 2, 0}, {0, 1, 0, -1}, {-1, 2, 0, 0.5}, {3, 1, 1, 1}}, {0, 2, 1, 1});
    std::vector<std::vector<float>> sum;
    for (size_t r = 0; r < members.size(); ++r) {
      auto grad = (*model)->Gradients({batch[r]}, {}, view);
      ASSERT_TRUE(grad.ok());
      if (r == 0) sum = grad->dense;
      for (size_t i = 0; r > 0 && i < sum.size(); ++i) {
        for (size_t j = 0; j < sum[i].size(); ++j) sum[i][j] += grad->dense[i][j];
      }
      auto l = members[r]->Learn("", {batch[r]});
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      EXPECT_EQ(l->outcome, LearnOutcome::kAccumulated);
    }
    const uint64_t deadline = NowMs() + 20000;
    auto active = [&] {
      return std::any_of(members.begin(), members.end(),
                         [](const auto& m) { return m->stats().group_active; });
    };
    while (active() && NowMs() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_FALSE(active());
    for (auto& m : members) EXPECT_TRUE(m->Stop().ok());
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<float> w1 = PullDense(params[i].name);
      for (size_t j = 0; j < w1.size(); ++j) {
        EXPECT_NEAR(w1[j], w0[i][j] - 0.5f * sum[i][j], 1e-5) << params[i].name << "[" << j << "]";
      }
    }
  }

  std::vector<std::unique_ptr<ps::ShardServer>> shards_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Tap>> taps_;
  std::unique_ptr<ps::PsClient> peek_, client_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<WorkerServer> server_;
  std::unique_ptr<WorkerClient> rpc_;
  std::string worker_endpoint_;
  bool throwing_model_ = false;  // StartWorker wraps the model in a ThrowingModel
};

TEST_F(WorkerServiceTest, AccumulationOfKExamplesEqualsOnePushOfTheSum) {
  WorkerServiceOptions o;
  o.accumulate_examples = 4;
  StartWorker(Mlp(), o);
  const auto& params = model_->params();
  // The parameters before any push, and each example's gradient against them.
  std::vector<std::vector<float>> w0;
  std::vector<uint64_t> version0;
  for (const auto& p : params) {
    ps::VersionVector v;
    w0.push_back(PullDense(p.name, &v));
    version0.push_back(*std::max_element(v.begin(), v.end()));
  }
  ParamView view;
  for (auto& w : w0) view.dense.push_back(w.data());
  view.sparse.assign(w0.size(), nullptr);
  auto batch = Feats({{1, 0, 2, 0}, {0, 1, 0, -1}, {3, 1, 1, 1}, {-1, 2, 0, 0.5}}, {0, 1, 2, 1});
  std::vector<std::vector<float>> sum(params.size());
  for (size_t i = 0; i < params.size(); ++i) sum[i].assign(params[i].size(), 0);
  for (size_t k = 0; k < batch.size(); ++k) {
    auto g = model_->Gradients({batch[k]}, {}, view);
    ASSERT_TRUE(g.ok());
    for (size_t i = 0; i < params.size(); ++i) {
      for (size_t j = 0; j < sum[i].size(); ++j) sum[i][j] += g->dense[i][j];
    }
    auto r = service_->Learn("", {batch[k]});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->outcome, k < 3 ? LearnOutcome::kAccumulated : LearnOutcome::kApplied) << k;
    EXPECT_EQ(r->dense_pushed, k == 3);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    ps::VersionVector v;
    std::vector<float> w1 = PullDense(params[i].name, &v);
    // Exactly one push was applied, and it was the sum: w1 = w0 - lr * sum.
    EXPECT_EQ(*std::max_element(v.begin(), v.end()), version0[i] + 1) << params[i].name;
    for (size_t j = 0; j < w1.size(); ++j) {
      EXPECT_NEAR(w1[j], w0[i][j] - 0.5f * sum[i][j], 1e-5) << params[i].name << "[" << j << "]";
    }
  }
}

TEST_F(WorkerServiceTest, LocalGroupPushesTheSumOfItsMembersOncePerRound) {
  // Two workers in one local group: only the leader pushes, the sum of both gradients.
  std::unique_ptr<GroupReducer> groups[2];
  std::thread joiner([&] {
    LocalGroupOptions o;
    o.rank = 1;
    o.size = 2;
    o.endpoint = "inproc://worker-service-group";
    o.timeout = std::chrono::milliseconds(3000);
    auto g = NewLocalGroup(o);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    groups[1] = std::move(*g);
  });
  LocalGroupOptions o;
  o.size = 2;
  o.endpoint = "inproc://worker-service-group";
  o.timeout = std::chrono::milliseconds(3000);
  auto g = NewLocalGroup(o);
  joiner.join();
  ASSERT_TRUE(g.ok() && groups[1]) << g.status().ToString();
  groups[0] = std::move(*g);
  auto model = CreateModel(Mlp());
  ASSERT_TRUE(model.ok());
  std::unique_ptr<ps::PsClient> clients[2] = {Client(endpoints_), Client(endpoints_)};
  std::unique_ptr<WorkerService> members[2];
  for (int r = 0; r < 2; ++r) {
    WorkerServiceOptions wo;
    wo.group = groups[r].get();
    wo.group_round_ms = 1000;  // both learns land well inside the first round
    wo.table_template.optimizer_params["lr"] = 0.5;
    members[r] = std::make_unique<WorkerService>(clients[r].get(), model->get(), wo);
    ASSERT_TRUE(members[r]->Start().ok());
  }
  const auto& params = (*model)->params();
  std::vector<std::vector<float>> w0;
  std::vector<uint64_t> v0;
  for (const auto& p : params) {
    ps::VersionVector v;
    w0.push_back(PullDense(p.name, &v));
    v0.push_back(*std::max_element(v.begin(), v.end()));
  }
  ParamView view;
  for (auto& w : w0) view.dense.push_back(w.data());
  view.sparse.assign(w0.size(), nullptr);
  const auto batch = Feats({{1, 0, 2, 0}, {0, 1, 0, -1}}, {0, 2});
  std::vector<std::vector<float>> sum;
  for (int r = 0; r < 2; ++r) {
    auto grad = (*model)->Gradients({batch[r]}, {}, view);
    ASSERT_TRUE(grad.ok());
    if (r == 0) sum = grad->dense;
    for (size_t i = 0; r == 1 && i < sum.size(); ++i) {
      for (size_t j = 0; j < sum[i].size(); ++j) sum[i][j] += grad->dense[i][j];
    }
    auto l = members[r]->Learn("", {batch[r]});
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->outcome, LearnOutcome::kAccumulated);
  }
  const uint64_t deadline = NowMs() + 5000;
  while (members[0]->stats().pushes < params.size() && NowMs() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    ps::VersionVector v;
    const std::vector<float> w1 = PullDense(params[i].name, &v);
    EXPECT_EQ(*std::max_element(v.begin(), v.end()), v0[i] + 1) << params[i].name;
    for (size_t j = 0; j < w1.size(); ++j) {
      EXPECT_NEAR(w1[j], w0[i][j] - 0.5f * sum[i][j], 1e-5) << params[i].name << "[" << j << "]";
    }
  }
  EXPECT_EQ(members[1]->stats().pushes, 0u) << "a non-leader pushed dense gradients";
  EXPECT_GT(members[1]->stats().group_rounds, 0u);
  for (auto& m : members) EXPECT_TRUE(m->Stop().ok());
}

// The group's sum of two finite gradients past half the float range was Inf: the
// leader's push was refused (NON_FINITE) and both members' learns, answered
// "accumulated", were lost. The leader saturates the sum, as the accumulator does.
TEST_F(WorkerServiceTest, ALocalGroupsSumOfHugeGradientsSaturatesInsteadOfOverflowing) {
  std::unique_ptr<GroupReducer> groups[2];
  LocalGroupOptions go;
  go.size = 2;
  go.endpoint = "inproc://worker-service-group-huge";
  go.timeout = std::chrono::milliseconds(3000);
  std::thread joiner([&] {
    LocalGroupOptions o = go;
    o.rank = 1;
    auto g = NewLocalGroup(o);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    groups[1] = std::move(*g);
  });
  auto g = NewLocalGroup(go);
  joiner.join();
  ASSERT_TRUE(g.ok() && groups[1]) << g.status().ToString();
  groups[0] = std::move(*g);
  auto model = CreateModel(Mlp());
  ASSERT_TRUE(model.ok());
  std::unique_ptr<ps::PsClient> clients[2] = {Client(endpoints_), Client(endpoints_)};
  std::unique_ptr<WorkerService> members[2];
  for (int r = 0; r < 2; ++r) {
    WorkerServiceOptions wo;
    wo.group = groups[r].get();
    wo.group_round_ms = 1000;  // both learns land well inside the first round
    wo.table_template.optimizer_params["lr"] = 0.5;
    members[r] = std::make_unique<WorkerService>(clients[r].get(), model->get(), wo);
    ASSERT_TRUE(members[r]->Start().ok());
  }
  const auto& params = (*model)->params();
  std::vector<std::vector<float>> w0;
  for (const auto& p : params) w0.push_back(PullDense(p.name));
  const std::vector<Example> huge = HugeExample(**model, w0);
  ASSERT_FALSE(huge.empty()) << "no feature value makes a finite gradient past half the range";
  for (int r = 0; r < 2; ++r) {
    auto l = members[r]->Learn("", huge);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->outcome, LearnOutcome::kAccumulated);
  }
  const uint64_t deadline = NowMs() + 5000;
  while (members[0]->stats().pushes < params.size() && NowMs() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const WorkerStats leader = members[0]->stats();
  EXPECT_EQ(leader.push_errors, 0u) << "the group's sum was pushed as Inf";
  EXPECT_EQ(leader.held.dropped_calls, 0u) << "learns answered 'accumulated' were lost";
  for (const auto& p : params) {
    ps::VersionVector v;
    const std::vector<float> w = PullDense(p.name, &v);
    EXPECT_GT(*std::max_element(v.begin(), v.end()), 0u) << p.name << " was never pushed";
    for (size_t j = 0; j < w.size(); ++j) {
      ASSERT_TRUE(std::isfinite(w[j])) << p.name << "[" << j << "] = " << w[j];
    }
  }
  for (auto& m : members) EXPECT_TRUE(m->Stop().ok());
}

// A GroupReducer that pauses before its `at`-th call (counted from 1), as a leader that
// is descheduled or swapped out between the calls of a round; or, with `dies`, stops
// there instead, as a member whose process died: that call is never made.
class FaultyGroup : public GroupReducer {
 public:
  FaultyGroup(std::unique_ptr<GroupReducer> inner, int at, std::chrono::milliseconds pause,
              bool dies = false)
      : inner_(std::move(inner)), at_(at), pause_(pause), dies_(dies) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status SumFloats(float* data, size_t n) override {
    if (Fault()) return Unavailable("this member died");
    return inner_->SumFloats(data, n);
  }
  Status MinU64(uint64_t* data, size_t n) override {
    if (Fault()) return Unavailable("this member died");
    return inner_->MinU64(data, n);
  }
  bool MayHaveCompleted() const override { return !died_ && inner_->MayHaveCompleted(); }

 private:
  bool Fault() {
    if (++calls_ < at_) return false;
    if (dies_) return died_ = true;
    if (calls_ == at_) std::this_thread::sleep_for(pause_);
    return false;
  }
  std::unique_ptr<GroupReducer> inner_;
  const int at_;
  const std::chrono::milliseconds pause_;
  const bool dies_;
  bool died_ = false;
  int calls_ = 0;
};

// Forms a local group of `timeouts.size()` members in this process (rank r waits
// timeouts[r] per call).
std::vector<std::unique_ptr<GroupReducer>> LocalGroupOf(
    const std::string& endpoint, const std::vector<std::chrono::milliseconds>& timeouts) {
  const int size = static_cast<int>(timeouts.size());
  std::vector<std::unique_ptr<GroupReducer>> groups(timeouts.size());
  std::vector<std::thread> joiners;
  for (int r = 0; r < size; ++r) {
    joiners.emplace_back([&, r] {
      LocalGroupOptions o;
      o.rank = r;
      o.size = size;
      o.endpoint = endpoint;
      o.timeout = timeouts[static_cast<size_t>(r)];
      auto g = NewLocalGroup(o);
      EXPECT_TRUE(g.ok()) << g.status().ToString();
      if (g.ok()) groups[static_cast<size_t>(r)] = std::move(*g);
    });
  }
  for (std::thread& t : joiners) t.join();
  return groups;
}

// The last call of a parameter's round (its MinU64) times out at the member while the
// leader, paused past the member's timeout, still completes it with the member's call
// and pushes the sum. The member must not push its own gradient for that parameter
// too: every member's gradient reaches each table exactly once.
TEST_F(WorkerServiceTest, AMemberThatTimesOutOnTheLastCallOfAParameterDoesNotPushItTwice) {
  constexpr auto kTimeout = std::chrono::milliseconds(1500);
  auto groups = LocalGroupOf("inproc://worker-service-group-pause", {kTimeout, kTimeout});
  ASSERT_TRUE(groups[0] && groups[1]);
  // The leader pauses before its third call (the first parameter's MinU64).
  groups[0] = std::make_unique<FaultyGroup>(std::move(groups[0]), 3, kTimeout + kTimeout / 3);
  RunGroupUntilItBreaks(std::move(groups));
}

// A member dies before the last call of a parameter's round: the leader fails that call
// and tells the member that made it, which then knows the sum is not pushed and pushes
// its own gradient (not lost).
TEST_F(WorkerServiceTest, AMemberToldThatTheLastCallFailedPushesItsOwnGradient) {
  using std::chrono::milliseconds;
  // Rank 1 waits longer than the leader: the leader's answer comes before its own timeout.
  auto groups = LocalGroupOf("inproc://worker-service-group-dies",
                             {milliseconds(1000), milliseconds(3000), milliseconds(3000)});
  ASSERT_TRUE(groups[0] && groups[1] && groups[2]);
  groups[2] = std::make_unique<FaultyGroup>(std::move(groups[2]), 3, milliseconds(0), true);
  RunGroupUntilItBreaks(std::move(groups));
}

// A per-table freshness bound naming a table the model does not have (a typo) is refused
// at start, naming the model's tables, instead of leaving the meant table on the default.
TEST_F(WorkerServiceTest, AFreshnessBoundOfAnUnknownTableIsRefusedAtStart) {
  auto model = CreateModel(Text());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto client = Client(endpoints_);
  WorkerServiceOptions o;
  o.table_template.optimizer_params["lr"] = 0.5;
  o.cache.tables["text/out.wieght"].max_age_ms = 50;
  WorkerService service(client.get(), model->get(), o);
  const Status st = service.Start();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("'text/out.wieght'"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("text/out.weight"), std::string::npos) << st.ToString();
}

TEST_F(WorkerServiceTest, TimeTriggerPushesAnAccumulatedGradientWithoutMoreLearns) {
  WorkerServiceOptions o;
  o.accumulate_examples = 1000;
  o.accumulate_ms = 50;
  StartWorker(Mlp(), o);
  const std::string table = model_->params()[0].name;
  ps::VersionVector v0, v1;
  PullDense(table, &v0);
  auto r = service_->Learn("", Feats({{1, 2, 3, 4}}, {2}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, LearnOutcome::kAccumulated);
  const uint64_t deadline = NowMs() + 3000;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    PullDense(table, &v1);
  } while (v1 == v0 && NowMs() < deadline);
  EXPECT_NE(v1, v0) << "the timed flush never pushed";
}

TEST_F(WorkerServiceTest, ReadsNeverExceedTheAgeBoundWhileOthersPush) {
  WorkerServiceOptions o;
  o.cache.dense.max_age_ms = 40;
  o.cache.refresh_interval_ms = 0;  // reads themselves must enforce the bound
  o.cache.notices = false;          // with notices a copy is current until one says not
  StartWorker(Mlp(), o);
  const std::string table = model_->params()[0].name;
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    auto other = Client(endpoints_);
    std::vector<float> g(model_->params()[0].size(), 0.01f);
    while (!stop) {
      static_cast<void>(other->PushDense(table, g.data(), {}, nullptr).Wait());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  uint64_t first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    auto r = service_->Infer("", Feats({{1, 1, 1, 1}}, {}));
    ASSERT_TRUE(r.ok());
    EXPECT_LE(r->params_age_ms, 40 + 5);  // +5: the call's own duration
    if (i == 0) first = r->version;
    last = r->version;
    std::this_thread::sleep_for(std::chrono::milliseconds(7));
  }
  stop = true;
  pusher.join();
  EXPECT_GT(last, first) << "reads never saw the other client's pushes";
}

TEST_F(WorkerServiceTest, VersionBoundZeroReadsOwnPushes) {
  WorkerServiceOptions o;
  o.cache.dense.max_age_ms = -1;  // age alone would never re-pull
  o.cache.dense.max_versions_behind = 0;
  o.cache.refresh_interval_ms = 0;
  StartWorker(Mlp(), o);
  for (int i = 0; i < 5; ++i) {
    auto l = service_->Learn("", Feats({{1, 0, 0, 1}}, {1}));
    ASSERT_TRUE(l.ok());
    ASSERT_EQ(l->outcome, LearnOutcome::kApplied);
    auto r = service_->Infer("", Feats({{1, 0, 0, 1}}, {}));
    ASSERT_TRUE(r.ok());
    EXPECT_GE(r->version, l->version) << "infer read a copy older than its own push";
  }
}

TEST_F(WorkerServiceTest, ALearnIsVisibleToTheNextInferEvenWithinTheAgeBound) {
  WorkerServiceOptions o;
  o.cache.dense.max_age_ms = 60000;  // only read-your-writes can make the next read fresh
  o.cache.sparse.max_age_ms = 60000;
  o.cache.refresh_interval_ms = 0;
  StartWorker(Text(), o);
  const std::vector<Example> ex = {Example{"lovely sunny day", {}, 1}};
  auto before = service_->Infer("", ex);
  ASSERT_TRUE(before.ok());
  auto l = service_->Learn("", ex);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->outcome, LearnOutcome::kApplied);
  auto after = service_->Infer("", ex);
  ASSERT_TRUE(after.ok());
  EXPECT_GT(after->predictions[0].scores[1], before->predictions[0].scores[1])
      << "the learn's own update was not read back";
  EXPECT_GE(after->version, l->version);
}

TEST_F(WorkerServiceTest, RpcPipelinedCallsOfOneSessionRunInOrderAndReadTheirLearns) {
  // A learn's reply comes from its push's callback, not from a waiting handler thread;
  // the session's later requests must still wait for it. Sent without waiting for any
  // answer: each infer must read the learn sent before it, and one session's answers
  // come back in the order sent.
  WorkerServiceOptions o;
  o.cache.dense.max_age_ms = 60000;  // only read-your-writes can make the next read fresh
  o.cache.sparse.max_age_ms = 60000;
  o.cache.refresh_interval_ms = 0;
  o.cache.notices = false;
  StartWorker(Text(), o);
  constexpr int kRounds = 20;
  std::mutex mu;
  std::vector<int> order;  // call indices of session "s", as answered
  std::vector<StatusOr<json>> got(2 * kRounds, Internal("no answer"));
  std::atomic<int> answered{0};
  for (int i = 0; i < 2 * kRounds; ++i) {
    const bool learn = i % 2 == 0;
    json body = {{"session", "s"}, {"text", "lovely sunny day"}};
    if (learn) body["label"] = "pos";
    rpc_->CallAsync(learn ? Op::kLearn : Op::kInfer, body, std::chrono::seconds(20),
                    [&, i](StatusOr<json> r) {
                      std::lock_guard<std::mutex> lock(mu);
                      got[i] = std::move(r);
                      order.push_back(i);
                      ++answered;
                    });
    // Another session and sessionless learns in between: they need not wait.
    rpc_->CallAsync(Op::kLearn, {{"session", "t"}, {"text", "dull grey day"}, {"label", "neg"}},
                    std::chrono::seconds(20), [&](StatusOr<json>) { ++answered; });
    rpc_->CallAsync(Op::kLearn, {{"text", "dull grey day"}, {"label", "neg"}},
                    std::chrono::seconds(20), [&](StatusOr<json>) { ++answered; });
  }
  for (int i = 0; i < 2000 && answered.load() < 6 * kRounds; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(answered.load(), 6 * kRounds);
  std::lock_guard<std::mutex> lock(mu);
  std::vector<int> sent(2 * kRounds);
  for (int i = 0; i < 2 * kRounds; ++i) sent[i] = i;
  EXPECT_EQ(order, sent) << "one session's answers came back out of order";
  for (int i = 1; i < 2 * kRounds; i += 2) {
    ASSERT_TRUE(got[i - 1].ok()) << got[i - 1].status().ToString();
    ASSERT_TRUE(got[i].ok()) << got[i].status().ToString();
    const json& learned = (*got[i - 1])["versions"];
    const json& read = (*got[i])["versions"];
    ASSERT_FALSE(learned.empty());
    for (const auto& [table, per_shard] : learned.items()) {
      ASSERT_TRUE(read.contains(table)) << table;
      for (size_t k = 0; k < per_shard.size(); ++k) {
        // 0: the learn touched no row of that shard.
        if (per_shard[k].get<uint64_t>() == 0) continue;
        EXPECT_GE(read[table][k].get<uint64_t>(), per_shard[k].get<uint64_t>())
            << "infer " << i << " did not read the learn before it (" << table << ", shard " << k
            << ")";
      }
    }
  }
}

// A call whose model pass throws (bad_alloc) is answered with an error, and leaves
// nothing behind: before, a call of a session resumed after its learn threw out of
// Handle, its session stayed parked and every later call of it was never answered; the
// infer batcher's pass stayed counted as running, so with one pass at a time no infer
// ran again.
TEST_F(WorkerServiceTest, ACallWhoseModelThrowsIsAnsweredAndItsSessionGoesOn) {
  WorkerServiceOptions o;
  o.infer_passes = 1;
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  o.cache.dense.max_age_ms = 600000;  // infers read the cached copy with shard 1 down
  throwing_model_ = true;
  StartWorker(Mlp(), o, /*tap=*/false, std::chrono::milliseconds(1000));
  ASSERT_TRUE(rpc_->Call(Op::kInfer, {{"features", {1, 0, 0, 1}}}).ok());  // warms the cache
  // Shard 1 down: the learn's push waits out its timeout, and the session's next calls
  // park behind it; they run (resumed) once it is answered.
  shards_[1]->Stop();
  std::mutex mu;
  std::vector<StatusOr<json>> got(3, Internal("no answer"));
  std::atomic<int> answered{0};
  const std::vector<std::pair<Op, json>> calls = {
      {Op::kLearn, {{"session", "s"}, {"features", {1, 0, 0, 1}}, {"label", "a"}}},
      {Op::kInfer, {{"session", "s"}, {"features", {ThrowingModel::kThrowOn, 0, 0, 1}}}},
      {Op::kInfer, {{"session", "s"}, {"features", {1, 0, 0, 1}}}}};
  for (size_t i = 0; i < calls.size(); ++i) {
    rpc_->CallAsync(calls[i].first, calls[i].second, std::chrono::seconds(8),
                    [&, i](StatusOr<json> r) {
                      std::lock_guard<std::mutex> lock(mu);
                      got[i] = std::move(r);
                      ++answered;
                    });
  }
  for (int i = 0; i < 1000 && answered.load() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(answered.load(), 3);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_FALSE(got[0].ok()) << "the learn's push cannot reach shard 1";
  EXPECT_EQ(got[1].status().code(), StatusCode::kInternal) << got[1].status().ToString();
  EXPECT_NE(got[1].status().message().find("bad_alloc"), std::string::npos)
      << got[1].status().ToString();
  EXPECT_TRUE(got[2].ok()) << "the session's call after the one that threw: "
                           << got[2].status().ToString();
  // One pass at a time: the pass that threw must have ended.
  auto later = rpc_->Call(Op::kInfer, {{"features", {0, 1, 1, 0}}}, std::chrono::seconds(5));
  EXPECT_TRUE(later.ok()) << later.status().ToString();
  StopWithAShardDown();
}

// PS requests of each op the worker has sent so far, through the taps.
std::map<Op, int> OpsSent(const std::vector<std::unique_ptr<Tap>>& taps) {
  std::map<Op, int> n;
  for (const auto& tap : taps) {
    for (const auto& frames : tap->requests()) {
      if (frames.empty()) continue;
      auto h = DecodeHeader(frames[0].data(), frames[0].size());
      if (h.ok()) ++n[h->op];
    }
  }
  return n;
}

TEST_F(WorkerServiceTest, ALearnIsOnePushRoundTripAndStillReadsItsOwnWrites) {
  WorkerServiceOptions o;
  o.cache.dense.max_age_ms = 60000;
  o.cache.sparse.max_age_ms = 60000;
  StartWorker(Mlp(), o, /*tap=*/true);
  auto warm = service_->Learn("", Feats({{1, 0, 0, 1}}, {1}));
  ASSERT_TRUE(warm.ok()) << warm.status().ToString();
  std::map<Op, int> before = OpsSent(taps_);
  uint64_t last_version = warm->version;
  for (int i = 0; i < 10; ++i) {
    auto l = service_->Learn("", Feats({{1, 0, 0, 1}}, {1}));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ASSERT_EQ(l->outcome, LearnOutcome::kApplied);
    EXPECT_GT(l->version, last_version);
    last_version = l->version;
    auto r = service_->Infer("", Feats({{1, 0, 0, 1}}, {}));
    ASSERT_TRUE(r.ok());
    EXPECT_GE(r->version, l->version) << "infer read a copy older than its own push";
    for (const auto& [table, shards] : l->versions) {
      ASSERT_EQ(r->versions[table].size(), shards.size());
      for (size_t s = 0; s < shards.size(); ++s) EXPECT_GE(r->versions[table][s], shards[s]);
    }
  }
  std::map<Op, int> after = OpsSent(taps_);
  EXPECT_EQ(after[Op::kPushBatch] - before[Op::kPushBatch], 10 * 2)
      << "one push_batch per shard per learn, for all its dense tables";
  EXPECT_EQ(after[Op::kPushDense] - before[Op::kPushDense], 0);
  EXPECT_EQ(after[Op::kPullDense] - before[Op::kPullDense], 0)
      << "the pushes' replies carry the new values: nothing is pulled back";
  // The copy the worker installed is what the shards hold.
  auto other = Client(endpoints_);
  for (const ParamInfo& p : model_->params()) {
    std::vector<float> pulled(p.size());
    ASSERT_TRUE(other->PullDense(p.name, pulled.data(), nullptr).Wait().ok());
    auto cached = service_->cache().Dense(p.name);
    ASSERT_TRUE(cached.ok());
    EXPECT_EQ((*cached)->values, pulled) << p.name;
  }
}

TEST_F(WorkerServiceTest, WithoutBatchPushesEachDenseTableIsAMessageOfItsOwn) {
  WorkerServiceOptions o;
  o.cache.dense.max_age_ms = 60000;
  o.batch_pushes = false;
  StartWorker(Mlp(), o, /*tap=*/true);
  ASSERT_TRUE(service_->Learn("", Feats({{1, 0, 0, 1}}, {1})).ok());
  std::map<Op, int> before = OpsSent(taps_);
  uint64_t last_version = 0;
  for (int i = 0; i < 5; ++i) {
    auto l = service_->Learn("", Feats({{1, 0, 0, 1}}, {1}));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_GT(l->version, last_version);
    last_version = l->version;
  }
  std::map<Op, int> after = OpsSent(taps_);
  const int dense_tables = static_cast<int>(model_->params().size());
  EXPECT_EQ(after[Op::kPushDense] - before[Op::kPushDense], 5 * dense_tables * 2)
      << "one push per dense table and shard per learn";
  EXPECT_EQ(after[Op::kPushBatch] - before[Op::kPushBatch], 0);
}

TEST_F(WorkerServiceTest, WithoutReadOwnWritesTheCachedCopyServesUntilItsBound) {
  WorkerServiceOptions o;
  o.cache.dense.max_age_ms = 60000;
  o.cache.sparse.max_age_ms = 60000;
  o.cache.refresh_interval_ms = 0;
  o.read_own_writes = false;
  StartWorker(Text(), o);
  const std::vector<Example> ex = {Example{"lovely sunny day", {}, 1}};
  auto before = service_->Infer("", ex);
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(service_->Learn("", ex).ok());
  auto after = service_->Infer("", ex);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->predictions[0].scores, before->predictions[0].scores);
  EXPECT_EQ(after->version, before->version);
}

// An infer reports one version per shard for every table, 0 where it read no row of a
// shard: here a text with no words reads no embedding row at all.
TEST_F(WorkerServiceTest, AnInferThatReadsNoRowsReportsZeroPerShard) {
  StartWorker(Text(), WorkerServiceOptions());
  auto r = service_->Infer("", {Example{"?!", {}, -1}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->versions.count("text/embed")) << "no versions for the embedding table";
  EXPECT_EQ(r->versions.at("text/embed"), (ps::VersionVector{0, 0}));
  for (const auto& [table, per_shard] : r->versions) EXPECT_EQ(per_shard.size(), 2u) << table;
}

TEST_F(WorkerServiceTest, ContextChangesOnlyItsOwnSessionsPredictions) {
  StartWorker(Text(), WorkerServiceOptions());
  ASSERT_TRUE(service_->context().Set("A", {"terrible awful horrible context"}, {}).ok());
  const std::vector<Example> ex = {Example{"the film was fine", {}, -1}};
  auto none = service_->Infer("", ex);
  auto a = service_->Infer("A", ex);
  auto b = service_->Infer("B", ex);
  ASSERT_TRUE(none.ok() && a.ok() && b.ok());
  EXPECT_NE(a->predictions[0].scores, none->predictions[0].scores);
  EXPECT_EQ(b->predictions[0].scores, none->predictions[0].scores);
  // Clearing A's context gives A the context-free answer again.
  EXPECT_TRUE(service_->context().Clear("A"));
  auto a2 = service_->Infer("A", ex);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->predictions[0].scores, none->predictions[0].scores);
}

// Header keys a PS request may carry (docs/protocol.md); anything else would be a leak.
bool OnlyPsHeaderKeys(const std::string& frame, bool allow_spec, std::string* bad) {
  msgpack::object_handle oh = msgpack::unpack(frame.data(), frame.size());
  const msgpack::object& o = oh.get();
  if (o.type != msgpack::type::MAP) return false;
  static const std::set<std::string> kAllowed = {"v",   "op",    "rid",  "sid",  "seq",
                                                 "tbl", "shape", "base", "flags"};
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    std::string key = o.via.map.ptr[i].key.as<std::string>();
    if (!kAllowed.count(key) && !(allow_spec && key == "spec")) {
      *bad = key;
      return false;
    }
  }
  return true;
}

// Context features of another length than the model's context_dim were taken, and
// every later call of the session failed ("context has 3 features, model context_dim
// is 2"). They are refused when set, naming the count the model takes.
TEST_F(WorkerServiceTest, ContextFeaturesOfTheWrongLengthAreRefusedWhenSet) {
  ModelOptions m = Mlp();
  m.context_dim = 2;
  StartWorker(m, WorkerServiceOptions());
  auto wrong = rpc_->Call(Op::kContextSet, {{"session", "s"}, {"features", {1, 2, 3}}});
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("the model takes 2"), std::string::npos)
      << wrong.status().ToString();
  EXPECT_FALSE(service_->context().Get("s").has_value()) << "the refused context was kept";
  EXPECT_FALSE(service_->context().Set("s", {}, {1, 2, 3}).ok()) << "in-process callers too";
  // The session goes on without it; the right length, or none, is taken.
  EXPECT_TRUE(rpc_->Call(Op::kInfer, {{"session", "s"}, {"features", {1, 0, 0, 1}}}).ok());
  ASSERT_TRUE(rpc_->Call(Op::kContextSet, {{"session", "s"}, {"features", {1, 2}}}).ok());
  EXPECT_TRUE(rpc_->Call(Op::kInfer, {{"session", "s"}, {"features", {1, 0, 0, 1}}}).ok());
  EXPECT_TRUE(rpc_->Call(Op::kContextSet, {{"session", "t"}, {"text", "no features"}}).ok());
}

TEST_F(WorkerServiceTest, PushesCarryOnlyParameterGradientsNeverContext) {
  StartWorker(Text(), WorkerServiceOptions(), /*tap=*/true);
  const std::string marker = "zebracontextmarker";
  ASSERT_TRUE(service_->context().Set("A", {marker + " private words"}, {}).ok());
  auto r = service_->Learn("A", {Example{"great movie", {}, 1}, Example{"bad plot", {}, 0}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->sparse_rows_pushed, 0u);
  size_t pushes = 0, sparse_pushes = 0;
  for (auto& tap : taps_) {
    for (const auto& frames : tap->requests()) {
      ASSERT_FALSE(frames.empty());
      auto h = DecodeHeader(frames[0].data(), frames[0].size());
      ASSERT_TRUE(h.ok());
      std::string bad;
      const bool spec_allowed = h->op == Op::kCreateTable || h->op == Op::kWatch;
      EXPECT_TRUE(OnlyPsHeaderKeys(frames[0], spec_allowed, &bad))
          << "unexpected header key " << bad;
      // Only create_table carries a spec: the table's shape and rules, nothing else.
      if (h->op == Op::kWatch) {
        // Table names and versions only: "t.<table>" of the model's tables, "wait_ms".
        for (const auto& kv : h->spec) {
          const std::string& k = kv.first;
          const std::string& v = kv.second;
          const auto& params = model_->params();
          const bool table = k.rfind("t.", 0) == 0 &&
                             std::any_of(params.begin(), params.end(),
                                         [&](const ParamInfo& p) { return "t." + p.name == k; });
          EXPECT_TRUE(k == "wait_ms" || table) << "watch spec key " << k;
          EXPECT_EQ(v.find_first_not_of("0123456789"), std::string::npos) << k << "=" << v;
        }
      } else if (h->op != Op::kCreateTable) {
        EXPECT_TRUE(h->spec.empty());
      }
      for (const auto& f : frames) {
        EXPECT_EQ(f.find(marker), std::string::npos) << "context text left the worker";
        EXPECT_EQ(f.find("\"A\""), std::string::npos);
      }
      // A push_batch holds whole pushes: each is checked as one sent alone.
      Frames as_frames;
      for (const std::string& f : frames) as_frames.push_back(Frame::FromString(f));
      std::vector<Frames> subs;
      if (h->op == Op::kPushBatch) {
        auto split = SplitFrameGroups(h->shape, as_frames);
        ASSERT_TRUE(split.ok()) << split.status().ToString();
        subs = std::move(split).value();
      } else {
        subs.push_back(as_frames);
      }
      for (const Frames& sub : subs) {
        auto sh = DecodeHeader(sub[0].data(), sub[0].size());
        ASSERT_TRUE(sh.ok());
        if (sh->op != Op::kPushSparse && sh->op != Op::kPushDense) continue;
        EXPECT_TRUE(OnlyPsHeaderKeys(std::string(sub[0].data(), sub[0].size()), false, &bad))
            << "unexpected header key " << bad;
        EXPECT_TRUE(sh->spec.empty());
        ++pushes;
        sparse_pushes += sh->op == Op::kPushSparse;
        // Payload is exactly the gradient: keys + rows (sparse) or the dense slice.
        const size_t payload_frames = sh->op == Op::kPushSparse ? 2 : 1;
        EXPECT_EQ(sub.size(), 1 + payload_frames);
      }
    }
  }
  EXPECT_GT(pushes, 0u);
  EXPECT_GT(sparse_pushes, 0u) << "the text model's embedding rows were pushed";
}

TEST_F(WorkerServiceTest, NonFiniteLossIsRefusedAndNothingIsPushed) {
  StartWorker(Mlp(), WorkerServiceOptions());
  const std::string table = model_->params()[0].name;
  ps::VersionVector v0, v1;
  PullDense(table, &v0);
  auto r = service_->Learn("", Feats({{3e38f, 3e38f, 3e38f, 3e38f}}, {0}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNonFinite) << r.status().ToString();
  EXPECT_NE(r.status().message().find("nothing was pushed"), std::string::npos);
  PullDense(table, &v1);
  EXPECT_EQ(v0, v1);
  EXPECT_EQ(service_->stats().rejected_nonfinite, 1u);
  EXPECT_TRUE(service_->Learn("", Feats({{1, 1, 1, 1}}, {0})).ok());  // still serving
}

// Huge finite features make a finite gradient that two of overflow: the accumulator
// summed them to Inf, the shard refused the push (NON_FINITE, a refusal for good), and
// the first learn, answered "accumulated", was lost. The sum now saturates at the float
// range, as the shards' own accumulation does: both learns land, the model stays finite.
TEST_F(WorkerServiceTest, AccumulatedHugeGradientsSaturateInsteadOfOverflowing) {
  WorkerServiceOptions o;
  o.accumulate_examples = 2;
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  o.cache.dense.max_age_ms = 600000;  // both learns read the same copy
  StartWorker(Mlp(), o);
  const auto& params = model_->params();
  std::vector<std::vector<float>> w0;
  for (const auto& p : params) w0.push_back(PullDense(p.name));
  const std::vector<Example> huge = HugeExample(*model_, w0);
  ASSERT_FALSE(huge.empty()) << "no feature value makes a finite gradient past half the range";

  auto first = service_->Learn("", huge);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->outcome, LearnOutcome::kAccumulated);
  auto second = service_->Learn("", huge);
  EXPECT_TRUE(second.ok()) << "the sum of two finite gradients was pushed as Inf: "
                           << second.status().ToString();
  EXPECT_EQ(service_->stats().held.dropped_calls, 0u) << "a learn answered 'accumulated' was lost";
  for (const auto& p : params) {
    ps::VersionVector v;
    const std::vector<float> w = PullDense(p.name, &v);
    EXPECT_GT(*std::max_element(v.begin(), v.end()), 0u) << p.name << " was never pushed";
    for (size_t j = 0; j < w.size(); ++j) {
      ASSERT_TRUE(std::isfinite(w[j])) << p.name << "[" << j << "] = " << w[j];
    }
  }
  EXPECT_TRUE(service_->Learn("", Feats({{1, 1, 1, 1}}, {0})).ok());  // still serving
}

TEST_F(WorkerServiceTest, LocalStepsPushOneDeltaEveryHLearns) {
  WorkerServiceOptions o;
  o.local_steps = 3;
  o.local_lr = 0.1;
  StartWorker(Mlp(), o);
  const std::string table = model_->params()[0].name;
  ps::VersionVector v0, v;
  const std::vector<float> w0 = PullDense(table, &v0);
  for (int i = 0; i < 3; ++i) {
    auto r = service_->Learn("", Feats({{1, -1, 2, 0}}, {i % 3}));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->dense_pushed, i == 2) << i;
    PullDense(table, &v);
    if (i < 2) {
      EXPECT_EQ(v, v0) << "pushed before the H-th local step";
    }
  }
  EXPECT_NE(v, v0);
  EXPECT_NE(PullDense(table), w0);
}

// A local-steps delta whose push fails (a shard down: the outcome is unknown, and it was
// applied on the shards that answered) is not sent again inside the next delta: the local
// copy starts over from the PS. Before, the next learn pushed the same H steps again, and
// the shards that had applied them applied them twice.
TEST_F(WorkerServiceTest, AFailedLocalStepsDeltaIsNotPushedAgain) {
  WorkerServiceOptions o;
  o.local_steps = 2;
  o.local_lr = 0.1;
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  o.cache.dense.max_age_ms = 600000;  // learns read the cached copy, not a pull
  StartWorker(Mlp(), o, /*tap=*/false, std::chrono::milliseconds(1000));
  const std::string table = model_->params()[0].name;
  std::shared_ptr<ps::Table> on0 = shards_[0]->FindTable(table);
  ASSERT_NE(on0, nullptr);
  auto learn = [&] { return service_->Learn("", Feats({{1, -1, 2, 0}}, {1})).status(); };
  ASSERT_TRUE(learn().ok());  // local step 1 of 2: nothing pushed
  const uint64_t before = on0->version();
  shards_[1]->Stop();
  EXPECT_FALSE(learn().ok()) << "step 2 pushes its delta, and shard 1 is down";
  const uint64_t after_failed = on0->version();
  EXPECT_EQ(after_failed, before + 1) << "shard 0 applied its part of the delta";
  EXPECT_FALSE(learn().ok());
  EXPECT_EQ(on0->version(), after_failed)
      << "the failed delta was pushed again: shard 0 applied its steps twice";
  StopWithAShardDown();
}

// Accumulated learns were answered "accumulated" (taken); when the push of their sum
// failed (a shard down) the sum was dropped and they were lost. It is held and pushed
// again with the same (sender, seq) once the shard is back: the shard that applied it
// at the first attempt does not apply it twice. While held bytes are over the cap, new
// learns are refused.
TEST_F(WorkerServiceTest, AccumulatedLearnsWhosePushFailedArePushedOnceTheShardIsBack) {
  // Shard 1 restarts from its checkpoint, on a port no one else takes meanwhile.
  const std::string dir = ::testing::TempDir() + "/held-pushes-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  ps::ShardServerOptions o1;
  o1.shard = 1;
  o1.num_shards = 2;
  o1.listen = "tcp://127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
  o1.checkpoint_dir = dir;
  auto start_shard1 = [&] {
    StatusOr<std::string> started = Unavailable("not started");
    for (int attempt = 0; attempt < 60 && !started.ok(); ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      shards_[1] = std::make_unique<ps::ShardServer>(o1, std::make_shared<prometheus::Registry>());
      started = shards_[1]->Start();
    }
    ASSERT_TRUE(started.ok()) << started.status().ToString();
  };
  shards_[1]->Stop();
  start_shard1();
  endpoints_[1] = o1.listen;
  peek_ = Client(endpoints_);

  WorkerServiceOptions o;
  o.accumulate_examples = 2;
  o.held_retry_ms = 50;
  o.max_held_bytes = 1;  // one held push is over it
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  o.cache.dense.max_age_ms = 600000;  // learns read the cached copy, not a pull
  StartWorker(Mlp(), o, /*tap=*/false, std::chrono::milliseconds(1000));
  // Two examples at once: pushed at once, and the cache holds what it pushed.
  ASSERT_TRUE(service_->Learn("", Feats({{1, 1, 0, 0}, {0, 0, 1, 1}}, {0, 2})).ok());
  const auto& params = model_->params();
  std::vector<std::vector<float>> w0;
  std::vector<uint64_t> v0_on0;
  for (const auto& p : params) {
    w0.push_back(PullDense(p.name));
    v0_on0.push_back(shards_[0]->FindTable(p.name)->version());
  }
  ParamView view;
  for (auto& w : w0) view.dense.push_back(w.data());
  view.sparse.assign(w0.size(), nullptr);
  const auto batch = Feats({{1, -1, 2, 0}, {0, 2, -1, 1}}, {1, 0});
  std::vector<std::vector<float>> sum;  // what the accumulator sums: one gradient per learn
  for (const Example& e : batch) {
    auto g = model_->Gradients({e}, {}, view);
    ASSERT_TRUE(g.ok());
    if (sum.empty()) sum.assign(g->dense.size(), {});
    for (size_t i = 0; i < sum.size(); ++i) {
      sum[i].resize(g->dense[i].size(), 0.0f);
      for (size_t j = 0; j < sum[i].size(); ++j) sum[i][j] += g->dense[i][j];
    }
  }

  shards_[1]->Stop();  // writes its checkpoint
  auto first = service_->Learn("", {batch[0]});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->outcome, LearnOutcome::kAccumulated);
  // The second fills the accumulator: the push of both fails on shard 1.
  auto second = service_->Learn("", {batch[1]});
  ASSERT_TRUE(second.ok()) << "the push of learns answered 'accumulated' failed and the "
                              "learn that made it reads as failed: "
                           << second.status().ToString();
  EXPECT_EQ(second->outcome, LearnOutcome::kAccumulated);
  const HeldPushes::Stats held = service_->stats().held;
  EXPECT_GT(held.pushes, 0u);
  EXPECT_EQ(held.calls, 2 * held.pushes);
  auto refused = service_->Learn("", {batch[0]});
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("--max-held-bytes"), std::string::npos)
      << refused.status().ToString();

  start_shard1();
  const uint64_t deadline = NowMs() + 20000;
  while (service_->stats().held.pushes > 0 && NowMs() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(service_->stats().held.pushes, 0u) << "the held pushes were never taken";
  for (size_t i = 0; i < params.size(); ++i) {
    // Shard 0 took the first attempt; the retries were duplicates there.
    EXPECT_EQ(shards_[0]->FindTable(params[i].name)->version(), v0_on0[i] + 1) << params[i].name;
    const std::vector<float> w1 = PullDense(params[i].name);
    for (size_t j = 0; j < w1.size(); ++j) {
      EXPECT_NEAR(w1[j], w0[i][j] - 0.5f * sum[i][j], 1e-5) << params[i].name << "[" << j << "]";
    }
  }
  EXPECT_TRUE(service_->Learn("", {batch[0]}).ok()) << "nothing held: learns are taken again";
  server_->Stop();
  EXPECT_TRUE(service_->Stop().ok());
  service_.reset();
  shards_[1]->Stop();
  std::filesystem::remove_all(dir);
}

// Tables whose shards keep state per sender (block bound mode's clocks, DC-ASGD's
// backups) cannot take a held push, which has a sender of its own: with
// --accumulate-examples > 1 a learn was answered "accumulated" and lost once the push of
// its sum failed (a shard down). Such a worker is now refused at start, naming the flags.
void WorkerServiceTest::ExpectNoLearnAnsweredAccumulatedIsLost(ps::TableSpec table_template,
                                                               const std::string& flag) {
  ModelOptions m = MlpFor(table_template.staleness + "-" + flag.substr(2));
  auto model = CreateModel(m);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  WorkerServiceOptions o;
  o.table_template = std::move(table_template);
  o.table_template.optimizer_params["lr"] = 0.5;
  o.accumulate_examples = 2;
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  o.cache.dense.max_age_ms = 600000;  // learns read the cached copy, not a pull
  auto client = Client(endpoints_, std::chrono::milliseconds(400));
  WorkerService service(client.get(), model->get(), o);
  const Status started = service.Start();
  if (!started.ok()) {
    EXPECT_EQ(started.code(), StatusCode::kInvalidArgument) << started.ToString();
    EXPECT_NE(started.message().find("--accumulate-examples"), std::string::npos)
        << started.ToString();
    EXPECT_NE(started.message().find(flag), std::string::npos) << started.ToString();
    return;
  }
  ASSERT_TRUE(service.Learn("", Feats({{1, 1, 0, 0}, {0, 0, 1, 1}}, {0, 2})).ok());
  const auto one = Feats({{1, -1, 2, 0}}, {1});
  auto first = service.Learn("", one);  // pulls (DC-ASGD: not installed from the push)
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->outcome, LearnOutcome::kAccumulated);
  shards_[1]->Stop();
  auto second = service.Learn("", one);  // its push of both fails on shard 1
  EXPECT_TRUE(second.ok() || service.stats().held.pushes > 0)
      << "the first learn was answered 'accumulated' and is lost: " << second.status().ToString();
  static_cast<void>(service.Stop());
}

TEST_F(WorkerServiceTest, NoLearnAnsweredAccumulatedIsLostOnADcAsgdTable) {
  ps::TableSpec t;
  t.staleness = "dc_constant";
  ExpectNoLearnAnsweredAccumulatedIsLost(t, "--staleness-policy");
}

TEST_F(WorkerServiceTest, NoLearnAnsweredAccumulatedIsLostOnABlockBoundTable) {
  ps::TableSpec t;
  t.max_staleness = 100;
  t.bound_mode = ps::BoundMode::kBlock;
  ExpectNoLearnAnsweredAccumulatedIsLost(t, "--bound-mode");
}

// Held pushes share one sender, and a shard remembers the last ps::Dedup::kWindow seqs of
// a sender. With shard 1 down, every accumulated push was held while shard 0 took each:
// once 4096 newer ones had passed there, shard 0 answered a retry of the oldest "below the
// dedup window" (FAILED_PRECONDITION, a refusal for good), and it was dropped, lost on
// shard 1 too. Learns are now refused before the newest push gets that far ahead.
TEST_F(WorkerServiceTest, AHeldPushIsNotDroppedWhenNewerPushesPassTheDedupWindow) {
  WorkerServiceOptions o;
  o.accumulate_examples = 2;
  o.reply_when = ReplyWhen::kQueued;  // learns do not wait out the failed pushes
  o.max_inflight_pushes = 100000;
  o.held_retry_ms = 50;
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  o.cache.dense.max_age_ms = 600000;  // learns read the cached copy, not a pull
  StartWorker(Mlp(), o, /*tap=*/false, std::chrono::milliseconds(200));
  ASSERT_TRUE(service_->Learn("", Feats({{1, 1, 0, 0}, {0, 0, 1, 1}}, {0, 2})).ok());
  size_t dense = 0;
  for (const auto& p : model_->params()) dense += p.kind == ParamKind::kDense ? 1 : 0;
  ASSERT_GT(dense, 0u);

  shards_[1]->Stop();
  const auto one = Feats({{1, -1, 2, 0}}, {1});
  // Two learns make one push per dense table: enough for 4096 + 256 pushes.
  const size_t learns = 2 * (ps::Dedup::kWindow + 256) / dense + 2;
  Status refused;
  for (size_t i = 0; i < learns && refused.ok(); ++i) {
    auto r = service_->Learn("", one);
    if (!r.ok()) refused = r.status();
  }
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("dedup window"), std::string::npos) << refused.ToString();
  // Retries of the held pushes go on meanwhile, to shard 0 as well.
  const uint64_t deadline = NowMs() + 2000;
  while (service_->stats().held.dropped_calls == 0 && NowMs() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const HeldPushes::Stats held = service_->stats().held;
  EXPECT_GT(held.pushes, 0u);
  EXPECT_EQ(held.dropped_calls, 0u) << "held pushes were dropped: shard 0 no longer knew them";
  StopWithAShardDown();
}

// While a shard stayed down, every retry round pushed every held push again (256 at a
// time), each waiting out its timeout: with up to 2,048 held and a 5 s timeout, 40 s of
// the flusher's thread per round, and as long for Stop's last try. The oldest now goes
// alone first; the others follow once a shard took it.
TEST_F(WorkerServiceTest, WhileAShardStaysDownARetryRoundPushesOnlyTheOldestHeldPush) {
  WorkerServiceOptions o;
  o.accumulate_examples = 2;
  o.reply_when = ReplyWhen::kQueued;  // learns do not wait out the failed pushes
  o.held_retry_ms = 50;
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  o.cache.dense.max_age_ms = 600000;  // learns read the cached copy, not a pull
  StartWorker(Mlp(), o, /*tap=*/false, std::chrono::milliseconds(200));
  ASSERT_TRUE(service_->Learn("", Feats({{1, 1, 0, 0}, {0, 0, 1, 1}}, {0, 2})).ok());
  shards_[1]->Stop();
  const auto one = Feats({{1, -1, 2, 0}}, {1});
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(service_->Learn("", one).ok());
  uint64_t deadline = NowMs() + 5000;
  while (service_->stats().held.pushes < 20 && NowMs() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const HeldPushes::Stats before = service_->stats().held;
  ASSERT_GE(before.pushes, 20u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const HeldPushes::Stats after = service_->stats().held;
  EXPECT_GT(after.retries, before.retries) << "no retry ran";
  // About four rounds of one push each (200 ms timeout, every 50 ms).
  EXPECT_LT(after.retries - before.retries, before.pushes)
      << "every held push was pushed again while the shard stayed down";
  EXPECT_EQ(after.dropped_calls, 0u);
  StopWithAShardDown();
}

// Stop retries the held pushes once more and waits for them; a ticket's Wait returns
// before its callback has run, so Stop also waits for the callbacks (3d9a26c: without
// that, a callback ran on the destroyed service: 'double free or corruption', seen once).
// Many services, each stopped and destroyed the moment Stop returns while its retries'
// callbacks may still be running. Without that wait it aborts ('corrupted size vs.
// prev_size', 3 runs of 3); under ASan a late callback shows as a heap-use-after-free.
TEST_F(WorkerServiceTest, StopWhileHeldPushRetriesRunLeavesNoCallbackBehind) {
  auto model = CreateModel(Mlp());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  WorkerServiceOptions o;
  o.table_template.optimizer_params["lr"] = 0.5;
  o.accumulate_examples = 2;
  o.reply_when = ReplyWhen::kQueued;  // learns do not wait out the failed pushes
  o.max_inflight_pushes = 100000;
  o.held_retry_ms = 1;  // the flusher retries all along, Stop once more
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  o.cache.dense.max_age_ms = 600000;  // learns read the cached copy, not a pull
  Tap cut(endpoints_[1]);             // shard 1, cut off and back by turns
  const auto one = Feats({{1, -1, 2, 0}}, {1});
  const int iterations = 40;
  uint64_t held = 0;
  for (int i = 0; i < iterations; ++i) {
    SCOPED_TRACE(i);
    cut.set_drop(false);
    auto client = Client({endpoints_[0], cut.endpoint()}, std::chrono::milliseconds(100));
    auto service = std::make_unique<WorkerService>(client.get(), model->get(), o);
    // A loaded machine may time out a call here: the iteration then holds less.
    if (service->Start().ok() && service->Learn("", one).ok()) {  // fills the cache
      cut.set_drop(true);
      for (int l = 0; l < 16; ++l) static_cast<void>(service->Learn("", one));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(i % 4 * 60));
    held += service->stats().held.pushes;
    // Every other time shard 1 is back: Stop's retry round then sends every held push at
    // once, and their callbacks run side by side as Stop returns.
    cut.set_drop(i % 2 == 0);
    static_cast<void>(service->Stop());
    service.reset();  // at once: a callback still to run would find it gone
  }
  EXPECT_GT(held, 0u) << "no push was ever held: the test exercised nothing";
}

// A shard past its memory budget refuses a sparse push creating rows, whole, with
// RESOURCE_EXHAUSTED naming the budget. The learn that sent it (in the service and over
// the worker RPC) gets that error, naming the budget's flag and the tables that took
// their part: not a timeout, not an outcome unknown, and nothing of it held or retried.
TEST_F(WorkerServiceTest, ALearnPastAShardsMemoryBudgetSaysSo) {
  for (uint32_t i = 0; i < 2; ++i) {
    shards_[i]->Stop();
    ps::ShardServerOptions o;
    o.shard = i;
    o.num_shards = 2;
    o.listen = "tcp://127.0.0.1:0";
    o.max_memory_bytes = 256 << 10;
    shards_[i] = std::make_unique<ps::ShardServer>(o, std::make_shared<prometheus::Registry>());
    auto ep = shards_[i]->Start();
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    endpoints_[i] = *ep;
  }
  peek_ = Client(endpoints_);
  WorkerServiceOptions o;
  StartWorker(Text(), o, /*tap=*/false, std::chrono::milliseconds(2000));
  Status refused;
  int learns = 0;
  for (; learns < 1000 && refused.ok(); ++learns) {
    std::string text;
    for (int w = 0; w < 200; ++w) text += "w" + std::to_string(learns * 200 + w) + " ";
    auto r = service_->Learn("", {Example{text, {}, 1}});
    if (!r.ok()) refused = r.status();
  }
  ASSERT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("--max-memory-mb"), std::string::npos) << refused.ToString();
  EXPECT_NE(refused.message().find(kPartlyApplied), std::string::npos) << refused.ToString();
  auto rpc = rpc_->Call(Op::kLearn, {{"text", "fresh new words nobody used"}, {"label", "pos"}},
                        std::chrono::seconds(20));
  ASSERT_FALSE(rpc.ok());
  EXPECT_EQ(rpc.status().code(), StatusCode::kResourceExhausted) << rpc.status().ToString();
  EXPECT_NE(rpc.status().message().find("--max-memory-mb"), std::string::npos)
      << rpc.status().ToString();
  EXPECT_EQ(service_->stats().held.pushes, 0u);
  EXPECT_TRUE(service_->Learn("", {Example{"w1 w2 w3", {}, 1}}).ok())
      << "a learn of existing rows goes on";
}

TEST_F(WorkerServiceTest, ALearnRefusedByOneShardAfterAnotherAppliedSaysSo) {
  WorkerServiceOptions o;
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  StartWorker(Mlp(), o, /*tap=*/false, std::chrono::milliseconds(2000));
  ExpectAPartlyAppliedLearnSaysSo([&] {
    return service_->Learn("", Feats({{1, -1, 2, 0}}, {1})).status();
  });
}

// The same over the RPC: the asynchronous learn the bridge's calls take.
TEST_F(WorkerServiceTest, ALearnOverRpcRefusedByOneShardAfterAnotherAppliedSaysSo) {
  WorkerServiceOptions o;
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  StartWorker(Mlp(), o, /*tap=*/false, std::chrono::milliseconds(2000));
  ExpectAPartlyAppliedLearnSaysSo([&] {
    return rpc_->Call(Op::kLearn, {{"features", {1, -1, 2, 0}}, {"label", "b"}}).status();
  });
}

TEST_F(WorkerServiceTest, QueuedModeRepliesBeforeTheAckAndStopWaitsForIt) {
  WorkerServiceOptions o;
  o.reply_when = ReplyWhen::kQueued;
  StartWorker(Mlp(), o);
  const std::string table = model_->params()[0].name;
  ps::VersionVector v0, v1;
  PullDense(table, &v0);
  for (int i = 0; i < 10; ++i) {
    auto r = service_->Learn("", Feats({{1, 2, 3, 4}}, {1}));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->outcome, LearnOutcome::kQueued);
  }
  server_->Stop();
  ASSERT_TRUE(service_->Stop().ok());
  EXPECT_EQ(service_->stats().inflight_pushes, 0u);
  EXPECT_EQ(service_->stats().pushes, 10u * model_->params().size());  // all dense
  PullDense(table, &v1);
  EXPECT_EQ(*std::max_element(v1.begin(), v1.end()), *std::max_element(v0.begin(), v0.end()) + 10);
}

TEST_F(WorkerServiceTest, RpcAnswersBadRequestsAndKeepsServing) {
  StartWorker(Mlp(), WorkerServiceOptions());
  struct Case {
    Op op;
    json body;
    StatusCode code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {Op::kInfer, json::object(), StatusCode::kInvalidArgument, "text"},
      {Op::kInfer, {{"examples", json::array()}}, StatusCode::kInvalidArgument, "empty"},
      {Op::kInfer, {{"features", {1, 2}}}, StatusCode::kInvalidArgument, "4"},
      {Op::kInfer, {{"features", {1, "x", 3, 4}}}, StatusCode::kInvalidArgument, "features[1]"},
      {Op::kLearn, {{"features", {1, 2, 3, 4}}}, StatusCode::kInvalidArgument, "label"},
      {Op::kLearn,
       {{"features", {1, 2, 3, 4}}, {"label", "zzz"}},
       StatusCode::kInvalidArgument,
       "zzz"},
      {Op::kLearn,
       {{"features", {1, 2, 3, 4}}, {"label", 7}},
       StatusCode::kInvalidArgument,
       "label"},
      {Op::kInfer,
       {{"session", 5}, {"features", {1, 2, 3, 4}}},
       StatusCode::kInvalidArgument,
       "session"},
      {Op::kContextSet, {{"items", {"x"}}}, StatusCode::kInvalidArgument, "session"},
      // Finite doubles past float32's range are Inf to the model: refused, not stored.
      {Op::kContextSet,
       {{"session", "s"}, {"features", {1e39, 1}}},
       StatusCode::kInvalidArgument,
       "features[0]"},
      {Op::kInfer, {{"features", {3.5e38, 0, 0, 0}}}, StatusCode::kInvalidArgument, "features[0]"},
      {Op::kContextAppend, {{"session", "s"}}, StatusCode::kInvalidArgument, "text"},
      {Op::kLearn,
       {{"features", json::array()}, {"label", "b"}},
       StatusCode::kInvalidArgument,
       "holds no values"},
      {Op::kInfer,
       {{"session", "s"}, {"context_revision", -1}, {"features", {1, 2, 3, 4}}},
       StatusCode::kInvalidArgument,
       "context_revision"},
      {Op::kLearn,
       {{"context_revision", 2}, {"features", {1, 2, 3, 4}}, {"label", "b"}},
       StatusCode::kInvalidArgument,
       "needs a \"session\""},
      {Op::kContextSet,
       {{"session", "s"}, {"items", {"x"}}, {"revision", "one"}},
       StatusCode::kInvalidArgument,
       "revision"},
      {Op::kPullDense, json::object(), StatusCode::kUnknownOp, "not a worker op"},
      {Op::kInfer, {{"text", std::string(70000, 'a')}}, StatusCode::kTooLarge, "--max-text-bytes"},
      {Op::kInfer,
       {{"features", std::vector<float>(5000, 1.0f)}},
       StatusCode::kTooLarge,
       "--max-features"},
      {Op::kInfer,
       {{"examples", std::vector<json>(300, {{"features", {1, 2, 3, 4}}})}},
       StatusCode::kTooLarge,
       "--max-batch"},
  };
  for (const Case& c : cases) {
    auto r = rpc_->Call(c.op, c.body);
    ASSERT_FALSE(r.ok()) << c.body.dump();
    EXPECT_EQ(r.status().code(), c.code) << c.body.dump() << " -> " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.body.dump() << " -> " << r.status().ToString();
  }
  auto ok = rpc_->Call(Op::kLearn, {{"features", {1, 2, 3, 4}}, {"label", "b"}});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)["outcome"], "applied");
  // An index given as 1.0 is the integer 1 (JSON Schema's integer; Python sends it).
  auto index = rpc_->Call(Op::kLearn, {{"features", {1, 2, 3, 4}}, {"label", 1.0}});
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  auto stats = rpc_->Call(Op::kWorkerStats, json::object());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)["learn_requests"], 2);
  EXPECT_EQ(server_->stats().errors, cases.size());
}

TEST_F(WorkerServiceTest, RpcMalformedBodyIsAnsweredWithMalformed) {
  StartWorker(Mlp(), WorkerServiceOptions());
  // A raw DEALER sends a valid header with a body that is not msgpack.
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::rcvtimeo, 5000);
  s.connect(worker_endpoint_);
  Header h;
  h.op = Op::kInfer;
  h.request_id = 77;
  const std::string header = EncodeHeader(h);
  s.send(zmq::buffer(header), zmq::send_flags::sndmore);
  s.send(zmq::str_buffer("\xc1\xc1 not msgpack"), zmq::send_flags::none);
  std::vector<zmq::message_t> parts;
  ASSERT_TRUE(zmq::recv_multipart(s, std::back_inserter(parts)).has_value());
  auto reply = DecodeHeader(parts[0].data(), parts[0].size());
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->request_id, 77u);
  EXPECT_EQ(reply->code, StatusCode::kMalformed);
  EXPECT_TRUE(rpc_->Call(Op::kInfer, {{"features", {1, 2, 3, 4}}}).ok());
}

TEST_F(WorkerServiceTest, RpcFeaturesAsFloat32BinaryEqualTheArrayForm) {
  StartWorker(Mlp(), WorkerServiceOptions());
  const std::vector<float> x = {0.5f, -1.25f, 3.0f, 0.125f};
  std::vector<uint8_t> bytes(x.size() * sizeof(float));
  std::memcpy(bytes.data(), x.data(), bytes.size());
  auto as_array = rpc_->Call(Op::kInfer, {{"features", x}});
  auto as_binary = rpc_->Call(Op::kInfer, {{"features", json::binary(bytes)}});
  ASSERT_TRUE(as_array.ok() && as_binary.ok()) << as_binary.status().ToString();
  EXPECT_EQ((*as_array)["predictions"], (*as_binary)["predictions"]);
  bytes.pop_back();  // 15 bytes: not whole floats
  auto bad = rpc_->Call(Op::kInfer, {{"features", json::binary(bytes)}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("float32"), std::string::npos) << bad.status().ToString();
}

// Infers from 8 threads at once share forward passes (the batcher), and each call gets
// exactly the predictions it would get alone.
TEST_F(WorkerServiceTest, ConcurrentInfersShareForwardPassesAndGetTheirOwnAnswers) {
  WorkerServiceOptions o;
  o.batch_wait = std::chrono::milliseconds(2);  // so that passes surely form on a slow box
  o.infer_passes = 1;                           // whatever the core count
  StartWorker(Mlp(), o);
  std::vector<std::vector<Example>> inputs;
  for (int i = 0; i < 64; ++i) {
    const float f = static_cast<float>(i);
    inputs.push_back(Feats({{f * 0.1f, -f * 0.05f, 1.0f, f * 0.01f}}, {}));
    if (i % 5 == 0) inputs.back().push_back(Feats({{-f, f, 0.5f, 0.0f}}, {})[0]);
  }
  // Alone first: the reference answers (nothing is learned, so parameters do not move).
  std::vector<InferReply> alone;
  for (const auto& in : inputs) {
    auto r = service_->Infer("", in);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    alone.push_back(*r);
  }
  const WorkerStats before = service_->stats();
  std::vector<InferReply> together(inputs.size());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < inputs.size(); i += 8) {
        auto r = service_->Infer("", inputs[i]);
        if (!r.ok()) {
          failures++;
          continue;
        }
        together[i] = *r;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  const WorkerStats after = service_->stats();
  const uint64_t calls = after.infer_requests - before.infer_requests;
  const uint64_t passes = after.infer_passes - before.infer_passes;
  EXPECT_EQ(calls, inputs.size());
  EXPECT_LT(passes, calls) << "no two calls shared a forward pass";
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_EQ(together[i].predictions.size(), inputs[i].size()) << "call " << i;
    for (size_t k = 0; k < inputs[i].size(); ++k) {
      EXPECT_EQ(together[i].predictions[k].index, alone[i].predictions[k].index);
      ASSERT_EQ(together[i].predictions[k].scores.size(), alone[i].predictions[k].scores.size());
      for (size_t c = 0; c < alone[i].predictions[k].scores.size(); ++c) {
        EXPECT_NEAR(together[i].predictions[k].scores[c], alone[i].predictions[k].scores[c], 1e-5)
            << "call " << i << " example " << k;
      }
    }
    EXPECT_EQ(together[i].versions, alone[i].versions);
  }
}

// A call the model refuses (the wrong number of features) gets its own error while the
// calls that shared its pass get their answers; calls with a session context and
// --no-infer-batching run one pass each.
TEST_F(WorkerServiceTest, BatchedInferErrorsStayWithTheirCallAndContextCallsRunAlone) {
  WorkerServiceOptions o;
  o.batch_wait = std::chrono::milliseconds(20);
  o.infer_passes = 1;
  StartWorker(Mlp(), o);
  std::vector<std::thread> threads;
  std::vector<Status> results(6);
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<Example> in =
          t == 3 ? Feats({{1.0f, 2.0f}}, {}) : Feats({{1.0f, 2.0f, 3.0f, 4.0f}}, {});
      results[static_cast<size_t>(t)] = service_->Infer("", in).status();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 6; ++t) {
    if (t == 3) {
      EXPECT_FALSE(results[3].ok());
      EXPECT_NE(results[3].message().find("example 0"), std::string::npos) << results[3].ToString();
    } else {
      EXPECT_TRUE(results[static_cast<size_t>(t)].ok())
          << results[static_cast<size_t>(t)].ToString();
    }
  }
  // A session with context: its own pass every time.
  ASSERT_TRUE(service_->context().Set("s", {"some context"}, {}).ok());
  const WorkerStats before = service_->stats();
  threads.clear();
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      EXPECT_TRUE(service_->Infer("s", Feats({{1.0f, 0.0f, 0.0f, 1.0f}}, {})).ok());
    });
  }
  for (auto& th : threads) th.join();
  const WorkerStats after = service_->stats();
  EXPECT_EQ(after.infer_passes - before.infer_passes, after.infer_requests - before.infer_requests);
}

// Two leaders waiting out --infer-batch-wait-us at once: the first to wake took both
// calls, and the other, its own call taken, still ran a pass of nothing (a parameter
// read and a forward on no examples, counted in infer_passes); with its call's pass still
// running it led empty passes again and again until that pass ended.
TEST_F(WorkerServiceTest, ALeaderWhoseCallAnotherPassTookRunsNoPassOfItsOwn) {
  WorkerServiceOptions o;
  o.batch_wait = std::chrono::milliseconds(100);
  o.infer_passes = 2;
  StartWorker(Mlp(), o);
  ASSERT_TRUE(service_->Infer("", Feats({{1, 2, 3, 4}}, {})).ok());
  const WorkerStats before = service_->stats();
  StatusOr<InferReply> a = InferReply{}, b = InferReply{};
  std::thread first([&] { a = service_->Infer("", Feats({{1, 2, 3, 4}}, {})); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread second([&] { b = service_->Infer("", Feats({{4, 3, 2, 1}, {0, 1, 0, 1}}, {})); });
  first.join();
  second.join();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->predictions.size(), 1u);
  EXPECT_EQ(b->predictions.size(), 2u);
  const WorkerStats after = service_->stats();
  EXPECT_EQ(after.infer_requests - before.infer_requests, 2u);
  EXPECT_EQ(after.infer_passes - before.infer_passes, 1u) << "a pass ran for no call";
}

// A call that shares a forward pass reports the versions of the rows it read itself
// (docs/protocol.md: 0 where it read no row from a shard). It was given the pass's: a text
// without words reported the embedding versions of another call's rows.
TEST_F(WorkerServiceTest, BatchedInferVersionsAreTheCallersOwn) {
  WorkerServiceOptions o;
  o.batch_wait = std::chrono::milliseconds(200);
  o.infer_passes = 1;
  StartWorker(Text(), o);
  const std::vector<Example> words = {Example{"lovely sunny day in the park", {}, 1}};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(service_->Learn("", words).ok());
  auto alone = service_->Infer("", {Example{"?!", {}, -1}});
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone->versions.at("text/embed"), (ps::VersionVector{0, 0}));
  StatusOr<InferReply> empty = InferReply{}, full = InferReply{};
  std::thread a([&] { full = service_->Infer("", words); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread b([&] { empty = service_->Infer("", {Example{"?!", {}, -1}}); });
  a.join();
  b.join();
  ASSERT_TRUE(empty.ok() && full.ok());
  const WorkerStats s = service_->stats();
  ASSERT_LT(s.infer_passes, s.infer_requests) << "the two calls did not share a pass";
  EXPECT_GT(full->version, 0u);
  EXPECT_EQ(empty->versions.at("text/embed"), (ps::VersionVector{0, 0}))
      << "got " << empty->versions.at("text/embed")[0] << "," << empty->versions.at("text/embed")[1]
      << " version " << empty->version;
}

// A shard down during a batched pass fails every call of the pass after one PS timeout.
// Each was run again alone, one after another, each waiting out its own pull timeout:
// 4 calls with a 1 s timeout answered after 5 s.
TEST_F(WorkerServiceTest, ABatchedInferWithADeadShardWaitsOneTimeoutNotOnePerCall) {
  WorkerServiceOptions o;
  o.batch_wait = std::chrono::milliseconds(100);
  o.infer_passes = 1;
  o.cache.notices = false;
  o.cache.refresh_interval_ms = 0;
  o.cache.dense.max_age_ms = 50;
  StartWorker(Mlp(), o, /*tap=*/false, std::chrono::milliseconds(1000));
  ASSERT_TRUE(service_->Infer("", Feats({{1, 2, 3, 4}}, {})).ok());
  shards_[1]->Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  constexpr int kCalls = 4;
  std::vector<double> secs(kCalls);
  std::vector<Status> st(kCalls);
  std::vector<std::thread> ts;
  for (int t = 0; t < kCalls; ++t) {
    ts.emplace_back([&, t] {
      const auto t0 = std::chrono::steady_clock::now();
      st[t] = service_->Infer("", Feats({{1, 2, 3, float(t)}}, {})).status();
      secs[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& th : ts) th.join();
  double worst = 0;
  for (int t = 0; t < kCalls; ++t) {
    EXPECT_FALSE(st[t].ok()) << "call " << t;
    worst = std::max(worst, secs[t]);
  }
  EXPECT_LT(worst, 3.0) << "one PS timeout is 1 s; a call waited for several";
  StopWithAShardDown();
}

TEST_F(WorkerServiceTest, ContextOpsRoundTripOverRpc) {
  StartWorker(Text(), WorkerServiceOptions());
  auto set = rpc_->Call(Op::kContextSet, {{"session", "s1"}, {"items", {"hello", "world"}}});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  ASSERT_TRUE(rpc_->Call(Op::kContextAppend, {{"session", "s1"}, {"text", "again"}}).ok());
  auto get = rpc_->Call(Op::kContextGet, {{"session", "s1"}});
  ASSERT_TRUE(get.ok());
  EXPECT_EQ((*get)["found"], true);
  EXPECT_EQ((*get)["items"], json({"hello", "world", "again"}));
  auto other = rpc_->Call(Op::kContextGet, {{"session", "s2"}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)["found"], false);
  auto clear = rpc_->Call(Op::kContextClear, {{"session", "s1"}});
  ASSERT_TRUE(clear.ok());
  EXPECT_EQ((*clear)["cleared"], true);
  EXPECT_EQ((*rpc_->Call(Op::kContextGet, {{"session", "s1"}}))["found"], false);
}

// A call naming a context revision the worker does not hold (it restarted, or dropped
// the context) is refused before anything is read or pushed; after the caller sends the
// context at that revision, the same call is served with it.
TEST_F(WorkerServiceTest, ACallNamingAContextRevisionNotHeldIsRefusedBeforeItRuns) {
  StartWorker(Text(), WorkerServiceOptions());
  const json learn = {{"session", "s1"},
                      {"context_revision", 7},
                      {"examples", {{{"text", "a fine day"}, {"label", "pos"}}}}};
  auto refused = rpc_->Call(Op::kLearn, learn);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(kContextNotHeld), std::string::npos)
      << refused.status().ToString();
  auto stats = rpc_->Call(Op::kWorkerStats, json::object());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)["pushes"], 0) << "a refused learn pushed";
  ASSERT_TRUE(
      rpc_->Call(Op::kContextSet, {{"session", "s1"}, {"items", {"dull"}}, {"revision", 7}}).ok());
  auto served = rpc_->Call(Op::kLearn, learn);
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  json infer = {{"session", "s1"}, {"context_revision", 8}, {"text", "a fine day"}};
  EXPECT_EQ(rpc_->Call(Op::kInfer, infer).status().code(), StatusCode::kFailedPrecondition);
  infer["context_revision"] = 7;
  EXPECT_TRUE(rpc_->Call(Op::kInfer, infer).ok());
}

TEST_F(WorkerServiceTest, TorchScriptDenseWeightsAreSeededOnceAcrossWorkers) {
  ModelOptions m;
  m.kind = "torchscript";
  m.model_file = std::string(ONLINEPS_TESTDATA_DIR) + "/tiny_model.pt";
  m.sparse_params = {"embed.weight"};
  m.labels = {"x", "y", "z"};
  m.table_prefix = "ts/";
  StartWorker(m, WorkerServiceOptions());
  // A second worker of the same model starts against the same tables.
  auto other_model = CreateModel(m);
  ASSERT_TRUE(other_model.ok());
  auto other_client = Client(endpoints_);
  WorkerServiceOptions o;
  o.table_template.optimizer_params["lr"] = 0.5;
  WorkerService other(other_client.get(), other_model->get(), o);
  ASSERT_TRUE(other.Start().ok());
  size_t seeded = 0;
  for (const ParamInfo& p : model_->params()) {
    if (p.kind != ParamKind::kDense) continue;
    ASSERT_EQ(p.initial.size(), p.size()) << p.name;
    ps::VersionVector v;
    const std::vector<float> w = PullDense(p.name, &v);
    for (size_t j = 0; j < w.size(); ++j) {
      EXPECT_FLOAT_EQ(w[j], p.initial[j]) << p.name << "[" << j << "] (applied twice?)";
    }
    EXPECT_EQ(*std::max_element(v.begin(), v.end()), 1u) << p.name;
    seeded += std::any_of(p.initial.begin(), p.initial.end(), [](float x) { return x != 0; });
  }
  EXPECT_GT(seeded, 0u) << "the model file has only zero weights: nothing was checked";
  // After training, a restarted worker does not overwrite the trained values.
  ASSERT_TRUE(service_->Learn("", {Example{"alpha beta", {}, 1}}).ok());
  const std::string table = model_->params()[1].name;
  const std::vector<float> trained = PullDense(table);
  ASSERT_TRUE(other.Stop().ok());
  WorkerService again(other_client.get(), other_model->get(), o);
  ASSERT_TRUE(again.Start().ok());
  EXPECT_EQ(PullDense(table), trained);
  ASSERT_TRUE(again.Stop().ok());
}

// worker/testdata/scalar_param.pt (Linear(4, 3) times a 0-dim temperature) on `prefix`.
ModelOptions ScalarModel(const std::string& prefix) {
  ModelOptions m;
  m.kind = "torchscript";
  m.model_file = std::string(ONLINEPS_TESTDATA_DIR) + "/scalar_param.pt";
  m.labels = {"x", "y", "z"};
  m.table_prefix = prefix;
  return m;
}

// A 0-dim trainable parameter (a temperature) is a one-element table: seeded with the
// file's value, read back into the parameter, and trained by a learn. Before, the worker
// did not start ("table spec field 'shape' = ''", with a hint about another worker).
TEST_F(WorkerServiceTest, TorchScriptScalarParameterIsAOneElementTable) {
  StartWorker(ScalarModel("sc/"), WorkerServiceOptions());
  std::string temp;
  for (const ParamInfo& p : model_->params()) {
    if (p.name.find("temp") != std::string::npos) temp = p.name;
  }
  ASSERT_FALSE(temp.empty()) << "no table for the scalar parameter";
  EXPECT_EQ(PullDense(temp), std::vector<float>{1.5f});
  auto infer = service_->Infer("", {Example{"", {1, 2, 3, 4}, -1}});
  ASSERT_TRUE(infer.ok()) << infer.status().ToString();
  ASSERT_TRUE(service_->Learn("", {Example{"", {1, 2, 3, 4}, 2}}).ok());
  const std::vector<float> after = PullDense(temp);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_NE(after[0], 1.5f) << "a learn did not move the temperature";
}

// --clip-norm bounds gradients, not the model file's weights: the seed is applied whole
// (it was clipped to the norm, so the model started from shrunken weights, for good).
TEST_F(WorkerServiceTest, TorchScriptSeedIsNotClippedByClipNorm) {
  WorkerServiceOptions o;
  o.table_template.clip_norm = 0.1;
  StartWorker(ScalarModel("clip/"), o);
  size_t checked = 0;
  for (const ParamInfo& p : model_->params()) {
    if (p.kind != ParamKind::kDense) continue;
    const std::vector<float> w = PullDense(p.name);
    ASSERT_EQ(w.size(), p.initial.size()) << p.name;
    for (size_t j = 0; j < w.size(); ++j) EXPECT_FLOAT_EQ(w[j], p.initial[j]) << p.name;
    double norm = 0;
    for (float x : p.initial) norm += static_cast<double>(x) * x;
    checked += std::sqrt(norm) > 0.1;
  }
  EXPECT_GT(checked, 0u) << "no table's initial values were above the clip norm";
}

TEST_F(WorkerServiceTest, TorchScriptModelLoadsInfersAndTrainsThroughThePs) {
  ModelOptions m;
  m.kind = "torchscript";
  m.model_file = std::string(ONLINEPS_TESTDATA_DIR) + "/tiny_model.pt";
  m.sparse_params = {"embed.weight"};
  m.labels = {"x", "y", "z"};
  m.table_prefix = "ts/";
  StartWorker(m, WorkerServiceOptions());
  auto r = rpc_->Call(Op::kInfer, {{"text", "some words here"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  double total = 0;
  for (double s : (*r)["predictions"][0]["scores"]) total += s;
  EXPECT_NEAR(total, 1.0, 1e-4);
  double first = 0, last = 0;
  for (int i = 0; i < 60; ++i) {
    auto l = rpc_->Call(Op::kLearn, {{"examples",
                                      {{{"text", "alpha beta"}, {"label", "x"}},
                                       {{"text", "gamma delta"}, {"label", "y"}},
                                       {{"text", "epsilon zeta"}, {"label", "z"}}}}});
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    (i == 0 ? first : last) = (*l)["loss"].get<double>();
  }
  EXPECT_LT(last, first * 0.7) << "loss did not fall: " << first << " -> " << last;
}

// Issue 22: a frozen backbone changes nothing the PS does: with every optimizer and a
// delay-aware rule, accumulation and local steps, only the trainable tables exist and
// move, and the frozen values stay bit-identical. A frozen dense layer under a trainable
// sparse embedding exercises the sparse push path.
TEST_F(WorkerServiceTest, FrozenBackboneWorksWithEveryRuleAccumulationAndLocalSteps) {
  struct Case {
    std::string name, optimizer, staleness;
    ps::Params params;
    uint32_t accumulate = 1, local_steps = 0;
  };
  const std::vector<Case> cases = {
      {"sgd", "sgd", "none", {{"lr", 0.5}}},
      {"adagrad", "adagrad", "dc_adaptive", {{"lr", 0.5}}},
      {"ftrl", "ftrl", "lr_over_tau", {{"alpha", 0.5}}},
      {"adam", "adam", "none", {{"lr", 0.05}}},
      {"accumulate", "sgd", "none", {{"lr", 0.5}}, 3},
      {"local", "sgd", "none", {{"lr", 0.5}}, 1, 2},
  };
  std::vector<Example> batch;
  for (int e = 0; e < 3; ++e) {
    Example ex;
    for (int j = 0; j < 6; ++j) ex.features.push_back(2.0f * std::sin(1.7f * e + 0.9f * j));
    ex.label = e;
    batch.push_back(ex);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ModelOptions m;
    m.kind = "torchscript";
    m.model_file = std::string(ONLINEPS_TESTDATA_DIR) + "/frozen_head.pt";
    m.labels = {"a", "b", "c"};
    m.table_prefix = c.name + "/";
    auto model = CreateModel(m);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    WorkerServiceOptions o;
    o.table_template.optimizer = c.optimizer;
    o.table_template.optimizer_params = c.params;
    o.table_template.staleness = c.staleness;
    o.accumulate_examples = c.accumulate;
    o.local_steps = c.local_steps;
    auto client = Client(endpoints_);
    WorkerService service(client.get(), model->get(), o);
    ASSERT_TRUE(service.Start().ok());
    const std::vector<ParamInfo>& params = (*model)->params();
    ASSERT_EQ(params.size(), 2u);
    for (int i = 0; i < 12; ++i) {
      auto r = service.Learn("", batch);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    }
    ASSERT_TRUE(service.Stop().ok());
    for (const ParamInfo& p : params) {
      ps::VersionVector v;
      const std::vector<float> now = PullDense(p.name, &v);
      EXPECT_GT(*std::max_element(v.begin(), v.end()), 1u) << p.name << " was never pushed";
      EXPECT_NE(now, p.initial) << p.name << " did not learn";
    }
    EXPECT_FALSE(peek_->OpenTable(c.name + "/backbone.fc0.weight").ok());
    auto now = (*model)->BaseNow();
    ASSERT_TRUE(now.ok()) << now.status().ToString();
    EXPECT_EQ(*now, (*model)->base());
  }

  ModelOptions m;
  m.kind = "torchscript";
  m.model_file = std::string(ONLINEPS_TESTDATA_DIR) + "/tiny_model.pt";
  m.sparse_params = {"embed.weight"};
  m.frozen = {"out.*"};
  m.labels = {"x", "y", "z"};
  m.table_prefix = "sparse/";
  StartWorker(m, WorkerServiceOptions());
  ASSERT_EQ(model_->params().size(), 1u);
  EXPECT_EQ(model_->base().rfind("sha256:", 0), 0u) << model_->base();
  size_t rows = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = service_->Learn("", {Example{"alpha beta", {}, 1}, Example{"gamma", {}, 2}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    rows += r->sparse_rows_pushed;
    EXPECT_FALSE(r->dense_pushed);
  }
  EXPECT_GT(rows, 0u);
  EXPECT_FALSE(peek_->OpenTable("sparse/out.weight").ok());
  auto now = model_->BaseNow();
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(*now, model_->base());
}

}  // namespace
}  // namespace onlineps::worker
