// CurveZMQ: key files (common/curve.h) and the ZeroMQ transport with CURVE on, over
// loopback TCP: the right keys talk; a wrong server key, a client without CURVE and a
// client missing from the allow list get nothing through.
#include "common/curve.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/zmq_transport.h"

namespace onlineps {
namespace {

using namespace std::chrono_literals;

std::string TempDir() {
  char tmpl[] = "/tmp/onlineps-curve-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d ? d : "/tmp";
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

CurveKeyPair Keys() {
  auto k = NewCurveKeyPair();
  EXPECT_TRUE(k.ok()) << k.status().ToString();
  return *k;
}

TEST(CurveKeys, CertRoundTripsWithModeAndPublicHalf) {
  const std::string dir = TempDir(), path = dir + "/ps.cert";
  const CurveKeyPair k = Keys();
  ASSERT_TRUE(WriteCurveCert(path, k).ok());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto back = ReadCurveCert(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->public_key, k.public_key);
  EXPECT_EQ(back->secret_key, k.secret_key);
  auto pub = ReadCurvePublicKeys(path + ".pub");
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  EXPECT_EQ(*pub, std::vector<std::string>{k.public_key});
  // The .pub is not a certificate, and an existing file is never overwritten.
  EXPECT_NE(ReadCurveCert(path + ".pub").status().message().find("no secret-key"),
            std::string::npos);
  EXPECT_EQ(WriteCurveCert(path, Keys()).code(), StatusCode::kAlreadyExists);
}

TEST(CurveKeys, ListsCommentsAndBadLinesNamed) {
  const std::string dir = TempDir();
  const CurveKeyPair a = Keys(), b = Keys();
  WriteFile(dir + "/allow", "# clients\n" + a.public_key + "\n\n  public-key = \"" + b.public_key +
                                "\"  # the bridge\n");
  auto keys = ReadCurvePublicKeys(dir + "/allow");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, (std::vector<std::string>{a.public_key, b.public_key}));

  WriteFile(dir + "/bad", a.public_key + "\nnot-a-key\n");
  auto bad = ReadCurvePublicKeys(dir + "/bad");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bad:2"), std::string::npos) << bad.status().message();

  WriteFile(dir + "/mixed",
            "public-key = \"" + a.public_key + "\"\nsecret-key = \"" + b.secret_key + "\"\n");
  EXPECT_NE(ReadCurveCert(dir + "/mixed").status().message().find("does not belong"),
            std::string::npos);
  EXPECT_EQ(ReadCurvePublicKeys(dir + "/missing").status().code(), StatusCode::kNotFound);

  CurveFlags f;
  f.server_key = dir + "/allow";
  EXPECT_NE(LoadCurve(f).status().message().find("need --curve-cert"), std::string::npos);
  f.cert = dir + "/missing";
  EXPECT_NE(LoadCurve(f).status().message().find("--curve-cert: "), std::string::npos);
}

// A server that echoes every request; a client that counts replies.
class Echo {
 public:
  explicit Echo(const TransportOptions& o) : server_(o) {
    auto bound = server_.Start("tcp://127.0.0.1:0", [this](Incoming&& in) {
      (void)server_.Send(in.peer, std::move(in.frames));
    });
    EXPECT_TRUE(bound.ok()) << bound.status().ToString();
    endpoint_ = bound.ok() ? *bound : "";
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  ZmqServerTransport server_;
  std::string endpoint_;
};

// Sends one request; true if the echo came back within `wait`.
bool RoundTrip(const std::string& endpoint, const TransportOptions& o,
               std::chrono::milliseconds wait = 3000ms) {
  std::mutex mu;
  std::condition_variable cv;
  bool got = false;
  ZmqClientTransport client(o);
  Status st = client.Connect({endpoint}, [&](size_t, Frames&&) {
    std::lock_guard<std::mutex> l(mu);
    got = true;
    cv.notify_all();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  Frames frames;
  frames.push_back(Frame::FromString("ping"));
  EXPECT_TRUE(client.Send(0, std::move(frames)).ok());
  std::unique_lock<std::mutex> l(mu);
  cv.wait_for(l, wait, [&] { return got; });
  return got;
}

TransportOptions ServerOpts(const CurveKeyPair& k, std::vector<std::string> allowed = {}) {
  TransportOptions o;
  o.curve.public_key = k.public_key;
  o.curve.secret_key = k.secret_key;
  o.curve.allowed_clients = std::move(allowed);
  return o;
}

TransportOptions ClientOpts(const CurveKeyPair& k, const std::string& server_key) {
  TransportOptions o;
  o.curve.public_key = k.public_key;
  o.curve.secret_key = k.secret_key;
  o.curve.server_public_key = server_key;
  return o;
}

TEST(CurveTransport, RightKeysTalkWrongKeysGetNothing) {
  const CurveKeyPair server = Keys(), client = Keys(), other = Keys();
  Echo echo(ServerOpts(server));
  EXPECT_TRUE(RoundTrip(echo.endpoint(), ClientOpts(client, server.public_key)));
  // The wrong server key: the handshake fails, nothing is delivered.
  EXPECT_FALSE(RoundTrip(echo.endpoint(), ClientOpts(client, other.public_key), 1000ms));
  // A client without CURVE.
  EXPECT_FALSE(RoundTrip(echo.endpoint(), TransportOptions{}, 1000ms));
  // A CURVE client to a server without it.
  Echo plain{TransportOptions{}};
  EXPECT_FALSE(RoundTrip(plain.endpoint(), ClientOpts(client, server.public_key), 1000ms));
  EXPECT_TRUE(RoundTrip(plain.endpoint(), TransportOptions{}));
}

TEST(CurveTransport, AllowListAdmitsOnlyListedClients) {
  const CurveKeyPair server = Keys(), listed = Keys(), unlisted = Keys();
  Echo echo(ServerOpts(server, {listed.public_key}));
  EXPECT_TRUE(RoundTrip(echo.endpoint(), ClientOpts(listed, server.public_key)));
  EXPECT_FALSE(RoundTrip(echo.endpoint(), ClientOpts(unlisted, server.public_key), 1000ms));
  // A second server in the process with its own list: the lists do not mix.
  Echo second(ServerOpts(server, {unlisted.public_key}));
  EXPECT_TRUE(RoundTrip(second.endpoint(), ClientOpts(unlisted, server.public_key)));
  EXPECT_FALSE(RoundTrip(second.endpoint(), ClientOpts(listed, server.public_key), 1000ms));
  EXPECT_TRUE(RoundTrip(echo.endpoint(), ClientOpts(listed, server.public_key)));
}

TEST(CurveTransport, ClientWithoutServerKeyIsRefusedAtConnect) {
  const CurveKeyPair k = Keys();
  TransportOptions o = ClientOpts(k, "");
  ZmqClientTransport client(o);
  Status st = client.Connect({"tcp://127.0.0.1:9"}, [](size_t, Frames&&) {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--curve-server-key"), std::string::npos) << st.message();
}

// A key file with a huge line is refused (the key regex recursed once per character and
// overflowed the stack: SIGSEGV at 30,000 bytes).
TEST(CurveTest, AHugeLineIsRefusedNotACrash) {
  const std::string dir = TempDir();
  WriteFile(dir + "/huge", std::string(size_t{1} << 20, 'a') + "\n");
  auto keys = ReadCurvePublicKeys(dir + "/huge");
  EXPECT_FALSE(keys.ok());
}

}  // namespace
}  // namespace onlineps
