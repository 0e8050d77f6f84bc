// ps_bench: parameter-server figures on loopback, each printed beside a raw ZeroMQ
// baseline that moves the same bytes in the same run (DEALER -> ROUTER, one small
// reply), so ratios stay meaningful on a noisy machine. Not a test.
//   ps_bench [--iters N] [--quick]
#include <prometheus/registry.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ps/ps_client.h"
#include "ps/rule_set.h"
#include "ps/shard_server.h"

namespace onlineps::ps {
namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double p50_us = 0, p99_us = 0, mean_us = 0;
};

Stats Measure(int iters, const std::function<void()>& fn) {
  for (int i = 0; i < std::max(3, iters / 10); ++i) fn();  // warm-up
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  double sum = 0;
  for (double x : us) sum += x;
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)], sum / us.size()};
}

// Raw ZeroMQ: a ROUTER thread that answers every multipart message with one 16-byte frame.
class RawEcho {
 public:
  RawEcho() : ctx_(1), router_(ctx_, zmq::socket_type::router) {
    router_.bind("tcp://127.0.0.1:0");
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { Loop(); });
    dealer_ = zmq::socket_t(ctx_, zmq::socket_type::dealer);
    dealer_.connect(endpoint_);
  }
  ~RawEcho() {
    stop_ = true;
    dealer_.send(zmq::buffer("x", 1), zmq::send_flags::none);
    thread_.join();
  }
  // One round trip carrying `frames` (raw bytes) and a 16-byte reply.
  void RoundTrip(const std::vector<std::pair<const void*, size_t>>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m(frames[i].first, frames[i].second);
      dealer_.send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    zmq::message_t reply;
    (void)dealer_.recv(reply);
  }

 private:
  void Loop() {
    while (true) {
      std::vector<zmq::message_t> parts;
      zmq::message_t m;
      do {
        (void)router_.recv(m);
        parts.emplace_back(std::move(m));
      } while (router_.get(zmq::sockopt::rcvmore));
      if (stop_) return;
      router_.send(parts[0], zmq::send_flags::sndmore);
      router_.send(zmq::buffer("0123456789abcdef", 16), zmq::send_flags::none);
    }
  }
  zmq::context_t ctx_;
  zmq::socket_t router_, dealer_;
  std::string endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

void Row(const char* what, const Stats& ps, const Stats& raw, const std::string& extra = "") {
  std::printf("%-34s p50 %8.1f us  p99 %8.1f us | raw zmq p50 %8.1f us  p99 %8.1f us | %s\n", what,
              ps.p50_us, ps.p99_us, raw.p50_us, raw.p99_us, extra.c_str());
}

void SparseCase(PsClient& c, RawEcho& raw, size_t nkeys, uint32_t dim, int iters) {
  const std::string table = "sparse" + std::to_string(dim);
  std::vector<uint64_t> keys(nkeys);
  for (size_t i = 0; i < nkeys; ++i) keys[i] = i * 0x9e3779b97f4a7c15ULL + 1;
  std::vector<float> vals(nkeys * dim, 0.001f), out(nkeys * dim);
  VersionVector v;
  Stats push = Measure(
      iters, [&] { c.PushSparse(table, keys.data(), nkeys, vals.data(), v, nullptr).Wait().ok(); });
  Stats raw_push = Measure(iters, [&] {
    raw.RoundTrip({{"header-64-bytes-header-64-bytes-header-64-bytes-header-64-bytes", 64},
                   {keys.data(), nkeys * 8},
                   {vals.data(), vals.size() * 4}});
  });
  Stats pull =
      Measure(iters, [&] { c.PullSparse(table, keys.data(), nkeys, out.data(), &v).Wait().ok(); });
  Stats raw_pull = Measure(iters, [&] {
    raw.RoundTrip({{"header-64-bytes-header-64-bytes-header-64-bytes-header-64-bytes", 64},
                   {keys.data(), nkeys * 8}});
  });
  char label[64], extra[160];
  std::snprintf(label, sizeof label, "sparse push %zu keys x %u", nkeys, dim);
  std::snprintf(extra, sizeof extra, "%.2f M keys/s (raw %.2f), ratio %.2f", nkeys / push.p50_us,
                nkeys / raw_push.p50_us, raw_push.p50_us / push.p50_us);
  Row(label, push, raw_push, extra);
  std::snprintf(label, sizeof label, "sparse pull %zu keys x %u", nkeys, dim);
  std::snprintf(extra, sizeof extra, "%.2f M keys/s (raw keys-only request %.2f)",
                nkeys / pull.p50_us, nkeys / raw_pull.p50_us);
  Row(label, pull, raw_pull, extra);
}

void DenseCase(PsClient& c, RawEcho& raw, uint64_t elems, int iters) {
  std::vector<float> g(elems, 0.0001f), out(elems);
  VersionVector v;
  const double bytes = elems * 4.0;
  // The zero-copy overload: the frame shares ownership of the gradient.
  const Frame gf = Frame::FromVector(g);
  Stats push = Measure(iters, [&] { c.PushDense("dense", gf, v, nullptr).Wait().ok(); });
  Stats raw_push = Measure(iters, [&] { raw.RoundTrip({{"h", 64}, {g.data(), elems * 4}}); });
  Stats pull = Measure(iters, [&] { c.PullDense("dense", out.data(), &v).Wait().ok(); });
  char extra[160];
  std::snprintf(extra, sizeof extra, "%.2f GB/s (raw %.2f), ratio %.2f", bytes / push.mean_us / 1e3,
                bytes / raw_push.mean_us / 1e3, raw_push.mean_us / push.mean_us);
  Row("dense push 4 MiB", push, raw_push, extra);
  std::snprintf(extra, sizeof extra, "%.2f GB/s (raw one-way 4 MiB %.2f), ratio %.2f",
                bytes / pull.mean_us / 1e3, bytes / raw_push.mean_us / 1e3,
                raw_push.mean_us / pull.mean_us);
  Row("dense pull 4 MiB", pull, raw_push, extra);
}

void ApplyRates(int reps) {
  const size_t n = 1 << 20;
  std::vector<float> w(n, 0.5f), g(n, 0.01f), bak(n, 0.4f), s1(n, 0.0f), s2(n, 0.0f);
  std::vector<float> scratch;
  auto rate = [&](const char* name, const char* opt, const char* pol, bool with_bak) {
    TableSpec spec;
    spec.name = "apply";
    spec.shape = {n};
    spec.optimizer = opt;
    spec.staleness = pol;
    auto rules = RuleSet::Create(spec);
    float* slots[2] = {s1.data(), s2.data()};
    float* pslots[1] = {s2.data()};
    auto run = [&] {
      rules->Apply(w.data(), slots, pslots, g.data(), with_bak ? bak.data() : nullptr, n, 1.0f, 1,
                   &scratch);
    };
    Stats st = Measure(reps, run);
    std::printf("apply %-28s %8.3f G elements/s (one core)\n", name, n / st.p50_us / 1e3);
    return n / st.p50_us / 1e3;
  };
  // Baseline: a bare w -= lr*g loop in the same run.
  Stats base = Measure(reps, [&] {
    float* __restrict pw = w.data();
    const float* __restrict pg = g.data();
    for (size_t i = 0; i < n; ++i) pw[i] -= 0.01f * pg[i];
  });
  std::printf("apply %-28s %8.3f G elements/s (baseline loop)\n", "bare w -= lr*g",
              n / base.p50_us / 1e3);
  rate("sgd", "sgd", "none", false);
  rate("adagrad", "adagrad", "none", false);
  rate("sgd + dc_constant (DC-ASGD)", "sgd", "dc_constant", true);
  rate("sgd + dc_adaptive (DC-ASGD-a)", "sgd", "dc_adaptive", true);
}

int Main(int argc, char** argv) {
  int iters = 2000;
  std::string listen = "tcp://127.0.0.1:0";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mem")) listen = "mem://ps_bench";  // no network: PS overhead
    if (!std::strcmp(argv[i], "--quick")) iters = 200;
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
  }
  ShardServerOptions so;
  so.listen = listen;
  ShardServer server(so, std::make_shared<prometheus::Registry>());
  auto ep = server.Start();
  if (!ep.ok()) {
    std::fprintf(stderr, "ps_bench: %s\n", ep.status().ToString().c_str());
    return 1;
  }
  PsClientOptions co;
  co.shards = {*ep};
  auto client = PsClient::Connect(co);
  if (!client.ok()) return 1;
  PsClient& c = **client;
  for (uint32_t dim : {1u, 16u, 64u}) {
    TableSpec s;
    s.name = "sparse" + std::to_string(dim);
    s.kind = TableKind::kSparse;
    s.dim = dim;
    c.CreateTable(s).ok();
  }
  TableSpec d;
  d.name = "dense";
  d.shape = {1 << 20};
  c.CreateTable(d).ok();
  RawEcho raw;
  std::printf("onlineps ps_bench: 1 shard, tcp loopback, sequential calls, %d iterations\n", iters);
  uint64_t key = 42;
  float one = 0.5f, out = 0;
  VersionVector v;
  Stats push1 =
      Measure(iters, [&] { c.PushSparse("sparse1", &key, 1, &one, v, nullptr).Wait().ok(); });
  Stats pull1 = Measure(iters, [&] { c.PullSparse("sparse1", &key, 1, &out, &v).Wait().ok(); });
  Stats raw1 = Measure(iters, [&] { raw.RoundTrip({{"h", 40}, {&key, 8}, {&one, 4}}); });
  Row("push 1 key x 1 float", push1, raw1);
  Row("pull 1 key x 1 float", pull1, raw1);
  SparseCase(c, raw, 1000, 16, iters);
  SparseCase(c, raw, 10000, 64, std::max(20, iters / 10));
  DenseCase(c, raw, 1 << 20, std::max(20, iters / 20));
  ApplyRates(std::max(10, iters / 50));
  server.Stop();
  return 0;
}

}  // namespace
}  // namespace onlineps::ps

int main(int argc, char** argv) { return onlineps::ps::Main(argc, argv); }
