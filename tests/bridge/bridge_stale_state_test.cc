// What the bridge does not hold is not used, through the real binaries: a context the
// bridge no longer has (it restarted, or the context was cleared after a restart) is not
// applied by a worker that still holds a copy; a worker's labels that are not UTF-8 do
// not stop --record; a lifetime flag too long to compare is refused at start.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <thread>

#include "tests/bridge/bridge_cluster.h"

namespace onlineps::testing {
namespace {

namespace fs = std::filesystem;

class BridgeStaleStateTest : public BridgeFixture {
 protected:
  // Teaches the shared model that "awful terrible" is negative, so that a context of
  // those words moves an infer's scores.
  void Teach(McpHttp* c) {
    for (int i = 0; i < 5; ++i) {
      json r = c->Call("learn", {{"examples",
                                  {{{"text", "awful terrible"}, {"label", "negative"}},
                                   {{"text", "great nice"}, {"label", "positive"}}}}});
      ASSERT_EQ(r["structuredContent"]["outcome"], "applied") << r.dump();
    }
  }
  static double Negative(McpHttp* c, const std::string& handle) {
    json r = c->Call("infer", {{"text", "hello"}, {"session", handle}});
    EXPECT_FALSE(r.value("isError", true)) << r.dump();
    return r["structuredContent"]["scores"].value("negative", -1.0);
  }
  std::string TempDir() {
    std::string tmpl = ::testing::TempDir() + "/stale-state.XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    return tmpl;
  }
};

// After a restart (no --state-dir) the bridge holds no context for a handle, and says so
// (get_context: found false), yet an infer of that handle was served with the context the
// worker still held from before the restart.
TEST_F(BridgeStaleStateTest, AContextTheBridgeNoLongerHoldsIsNotUsedAfterARestart) {
  const int port = Start();
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  Teach(&c);
  const double plain = Negative(&c, "h");
  ASSERT_FALSE(c.Call("set_context", {{"session", "h"}, {"items", {"awful terrible awful"}}})
                   .value("isError", true));
  const double with_context = Negative(&c, "h");
  ASSERT_GT(with_context, plain + 0.05);  // the context matters

  cluster_.KillBridge();
  const int port2 = Start();
  McpHttp d(port2);
  ASSERT_FALSE(d.Initialize().empty());
  EXPECT_EQ(d.Call("get_context", {{"session", "h"}})["structuredContent"]["found"], false);
  EXPECT_NEAR(Negative(&d, "h"), plain, 1e-6) << "served with a context the bridge says is gone";
}

// With --state-dir: clear_context on the restarted bridge, then infer: the cleared context
// was still applied by the worker.
TEST_F(BridgeStaleStateTest, AContextClearedAfterAStateDirRestartIsNotUsed) {
  const std::string dir = TempDir() + "/state";
  const int port = Start({"--state-dir", dir});
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  Teach(&c);
  const double plain = Negative(&c, "k");
  ASSERT_FALSE(c.Call("set_context", {{"session", "k"}, {"items", {"awful terrible awful"}}})
                   .value("isError", true));
  ASSERT_GT(Negative(&c, "k"), plain + 0.05);

  cluster_.KillBridge();
  const int port2 = Start({"--state-dir", dir});
  McpHttp d(port2);
  ASSERT_FALSE(d.Initialize().empty());
  EXPECT_EQ(d.Call("get_context", {{"session", "k"}})["structuredContent"]["found"], true);
  EXPECT_EQ(d.Call("clear_context", {{"session", "k"}})["structuredContent"]["cleared"], true);
  EXPECT_NEAR(Negative(&d, "k"), plain, 1e-6) << "served with the context just cleared";
  fs::remove_all(fs::path(dir).parent_path());
}

// --record with a worker whose labels are not UTF-8 (a worker answering bytes the bridge
// cannot print): the bridge aborted at start (nlohmann type_error 316 from the trace
// header) instead of serving.
TEST_F(BridgeStaleStateTest, RecordingStartsWhateverBytesAWorkersLabelsHold) {
  Subprocess w(std::vector<std::string>{ONLINEPS_BIN_DIR "/onlineps_worker", "--ps",
                                        cluster_.shard_endpoint(), "--listen", "tcp://127.0.0.1:0",
                                        "--model", "text", "--labels", "neg\xe9,positive", "--lr",
                                        "1.0", "--admin-port", "-1", "--log-level", "warn"});
  const std::string ep = w.WaitForLine("LISTENING ", kProcessStart);
  ASSERT_FALSE(ep.empty());
  const std::string dir = TempDir();
  const int port = cluster_.StartBridge({ep}, {"--record", dir + "/trace.jsonl"});
  ASSERT_GT(port, 0) << "the bridge did not start";
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  EXPECT_FALSE(c.Call("model_info", json::object()).value("isError", true));
  fs::remove_all(dir);
}

// --session-idle-s of about 317 years (meant as "never") overflowed once compared in
// nanoseconds: every session was unknown (404) right after initialize. Lifetimes past 100
// years are refused at start, naming the flag.
TEST_F(BridgeStaleStateTest, ALifetimeTooLongToCompareIsRefusedAtStart) {
  for (const char* flag : {"--session-idle-s", "--context-ttl-s", "--context-resync-s"}) {
    Subprocess bridge({ONLINEPS_BIN_DIR "/onlineps_mcp_bridge", "--workers", worker_, "--port", "0",
                       "--admin-port", "-1", flag, "10000000000"},
                      /*with_stderr=*/true);
    const std::string said = bridge.ReadToEnd(kProcessStart);
    EXPECT_EQ(bridge.Wait(kProcessStart), 2) << flag << ": " << said;
    EXPECT_NE(said.find(flag), std::string::npos) << said;
    EXPECT_EQ(said.find("LISTENING"), std::string::npos) << said;
  }
}

}  // namespace
}  // namespace onlineps::testing
