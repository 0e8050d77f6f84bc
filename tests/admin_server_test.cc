#include "common/admin_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <prometheus/counter.h>

#include <atomic>
#include <memory>
#include <string>

namespace onlineps {
namespace {

constexpr char kHost[] = "127.0.0.1";

httplib::Result Get(int port, const std::string& path) {
  httplib::Client client(kHost, port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(2, 0);
  return client.Get(path.c_str());
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
  EXPECT_NE(body.find("onlineps_build_info{version=\"0.1.0\"} 1"), std::string::npos) << body;
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

}  // namespace
}  // namespace onlineps
