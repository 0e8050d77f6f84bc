// The bridge's --state-dir through the real binaries: after a kill -9 and a restart on
// the same directory, sessions go on with their contexts, still bound to their
// identity; ended sessions stay ended; and the directory shows other users nothing.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/bridge/bridge_cluster.h"

namespace onlineps::testing {
namespace {

namespace fs = std::filesystem;

// Folders 0700, files 0600, and no name or content showing a session id (nor its hex,
// as names did before ids were hashed). Returns how many files there are.
size_t ExpectPrivate(const std::string& root, const std::vector<std::string>& ids) {
  auto mode = [](const fs::path& p) {
    struct stat st;
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 0777;
  };
  EXPECT_EQ(mode(root), 0700u) << root;
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    std::stringstream text;
    if (e.is_regular_file()) text << std::ifstream(e.path(), std::ios::binary).rdbuf();
    for (const std::string& id : ids) {
      std::string hex;
      for (unsigned char c : id) hex += {"0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]};
      for (const std::string& shown : {id, hex}) {
        EXPECT_EQ(e.path().filename().string().find(shown), std::string::npos) << e.path();
        EXPECT_EQ(text.str().find(shown), std::string::npos) << e.path() << ": " << text.str();
      }
    }
    EXPECT_EQ(mode(e.path()), e.is_regular_file() ? 0600u : 0700u) << e.path();
    files += e.is_regular_file();
  }
  return files;
}

class BridgeRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    old_umask_ = ::umask(022);  // the usual one, inherited by the bridge
    std::string tmpl = ::testing::TempDir() + "/bridge_restart.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/tokens") << "alice alice-token-0123456789\nbob bob-token-0123456789ab\n";
    ASSERT_TRUE(cluster_.StartShard());
    worker_ = cluster_.StartWorker();
    ASSERT_FALSE(worker_.empty());
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    ::umask(old_umask_);
  }
  int StartBridge(bool with_state = true) {
    std::vector<std::string> flags = {"--tokens-file", dir_ + "/tokens"};
    if (with_state) flags.insert(flags.end(), {"--state-dir", dir_ + "/state"});
    return cluster_.StartBridge({worker_}, flags);
  }
  static json Items(const json& reply) { return reply["structuredContent"].value("items", json()); }

  BridgeCluster cluster_;
  std::string dir_, worker_;
  mode_t old_umask_ = 0;
};

TEST_F(BridgeRestartTest, SessionsAndContextsSurviveAKill9) {
  int port = StartBridge();
  ASSERT_GT(port, 0);
  McpHttp alice(port), bob(port), carol(port);
  alice.set_token("alice-token-0123456789");
  carol.set_token("alice-token-0123456789");
  bob.set_token("bob-token-0123456789ab");
  ASSERT_FALSE(alice.Initialize().empty());
  ASSERT_FALSE(bob.Initialize().empty());
  ASSERT_FALSE(carol.Initialize().empty());
  alice.Call("set_context", {{"items", {"likes thrillers"}}, {"features", {0.5, -2}}});
  alice.Call("append_context", {{"text", "hates musicals"}});
  alice.Call("set_context", {{"session", "notes"}, {"items", {"named"}}});
  bob.Call("set_context", {{"items", {"bob's"}}});
  carol.Call("set_context", {{"items", {"carol's"}}});
  EXPECT_EQ(carol.Delete(), 200);
  json before = alice.Call("infer", {{"text", "a lovely film"}});
  ASSERT_FALSE(before.value("isError", true)) << before.dump();
  const std::vector<std::string> ids = {alice.session(), bob.session(), carol.session()};
  // Alice's and Bob's sessions; their contexts and Alice's named one (Carol's went).
  EXPECT_EQ(ExpectPrivate(dir_ + "/state", ids), 6u);  // with the lock file

  cluster_.KillBridge();
  port = StartBridge();
  ASSERT_GT(port, 0);
  McpHttp a2(port), b2(port), c2(port), thief(port);
  a2.set_token("alice-token-0123456789");
  a2.set_session(alice.session());
  b2.set_token("bob-token-0123456789ab");
  b2.set_session(bob.session());
  c2.set_token("alice-token-0123456789");
  c2.set_session(carol.session());
  thief.set_token("bob-token-0123456789ab");
  thief.set_session(alice.session());

  json got = a2.Call("get_context", json::object());
  EXPECT_EQ(Items(got), json::array({"likes thrillers", "hates musicals"})) << got.dump();
  EXPECT_EQ(got["structuredContent"]["features"], json::array({0.5, -2.0})) << got.dump();
  EXPECT_EQ(Items(a2.Call("get_context", {{"session", "notes"}})), json::array({"named"}));
  EXPECT_EQ(Items(b2.Call("get_context", json::object())), json::array({"bob's"}));
  json after = a2.Call("infer", {{"text", "a lovely film"}});  // the context reaches the worker
  ASSERT_FALSE(after.value("isError", true)) << after.dump();
  EXPECT_EQ(after["structuredContent"]["scores"], before["structuredContent"]["scores"]);
  int status = 0;
  thief.Call("get_context", json::object(), &status);
  EXPECT_EQ(status, 404);  // still bound to Alice's identity
  c2.Call("get_context", json::object(), &status);
  EXPECT_EQ(status, 404);                              // ended before the crash: stays ended
  EXPECT_EQ(ExpectPrivate(dir_ + "/state", ids), 6u);  // after a restart and use: still so
  EXPECT_EQ(a2.Delete(), 200);

  // Without the directory the loss is explicit.
  cluster_.StopBridge();
  port = StartBridge(/*with_state=*/false);
  ASSERT_GT(port, 0);
  McpHttp b3(port);
  b3.set_token("bob-token-0123456789ab");
  b3.set_session(bob.session());
  b3.Call("get_context", json::object(), &status);
  EXPECT_EQ(status, 404);
  // And back on the directory: Bob's session is there, Alice's (deleted) is not.
  cluster_.StopBridge();
  port = StartBridge();
  ASSERT_GT(port, 0);
  McpHttp b4(port), a4(port);
  b4.set_token("bob-token-0123456789ab");
  b4.set_session(bob.session());
  EXPECT_EQ(Items(b4.Call("get_context", json::object())), json::array({"bob's"}));
  a4.set_token("alice-token-0123456789");
  a4.set_session(alice.session());
  a4.Call("get_context", json::object(), &status);
  EXPECT_EQ(status, 404);
}

TEST_F(BridgeRestartTest, AnUnusableStateDirIsAClearStartError) {
  std::ofstream(dir_ + "/not-a-dir") << "x";
  Subprocess bridge({ONLINEPS_BIN_DIR "/onlineps_mcp_bridge", "--workers", worker_, "--port", "0",
                     "--admin-port", "-1", "--state-dir", dir_ + "/not-a-dir"});
  // Exits with the usage code at once (bridge_state_test checks the message names it).
  EXPECT_EQ(bridge.Wait(std::chrono::milliseconds(20000)), 2);
}

// A bridge stopped while it waits for its first healthy worker (a pod deleted before the
// workers are up) exits at once: it ended the whole --wait-workers-s wait, then bound its
// port and said it served, before it looked at the signal.
TEST_F(BridgeRestartTest, SigtermWhileWaitingForWorkersExitsAtOnce) {
  Subprocess bridge({ONLINEPS_BIN_DIR "/onlineps_mcp_bridge", "--workers",
                     "tcp://127.0.0.1:" + std::to_string(FreePort()), "--port", "0", "--admin-port",
                     "-1", "--wait-workers-s", "30", "--log-level", "info"},
                    /*with_stderr=*/true);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(bridge.pid(), SIGTERM), 0);
  const int rc = bridge.Wait(std::chrono::milliseconds(20000));
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - sent)
          .count();
  EXPECT_EQ(rc, 0);
  EXPECT_LT(ms, 2000) << "the bridge waited out --wait-workers-s";
}

// One bridge per --state-dir: a second one on the same directory exits at once, naming
// it, instead of running beside the first and rewriting its sessions.
TEST_F(BridgeRestartTest, ASecondBridgeOnTheSameStateDirExitsNamingIt) {
  const std::vector<std::string> argv = {ONLINEPS_BIN_DIR "/onlineps_mcp_bridge",
                                         "--workers",
                                         worker_,
                                         "--port",
                                         "0",
                                         "--admin-port",
                                         "-1",
                                         "--state-dir",
                                         dir_ + "/state"};
  Subprocess first(argv);
  ASSERT_FALSE(first.WaitForLine("LISTENING ", kProcessStart).empty());
  Subprocess second(argv, /*with_stderr=*/true);
  const std::string out = second.ReadToEnd(std::chrono::milliseconds(20000));
  EXPECT_EQ(second.Wait(std::chrono::milliseconds(20000)), 2) << out;
  EXPECT_NE(out.find("another process is using the --state-dir " + dir_ + "/state"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace onlineps::testing
