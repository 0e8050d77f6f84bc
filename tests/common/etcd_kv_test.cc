// EtcdKv (common/etcd_kv.h) against a real etcd started by the test: leases, prefix
// reads, compare-and-swap transactions, lease expiry deleting keys, and clear errors
// when etcd cannot be reached.
#include "common/etcd_kv.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "tests/etcd_server.h"

namespace onlineps {
namespace {

using testing::EtcdServer;

KvResult Wait(std::function<void(KvStore::Callback)> call) {
  auto p = std::make_shared<std::promise<KvResult>>();
  auto f = p->get_future();
  call([p](KvResult r) { p->set_value(std::move(r)); });
  return f.get();
}

TEST(Base64Test, RoundTripsEveryLength) {
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  std::string bytes;
  for (int i = 0; i < 300; ++i) {
    bytes.push_back(static_cast<char>(i * 37));
    auto back = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, bytes);
  }
  EXPECT_FALSE(Base64Decode("Zm9v!").ok());
}

TEST(EtcdEndpointsTest, BadEntriesAreNamed) {
  EXPECT_TRUE(ValidateEtcdEndpoints({"http://127.0.0.1:2379", "10.0.0.1:2379"}).ok());
  Status st = ValidateEtcdEndpoints({"http://127.0.0.1:2379", "nohost"});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("nohost"), std::string::npos) << st.ToString();
  EXPECT_FALSE(ValidateEtcdEndpoints({"http://h:99999"}).ok());
  EXPECT_FALSE(ValidateEtcdEndpoints({"https://h:2379"}).ok());
  EXPECT_FALSE(ValidateEtcdEndpoints({}).ok());
}

class EtcdKvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(etcd_.ok()) << "etcd did not start (is etcd-server installed?)";
    EtcdKvOptions o;
    o.endpoints = {etcd_.endpoint()};
    kv_ = NewEtcdKv(o);
  }
  EtcdServer etcd_;
  std::unique_ptr<KvStore> kv_;
};

TEST_F(EtcdKvTest, TxnCreatesOnlyWhenAbsentAndReportsRevisions) {
  KvTxn create;
  create.compares.push_back({"/g/leader", KvTxn::Compare::Target::kCreateRevision, 0});
  create.puts.push_back({"/g/leader", "{\"index\":0}", 0});
  create.read_prefix = "/g/";
  KvResult first = Wait([&](auto cb) { kv_->Txn(create, cb); });
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  EXPECT_TRUE(first.succeeded);
  ASSERT_EQ(first.entries.size(), 1u);
  EXPECT_EQ(first.entries[0].key, "/g/leader");
  EXPECT_EQ(first.entries[0].value, "{\"index\":0}");
  EXPECT_EQ(first.entries[0].create_revision, first.revision);

  KvResult second = Wait([&](auto cb) { kv_->Txn(create, cb); });
  ASSERT_TRUE(second.status.ok());
  EXPECT_FALSE(second.succeeded);
  EXPECT_EQ(second.revision, first.revision);  // nothing written
  ASSERT_EQ(second.entries.size(), 1u);        // the read still runs on failure

  // A compare on the mod revision: the stale one fails, the current one succeeds.
  KvTxn cas;
  cas.compares.push_back({"/g/leader", KvTxn::Compare::Target::kModRevision, first.revision + 5});
  cas.puts.push_back({"/g/isr", "x", 0});
  EXPECT_FALSE(Wait([&](auto cb) { kv_->Txn(cas, cb); }).succeeded);
  cas.compares[0].revision = first.revision;
  EXPECT_TRUE(Wait([&](auto cb) { kv_->Txn(cas, cb); }).succeeded);

  KvResult range = Wait([&](auto cb) { kv_->Range("/g/", cb); });
  ASSERT_TRUE(range.status.ok());
  ASSERT_EQ(range.entries.size(), 2u);
  EXPECT_EQ(range.entries[0].key, "/g/isr");
  EXPECT_EQ(Wait([&](auto cb) { kv_->Range("/other/", cb); }).entries.size(), 0u);
}

TEST_F(EtcdKvTest, LeaseExpiryAndRevokeDeleteTheirKeys) {
  KvResult grant = Wait([&](auto cb) { kv_->Grant(1, cb); });
  ASSERT_TRUE(grant.status.ok()) << grant.status.ToString();
  ASSERT_NE(grant.lease, 0u);
  EXPECT_GE(grant.ttl_s, 1);
  KvTxn put;
  put.puts.push_back({"/l/a", "1", grant.lease});
  ASSERT_TRUE(Wait([&](auto cb) { kv_->Txn(put, cb); }).succeeded);
  KvResult alive = Wait([&](auto cb) { kv_->KeepAlive(grant.lease, cb); });
  ASSERT_TRUE(alive.status.ok());
  EXPECT_GE(alive.ttl_s, 1);
  // Not kept alive: gone after the TTL.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  size_t left = 1;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = Wait([&](auto cb) { kv_->Range("/l/", cb); }).entries.size();
  }
  EXPECT_EQ(left, 0u);
  EXPECT_LE(Wait([&](auto cb) { kv_->KeepAlive(grant.lease, cb); }).ttl_s, 0);

  KvResult g2 = Wait([&](auto cb) { kv_->Grant(30, cb); });
  put.puts[0].lease = g2.lease;
  ASSERT_TRUE(Wait([&](auto cb) { kv_->Txn(put, cb); }).succeeded);
  ASSERT_TRUE(Wait([&](auto cb) { kv_->Revoke(g2.lease, cb); }).status.ok());
  EXPECT_EQ(Wait([&](auto cb) { kv_->Range("/l/", cb); }).entries.size(), 0u);
  // A put on a revoked lease is refused by etcd, with its message.
  KvResult refused = Wait([&](auto cb) { kv_->Txn(put, cb); });
  EXPECT_FALSE(refused.status.ok());
  EXPECT_NE(refused.status.message().find("lease"), std::string::npos) << refused.status.ToString();
}

TEST_F(EtcdKvTest, UnreachableEtcdFailsFastNamingIt) {
  EtcdKvOptions o;
  o.endpoints = {"http://127.0.0.1:" + std::to_string(testing::FreeLoopbackPort())};
  o.timeout = std::chrono::milliseconds(300);
  auto kv = NewEtcdKv(o);
  const auto t0 = std::chrono::steady_clock::now();
  KvResult r = Wait([&](auto cb) { kv->Range("/x/", cb); });
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status.message().find("etcd unreachable"), std::string::npos) << r.status.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  // A second endpoint that answers is used after the first fails.
  EtcdKvOptions two = o;
  two.endpoints.push_back(etcd_.endpoint());
  auto kv2 = NewEtcdKv(two);
  EXPECT_TRUE(Wait([&](auto cb) { kv2->Range("/x/", cb); }).status.ok());
}

// Seconds a call with a 300 ms timeout took against a member that dribbles its answer,
// one byte every 100 ms for up to 10 s: its headers (`headers`) or its body.
double DribbledCallSeconds(bool headers, Status* status) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(lfd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    const int c = ::accept(lfd, nullptr, nullptr);
    if (c < 0) return;
    char buf[4096];
    (void)::recv(c, buf, sizeof(buf), 0);
    const std::string head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n";
    const std::string dribble = headers ? head : std::string(100, ' ');
    if (!headers) (void)::send(c, head.data(), head.size(), MSG_NOSIGNAL);
    for (size_t i = 0; i < 100 && i < dribble.size() && !stop; ++i) {
      (void)::send(c, &dribble[i], 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::close(c);
  });
  EtcdKvOptions o;
  o.endpoints = {"127.0.0.1:" + std::to_string(port)};
  o.timeout = std::chrono::milliseconds(300);
  auto kv = NewEtcdKv(o);
  std::promise<KvResult> p;
  const auto start = std::chrono::steady_clock::now();
  kv->Grant(10, [&](KvResult r) { p.set_value(std::move(r)); });
  auto f = p.get_future();
  const bool done = f.wait_for(std::chrono::seconds(15)) == std::future_status::ready;
  stop = true;
  f.wait();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  server.join();
  ::close(lfd);
  EXPECT_TRUE(done);
  *status = f.get().status;
  return took;
}

// A member that answers a byte at a time must not hold a call (and the lease renewals
// queued behind it) past the per-call timeout: the client's own timeouts bound each read.
TEST(EtcdKvTimeoutTest, ADribblingAnswerDoesNotOutliveTheCallTimeout) {
  for (const bool headers : {false, true}) {
    Status st;
    const double took = DribbledCallSeconds(headers, &st);
    EXPECT_LT(took, 1.5) << "a call with a 300 ms timeout took " << took << " s, the "
                         << (headers ? "headers" : "body") << " dribbled";
    EXPECT_FALSE(st.ok());
  }
}

}  // namespace
}  // namespace onlineps
