#include "common/admin_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/counter.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/build_info.h"
#include "common/latency_histogram.h"
#include "common/process_metrics.h"
#include "tests/raw_http_client.h"

namespace onlineps {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kHost[] = "127.0.0.1";

httplib::Result Get(int port, const std::string& path) {
  httplib::Client client(kHost, port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(2, 0);
  return client.Get(path.c_str());
}

using testing::RawClient;
using testing::Reply;

std::string GetRequest(const std::string& path, const std::string& extra_headers = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: test\r\n" + extra_headers + "\r\n";
}

// One request on a fresh connection, as a kubelet probe makes it.
std::optional<Reply> Probe(int port, const std::string& path, milliseconds timeout) {
  auto client = RawClient::Connect(port);
  if (!client || !client->Send(GetRequest(path, "Connection: close\r\n"))) return std::nullopt;
  return client->Read(timeout);
}

// Value of the series `name`{label="value"} (label empty: the unlabelled one); -1 if absent.
double MetricValue(prometheus::Registry& registry, const std::string& name,
                   const std::string& label = "", const std::string& value = "") {
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      bool match = label.empty() && metric.label.empty();
      for (const auto& l : metric.label) match |= l.name == label && l.value == value;
      if (match)
        return family.type == prometheus::MetricType::Gauge ? metric.gauge.value
                                                            : metric.counter.value;
    }
  }
  return -1;
}

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

// Sends the next byte of `request` to each client once a second until destroyed: a
// slowloris attack at the rate that a per-read timeout never catches.
class Trickle {
 public:
  Trickle(const std::vector<std::unique_ptr<RawClient>>* clients, std::string request)
      : thread_([this, clients, request = std::move(request)] {
          for (size_t i = 0; !stop_; ++i) {
            for (const auto& c : *clients) c->Send(request.substr(i % request.size(), 1));
            for (int t = 0; t < 100 && !stop_; ++t) std::this_thread::sleep_for(milliseconds(10));
          }
        }) {}
  ~Trickle() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

bool WaitFor(const std::function<bool()>& condition, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

TEST(AdminServerTest, ServesProbes) {
  AdminServer server;
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  ASSERT_GT(*port, 0);
  for (const char* path : {"/healthz", "/livez"}) {
    auto res = Get(*port, path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body, "ok\n");
  }
  auto ready = Get(*port, "/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  EXPECT_EQ(ready->body, "ready\n");
  auto missing = Get(*port, "/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST(AdminServerTest, MetricsShowsRegistryAndBuildInfo) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("ps_push_requests_total")
      .Help("Push requests handled")
      .Register(*registry)
      .Add({{"status", "ok"}})
      .Increment(3);
  AdminServer server(registry);
  EXPECT_EQ(server.registry(), registry);
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  auto res = Get(*port, "/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  const std::string& body = res->body;
  EXPECT_NE(body.find("# HELP ps_push_requests_total Push requests handled\n"), std::string::npos)
      << body;
  EXPECT_NE(body.find("# TYPE ps_push_requests_total counter\n"), std::string::npos);
  EXPECT_NE(body.find("ps_push_requests_total{status=\"ok\"} 3"), std::string::npos);
  EXPECT_NE(body.find(std::string("onlineps_build_info{commit=\"") + BuildCommit() +
                      "\",version=\"0.1.0\"} 1"),
            std::string::npos)
      << body;
  EXPECT_NE(std::string(BuildCommit()), "");
  // The process_* families are added at each scrape.
  EXPECT_NE(body.find("# TYPE process_cpu_seconds_total counter\n"), std::string::npos) << body;
  for (const char* name : {"process_resident_memory_bytes ", "process_open_fds ",
                           "process_start_time_seconds ", "process_threads "}) {
    EXPECT_NE(body.find(std::string("\n") + name), std::string::npos) << name;
  }
}

TEST(ProcessMetricsTest, ParsesStatWithSpacesAndParenthesesInTheName) {
  // proc(5): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
  // cmajflt utime stime cutime cstime priority nice num_threads itrealvalue starttime
  // vsize rss ...
  const std::string stat =
      "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 1000 "
      "123456789 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
  std::optional<ProcessSample> p = ParseProcStat(stat, 100, 4096, 1.7e9);
  ASSERT_TRUE(p.has_value());
  EXPECT_DOUBLE_EQ(p->cpu_seconds, 3.0);  // (250 + 50) ticks / 100
  EXPECT_DOUBLE_EQ(p->threads, 7);
  EXPECT_DOUBLE_EQ(p->start_time_s, 1.7e9 + 10);  // boot + 1000 ticks
  EXPECT_DOUBLE_EQ(p->virtual_bytes, 123456789);
  EXPECT_DOUBLE_EQ(p->resident_bytes, 300 * 4096.0);
  EXPECT_FALSE(ParseProcStat("garbage", 100, 4096, 0).has_value());
  EXPECT_FALSE(ParseProcStat("1 (x) S 1 2 3", 100, 4096, 0).has_value());  // too short
  EXPECT_FALSE(ParseProcStat(stat, 0, 4096, 0).has_value());
}

TEST(ProcessMetricsTest, SamplesThisProcess) {
  std::optional<ProcessSample> p = SampleProcess();
  ASSERT_TRUE(p.has_value());
  EXPECT_GT(p->resident_bytes, 1e6);
  EXPECT_GE(p->threads, 1);
  ASSERT_TRUE(p->open_fds.has_value());
  const int fd = dup(0);
  std::optional<ProcessSample> q = SampleProcess();
  close(fd);
  ASSERT_TRUE(q.has_value() && q->open_fds.has_value());
  EXPECT_EQ(*q->open_fds, *p->open_fds + 1);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(p->start_time_s, now + 1);
  EXPECT_GT(p->start_time_s, now - 3600);  // this test started less than an hour ago
  std::vector<prometheus::MetricFamily> families = ProcessFamilies(p);
  EXPECT_GE(families.size(), 6u);
  EXPECT_TRUE(ProcessFamilies(std::nullopt).empty());
}

TEST(LatencyHistogramTest, CountsIntoBucketsAndReportsDeltas) {
  LatencyHistogram h;
  h.Observe(5e-5);   // <= 1e-4
  h.Observe(1e-4);   // on a bound: that bucket
  h.Observe(2e-3);   // <= 3e-3
  h.Observe(100.0);  // +Inf
  const LatencyHistogram::Snapshot a = h.Read();
  EXPECT_EQ(a.count(), 4u);
  EXPECT_EQ(a.buckets[0], 2u);
  EXPECT_EQ(a.buckets[3], 1u);
  EXPECT_EQ(a.buckets.back(), 1u);
  EXPECT_NEAR(a.sum_ns * 1e-9, 100.00215, 1e-6);
  h.Observe(0.05);  // <= 0.1
  const LatencyHistogram::Snapshot b = h.Read();
  const std::vector<double> d = LatencyHistogram::BucketDelta(b, a);
  ASSERT_EQ(d.size(), LatencyHistogram::kBounds.size() + 1);
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i], i == 6 ? 1 : 0) << i;
  EXPECT_NEAR(LatencyHistogram::SumDelta(b, a), 0.05, 1e-9);
}

TEST(AdminServerTest, ReadinessFollowsCheck) {
  AdminServer server;
  std::atomic<bool> ready{false};
  server.SetReadyCheck([&ready]() -> Status {
    if (ready) return Status::Ok();
    return Unavailable("peers not connected");
  });
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  auto before = Get(*port, "/readyz");
  ASSERT_TRUE(before);
  EXPECT_EQ(before->status, 503);
  EXPECT_NE(before->body.find("peers not connected"), std::string::npos) << before->body;
  auto live = Get(*port, "/livez");  // liveness ignores readiness
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);

  ready = true;
  auto after = Get(*port, "/readyz");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
  EXPECT_EQ(after->body, "ready\n");
}

TEST(AdminServerTest, ThrowingCheckIsNotReady) {
  AdminServer server;
  server.SetReadyCheck([]() -> Status { throw std::runtime_error("boom"); });
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  auto res = Get(*port, "/readyz");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_NE(res->body.find("boom"), std::string::npos);
}

TEST(AdminServerTest, StopIsIdempotentAndPortTakenIsUnavailable) {
  AdminServer first;
  StatusOr<int> port = first.Start(kHost, 0);
  ASSERT_TRUE(port.ok());

  AdminServer second;
  StatusOr<int> clash = second.Start(kHost, *port);
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(clash.status().message().find(std::string(kHost) + ":" + std::to_string(*port)),
            std::string::npos)
      << clash.status().message();

  EXPECT_EQ(first.Start(kHost, 0).status().code(), StatusCode::kFailedPrecondition);
  first.Stop();
  first.Stop();
  EXPECT_FALSE(Get(*port, "/livez"));
  second.Stop();  // never started: a no-op
}

TEST(AdminServerTest, StopRightAfterStartReturns) {
  for (int i = 0; i < 20; ++i) {
    AdminServer server;
    ASSERT_TRUE(server.Start(kHost, 0).ok());
    server.Stop();
  }
}

TEST(AdminServerTest, MetricsShowsConnectionCountersAtZero) {
  AdminServer server;
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  std::optional<Reply> res = Probe(*port, "/metrics", milliseconds(2000));
  ASSERT_TRUE(res);
  for (const char* line :
       {"onlineps_admin_connections_refused_total{reason=\"per_address_limit\"} 0",
        "onlineps_admin_connections_refused_total{reason=\"total_limit\"} 0",
        "onlineps_admin_connections_timed_out_total{reason=\"request_deadline\"} 0",
        "onlineps_admin_connections_timed_out_total{reason=\"write_deadline\"} 0",
        "onlineps_admin_open_connections 1"}) {
    EXPECT_NE(res->body.find(line), std::string::npos) << line << "\n" << res->body;
  }
}

TEST(AdminServerTest, BadOptionsAreInvalidArgument) {
  AdminServerOptions options;
  options.request_deadline = milliseconds(0);
  AdminServer server(nullptr, options);
  EXPECT_EQ(server.Start(kHost, 0).status().code(), StatusCode::kInvalidArgument);
}

// Issue 18: two slow connections stopped every admin port (2 threads, per-read
// timeout). 200 clients that send a header byte a second and 50 that send nothing must
// cost the probes nothing.
TEST(AdminServerTest, SlowlorisDoesNotStarveProbes) {
  AdminServerOptions options;
  options.max_connections_per_address = 1000;  // every client here is 127.0.0.1
  AdminServer server(nullptr, options);
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  std::vector<std::unique_ptr<RawClient>> slow, silent;
  for (int i = 0; i < 200; ++i) slow.push_back(RawClient::Connect(*port));
  for (int i = 0; i < 50; ++i) silent.push_back(RawClient::Connect(*port));
  for (const auto& c : slow) ASSERT_TRUE(c);
  for (const auto& c : silent) ASSERT_TRUE(c);
  Trickle trickle(&slow, GetRequest("/livez", "X-Slow: " + std::string(100, 'a') + "\r\n"));
  prometheus::Registry& registry = *server.registry();
  EXPECT_TRUE(
      WaitFor([&] { return MetricValue(registry, "onlineps_admin_open_connections") >= 250; },
              milliseconds(3000)));

  int64_t slowest_ms = 0;
  for (int i = 0; i < 30; ++i) {
    const auto start = Clock::now();
    std::optional<Reply> res = Probe(*port, i % 2 ? "/metrics" : "/livez", milliseconds(2000));
    slowest_ms = std::max(slowest_ms, MsSince(start));
    ASSERT_TRUE(res) << "probe " << i;
    EXPECT_EQ(res->status, 200);
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_LT(slowest_ms, 200);
  // The slow clients were held open, not shed, while the probes were answered.
  EXPECT_GE(MetricValue(registry, "onlineps_admin_open_connections"), 250);
}

TEST(AdminServerTest, PerAddressCapRefusesTheSeventeenth) {
  AdminServer server;  // default cap: 16 per address
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  std::vector<std::unique_ptr<RawClient>> open;
  for (int i = 0; i < 16; ++i) {
    open.push_back(RawClient::Connect(*port));
    ASSERT_TRUE(open.back() && open.back()->Send(GetRequest("/livez")));
    std::optional<Reply> res = open.back()->Read(milliseconds(2000));
    ASSERT_TRUE(res) << "connection " << i;
    EXPECT_EQ(res->status, 200);
  }
  auto seventeenth = RawClient::Connect(*port);
  ASSERT_TRUE(seventeenth);
  std::optional<Reply> refused = seventeenth->Read(milliseconds(2000));
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_TRUE(seventeenth->WaitClosed(milliseconds(1000)));
  prometheus::Registry& registry = *server.registry();
  EXPECT_EQ(MetricValue(registry, "onlineps_admin_connections_refused_total", "reason",
                        "per_address_limit"),
            1);

  // Another address is not affected, and the 16 still work.
  auto other = RawClient::Connect(*port, "127.0.0.2");
  ASSERT_TRUE(other && other->Send(GetRequest("/livez")));
  std::optional<Reply> res = other->Read(milliseconds(2000));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  ASSERT_TRUE(open[0]->Send(GetRequest("/livez")));
  ASSERT_TRUE(open[0]->Read(milliseconds(2000)));

  // A closed connection frees its slot.
  open.pop_back();
  EXPECT_TRUE(WaitFor(
      [&] {
        std::optional<Reply> r = Probe(*port, "/livez", milliseconds(1000));
        return r && r->status == 200;
      },
      milliseconds(2000)));
}

TEST(AdminServerTest, TotalCapRefusesPastMaxConnections) {
  AdminServerOptions options;
  options.max_connections = 4;
  AdminServer server(nullptr, options);
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  std::vector<std::unique_ptr<RawClient>> open;
  for (int i = 0; i < 4; ++i) {
    open.push_back(RawClient::Connect(*port, i % 2 ? "127.0.0.3" : "127.0.0.4"));
    ASSERT_TRUE(open.back() && open.back()->Send(GetRequest("/livez")));
    ASSERT_TRUE(open.back()->Read(milliseconds(2000))) << "connection " << i;
  }
  auto fifth = RawClient::Connect(*port, "127.0.0.5");
  ASSERT_TRUE(fifth);
  std::optional<Reply> refused = fifth->Read(milliseconds(2000));
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(MetricValue(*server.registry(), "onlineps_admin_connections_refused_total", "reason",
                        "total_limit"),
            1);
}

// A per-read timeout never fires for a client that sends a byte every 50 ms; the
// whole-request deadline does, and so it does for a client that sends nothing.
TEST(AdminServerTest, PartialRequestIsClosedAtTheDeadline) {
  AdminServerOptions options;
  options.request_deadline = milliseconds(300);
  AdminServer server(nullptr, options);
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  const auto start = Clock::now();
  auto trickler = RawClient::Connect(*port);
  auto silent = RawClient::Connect(*port);
  ASSERT_TRUE(trickler && silent);
  ASSERT_TRUE(trickler->Send("GET /livez HTTP/1.1\r\nHost: test\r\nX-Slow: "));
  bool closed = false;
  while (!closed && Clock::now() - start < milliseconds(3000)) {
    closed = trickler->WaitClosed(milliseconds(50));
    if (!closed) trickler->Send("a");
  }
  const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  EXPECT_TRUE(closed);
  EXPECT_GE(elapsed.count(), 250);
  EXPECT_LT(elapsed.count(), 1500);
  EXPECT_TRUE(silent->WaitClosed(milliseconds(1000)));
  EXPECT_EQ(MetricValue(*server.registry(), "onlineps_admin_connections_timed_out_total", "reason",
                        "request_deadline"),
            2);
}

TEST(AdminServerTest, IdleKeepAliveConnectionIsClosed) {
  AdminServerOptions options;
  options.idle_timeout = milliseconds(200);
  AdminServer server(nullptr, options);
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  auto client = RawClient::Connect(*port);
  ASSERT_TRUE(client && client->Send(GetRequest("/livez")));
  ASSERT_TRUE(client->Read(milliseconds(2000)));
  const auto start = Clock::now();
  EXPECT_TRUE(client->WaitClosed(milliseconds(2000)));
  EXPECT_GE(MsSince(start), 150);
  EXPECT_EQ(MetricValue(*server.registry(), "onlineps_admin_connections_timed_out_total", "reason",
                        "idle_timeout"),
            1);
}

// Each bad request is answered with `status` and the connection closed.
void ExpectRejected(int port, const std::string& request, int status) {
  auto client = RawClient::Connect(port);
  ASSERT_TRUE(client && client->Send(request));
  std::optional<Reply> res = client->Read(milliseconds(1000));
  ASSERT_TRUE(res) << request;
  EXPECT_EQ(res->status, status) << request;
  EXPECT_EQ(res->Header("connection"), "close") << request;
  EXPECT_TRUE(client->WaitClosed(milliseconds(1000))) << request;
}

TEST(AdminServerTest, MalformedRequestIs400) {
  AdminServer server;  // 5 s deadline: each answer below comes long before it
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  ExpectRejected(*port, "GARBAGE\r\n\r\n", 400);
  ExpectRejected(*port, "GET /livez\r\nHost: test\r\n\r\n", 400);
  ExpectRejected(*port, "GET /livez HTTP/1.1\r\n\r\n", 400);  // no Host
  ExpectRejected(*port, "GET /livez HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400);
  ExpectRejected(*port, "GET /livez HTTP/1.1\r\nHost: test\r\nno colon\r\n\r\n", 400);
  ExpectRejected(*port, "GET /livez HTTP/1.1\r\nHost: test\r\n folded\r\n\r\n", 400);
  ExpectRejected(*port, "GET livez HTTP/1.1\r\nHost: test\r\n\r\n", 400);
  ExpectRejected(*port, "GET /livez HTTP/1.1\r\nHost: test\r\nContent-Length: x\r\n\r\n", 400);
  ExpectRejected(*port, std::string("\x16\x03\x01\x02\x00\x01\x00", 7), 400);  // TLS hello
  ExpectRejected(*port, "GET /livez HTTP/2.0\r\n\r\n", 505);
  EXPECT_EQ(MetricValue(*server.registry(), "onlineps_admin_requests_total", "code", "400"), 9);
}

TEST(AdminServerTest, OtherMethodsAre405WithAllow) {
  AdminServer server;
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  auto client = RawClient::Connect(*port);
  ASSERT_TRUE(client);
  for (const char* method : {"POST", "PUT", "DELETE", "OPTIONS"}) {
    ASSERT_TRUE(client->Send(std::string(method) +
                             " /metrics HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n"));
    std::optional<Reply> res = client->Read(milliseconds(1000));
    ASSERT_TRUE(res) << method;
    EXPECT_EQ(res->status, 405) << method;
    EXPECT_EQ(res->Header("allow"), "GET, HEAD");
  }
  ASSERT_TRUE(client->Send(GetRequest("/livez")));  // still kept alive
  std::optional<Reply> res = client->Read(milliseconds(1000));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  // With a body that is never read, the connection cannot go on.
  ExpectRejected(*port, "POST /livez HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n\r\nhello",
                 405);
}

TEST(AdminServerTest, UnknownPathIs404AndQueryIsIgnored) {
  AdminServer server;
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  for (const char* path : {"/nope", "/livez/", "/metricsx", "/"}) {
    std::optional<Reply> res = Probe(*port, path, milliseconds(1000));
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 404) << path;
  }
  std::optional<Reply> query = Probe(*port, "/livez?verbose=1", milliseconds(1000));
  ASSERT_TRUE(query);
  EXPECT_EQ(query->status, 200);
}

TEST(AdminServerTest, RequestBodyIs413) {
  AdminServer server;
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  ExpectRejected(*port, GetRequest("/livez", "Content-Length: 3\r\n") + "abc", 413);
  ExpectRejected(
      *port, GetRequest("/livez", "Transfer-Encoding: chunked\r\n") + "3\r\nabc\r\n0\r\n\r\n", 413);
  auto client = RawClient::Connect(*port);  // an empty body is no body
  ASSERT_TRUE(client && client->Send(GetRequest("/livez", "Content-Length: 0\r\n")));
  std::optional<Reply> res = client->Read(milliseconds(1000));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(AdminServerTest, HugeHeaderIs431) {
  AdminServer server;  // 8 KiB of request line and headers
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  ExpectRejected(*port, GetRequest("/livez", "X-Big: " + std::string(10000, 'a') + "\r\n"), 431);
  // Answered as soon as the cap is passed, not at the end of the headers or the deadline.
  const auto start = Clock::now();
  ExpectRejected(*port, GetRequest("/livez", "X-Big: " + std::string(10000, 'a')), 431);
  EXPECT_LT(MsSince(start), 1000);
  // Just under the cap is served.
  auto client = RawClient::Connect(*port);
  ASSERT_TRUE(client &&
              client->Send(GetRequest("/livez", "X-Big: " + std::string(8000, 'a') + "\r\n")));
  std::optional<Reply> res = client->Read(milliseconds(1000));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(AdminServerTest, PipelinedRequestsAreAnsweredInOrder) {
  AdminServer server;
  server.SetReadyCheck([] { return Status::Ok(); });
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  auto client = RawClient::Connect(*port);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Send(GetRequest("/livez") + "HEAD /metrics HTTP/1.1\r\nHost: test\r\n\r\n" +
                           GetRequest("/nope") + GetRequest("/readyz")));
  std::optional<Reply> livez = client->Read(milliseconds(1000));
  std::optional<Reply> head = client->Read(milliseconds(1000), /*head=*/true);
  std::optional<Reply> nope = client->Read(milliseconds(1000));
  std::optional<Reply> readyz = client->Read(milliseconds(1000));
  ASSERT_TRUE(livez && head && nope && readyz);
  EXPECT_EQ(livez->body, "ok\n");
  EXPECT_NE(livez->Header("date").find(" GMT"), std::string::npos);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->Header("content-type"), "text/plain; version=0.0.4");
  EXPECT_GT(std::stoul(head->Header("content-length")), 0u);  // the length GET would send
  EXPECT_EQ(nope->status, 404);
  EXPECT_EQ(readyz->body, "ready\n");

  // A request split across packets, then one that asks to close.
  ASSERT_TRUE(client->Send("GET /hea"));
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_TRUE(client->Send("lthz HTTP/1.1\r\nHost: test\r\n\r\n"));
  std::optional<Reply> healthz = client->Read(milliseconds(1000));
  ASSERT_TRUE(healthz);
  EXPECT_EQ(healthz->body, "ok\n");
  ASSERT_TRUE(client->Send(GetRequest("/livez", "Connection: close\r\n")));
  std::optional<Reply> last = client->Read(milliseconds(1000));
  ASSERT_TRUE(last);
  EXPECT_EQ(last->Header("connection"), "close");
  EXPECT_TRUE(client->WaitClosed(milliseconds(1000)));
}

TEST(AdminServerTest, Http10ClosesUnlessKeepAlive) {
  AdminServer server;
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  auto client = RawClient::Connect(*port);
  ASSERT_TRUE(client && client->Send("GET /livez HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  std::optional<Reply> kept = client->Read(milliseconds(1000));
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->Header("connection"), "keep-alive");
  ASSERT_TRUE(client->Send("GET /livez HTTP/1.0\r\n\r\n"));
  std::optional<Reply> closed = client->Read(milliseconds(1000));
  ASSERT_TRUE(closed);
  EXPECT_EQ(closed->body, "ok\n");
  EXPECT_TRUE(client->WaitClosed(milliseconds(1000)));
}

// A scraper that asks for a response larger than the socket buffers and never reads
// it: the loop writes as the socket allows, serves everyone else meanwhile, and drops
// the reader at the write deadline.
TEST(AdminServerTest, ClientThatNeverReadsDoesNotBlockOthers) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildCounter()
                     .Name("test_big_family_total")
                     .Help("Long label values, so that /metrics is megabytes")
                     .Register(*registry);
  for (int i = 0; i < 4000; ++i) {  // 8 MB: more than loopback's 4 MiB socket buffers hold
    family.Add({{"key", std::to_string(i) + std::string(2000, 'v')}});
  }
  AdminServerOptions options;
  options.write_deadline = milliseconds(500);
  AdminServer server(registry, options);
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  auto stuck = RawClient::Connect(*port, nullptr, /*rcvbuf=*/4096);
  ASSERT_TRUE(stuck && stuck->Send(GetRequest("/metrics")));
  // Serializing 8 MB takes the I/O thread a moment; the probes start once it is queued.
  ASSERT_TRUE(WaitFor(
      [&] { return MetricValue(*registry, "onlineps_admin_requests_total", "code", "200") == 1; },
      milliseconds(3000)));
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    std::optional<Reply> res = Probe(*port, "/livez", milliseconds(2000));
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    EXPECT_LT(MsSince(start), 200);
  }
  EXPECT_TRUE(WaitFor(
      [&] {
        return MetricValue(*registry, "onlineps_admin_connections_timed_out_total", "reason",
                           "write_deadline") == 1;
      },
      milliseconds(3000)));
  EXPECT_TRUE(stuck->WaitClosed(milliseconds(2000)));
}

// Mutated requests (seeded, so a failure replays) on 300 connections at once: the
// server never crashes, ends each connection with an answer, a deadline or the
// client's close, and holds none at the end.
TEST(AdminServerTest, MutatedRequestsLeaveNoConnectionBehind) {
  AdminServerOptions options;
  options.request_deadline = milliseconds(300);
  options.idle_timeout = milliseconds(300);
  options.max_connections_per_address = 1000;
  AdminServer server(nullptr, options);
  StatusOr<int> port = server.Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  const std::vector<std::string> seeds = {
      GetRequest("/metrics") + GetRequest("/livez"),
      "HEAD /readyz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
      GetRequest("/livez", "Content-Length: 2\r\nConnection: close\r\n") + "ab",
      "GET http://h/metrics?x=1 HTTP/1.1\r\nHost: h\r\nX: a, b\r\n\r\n"};
  std::mt19937 rng(18);
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 300; ++i) {
    std::string bytes = seeds[rng() % seeds.size()];
    for (int m = rng() % 4; m >= 0; --m) {
      size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes.insert(at, 1, "\r\n :\0/"[rng() % 6]);
          break;
        default:
          bytes.erase(at, 1 + rng() % 8);
          break;
      }
    }
    clients.push_back(RawClient::Connect(*port));
    ASSERT_TRUE(clients.back());
    clients.back()->Send(bytes);
    if (rng() % 2) shutdown(clients.back()->fd(), SHUT_WR);
  }
  for (size_t i = 0; i < clients.size(); ++i) {
    EXPECT_TRUE(clients[i]->WaitClosed(milliseconds(2000))) << "case " << i;
  }
  std::optional<Reply> res = Probe(*port, "/livez", milliseconds(1000));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_TRUE(WaitFor(
      [&] { return MetricValue(*server.registry(), "onlineps_admin_open_connections") == 0; },
      milliseconds(2000)));
}

TEST(AdminServerTest, StopClosesOpenConnections) {
  auto server = std::make_unique<AdminServer>();
  StatusOr<int> port = server->Start(kHost, 0);
  ASSERT_TRUE(port.ok());
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 10; ++i) {
    clients.push_back(RawClient::Connect(*port));
    ASSERT_TRUE(clients.back() && clients.back()->Send("GET /livez HTTP/1.1\r\n"));
  }
  ASSERT_TRUE(WaitFor(
      [&] { return MetricValue(*server->registry(), "onlineps_admin_open_connections") == 10; },
      milliseconds(2000)));
  const auto start = Clock::now();
  server->Stop();
  EXPECT_LT(MsSince(start), 1000);
  for (auto& c : clients) EXPECT_TRUE(c->WaitClosed(milliseconds(1000)));
  EXPECT_EQ(MetricValue(*server->registry(), "onlineps_admin_open_connections"), 0);
}

}  // namespace
}  // namespace onlineps
