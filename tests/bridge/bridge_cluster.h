// Test helper: a PS shard, workers and an MCP bridge as real processes on loopback,
// and the shared MCP-over-HTTP client (common/mcp_client.h), whose raw layer lets tests
// see status codes and headers exactly as an MCP client would.
#ifndef ONLINEPS_TESTS_BRIDGE_BRIDGE_CLUSTER_H_
#define ONLINEPS_TESTS_BRIDGE_BRIDGE_CLUSTER_H_

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/mcp_client.h"
#include "tests/subprocess.h"

namespace onlineps::testing {

using nlohmann::json;

inline constexpr std::chrono::milliseconds kProcessStart{30000};

class BridgeCluster {
 public:
  bool StartShard() {
    shard_ = std::make_unique<Subprocess>(std::vector<std::string>{
        ONLINEPS_BIN_DIR "/onlineps_ps", "--shard-index", "0", "--num-shards", "1", "--listen",
        "tcp://127.0.0.1:0", "--admin-port", "-1", "--log-level", "warn"});
    shard_endpoint_ = shard_->WaitForLine("LISTENING ", kProcessStart);
    return !shard_endpoint_.empty();
  }
  // The text model on `listen` (tcp://127.0.0.1:0 for any port). Returns its endpoint.
  std::string StartWorker(const std::string& listen = "tcp://127.0.0.1:0") {
    auto p = std::make_unique<Subprocess>(std::vector<std::string>{
        ONLINEPS_BIN_DIR "/onlineps_worker", "--ps", shard_endpoint_, "--listen", listen, "--model",
        "text", "--labels", "negative,positive", "--lr", "1.0", "--admin-port", "-1", "--log-level",
        "warn"});
    const std::string ep = p->WaitForLine("LISTENING ", kProcessStart);
    workers_.push_back(std::move(p));
    return ep;
  }
  pid_t ShardPid() const { return shard_->pid(); }
  pid_t WorkerPid(size_t i) const { return workers_[i]->pid(); }
  void KillWorker(size_t i) {
    workers_[i]->Stop(SIGKILL, std::chrono::milliseconds(10000));
    workers_[i].reset();
  }
  // Starts the bridge on any port; returns its port, or 0.
  // With `admin_port`, the admin endpoint listens on a free port, stored there.
  int StartBridge(const std::vector<std::string>& workers, std::vector<std::string> flags = {},
                  int* admin_port = nullptr) {
    std::string list;
    for (const auto& w : workers) list += (list.empty() ? "" : ",") + w;
    std::vector<std::string> argv = {ONLINEPS_BIN_DIR "/onlineps_mcp_bridge",
                                     "--workers",
                                     list,
                                     "--port",
                                     "0",
                                     "--admin-port",
                                     admin_port ? "0" : "-1"};
    // Defaults for tests, unless `flags` sets them (a flag may be given once).
    for (const auto& [flag, value] :
         std::vector<std::pair<std::string, std::string>>{{"--log-level", "warn"},
                                                          {"--health-interval-ms", "200"},
                                                          {"--health-timeout-ms", "500"}}) {
      if (std::find(flags.begin(), flags.end(), flag) == flags.end()) {
        argv.push_back(flag);
        argv.push_back(value);
      }
    }
    argv.insert(argv.end(), flags.begin(), flags.end());
    bridge_ = std::make_unique<Subprocess>(argv);
    if (admin_port) {
      const std::string admin = bridge_->WaitForLine("ADMIN ", kProcessStart);
      *admin_port = admin.empty() ? 0 : std::stoi(admin.substr(admin.rfind(':') + 1));
    }
    const std::string url = bridge_->WaitForLine("LISTENING ", kProcessStart);
    if (url.empty()) return 0;
    const size_t colon = url.rfind(':');
    return std::stoi(url.substr(colon + 1, url.find('/', colon) - colon - 1));
  }
  int StopBridge() { return bridge_->Stop(SIGTERM, std::chrono::milliseconds(10000)); }
  void KillBridge() { bridge_->Stop(SIGKILL, std::chrono::milliseconds(10000)); }
  const std::string& shard_endpoint() const { return shard_endpoint_; }

 private:
  std::unique_ptr<Subprocess> shard_, bridge_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::string shard_endpoint_;
};

// A shard and one text-model worker, started for each test; Start() adds the bridge.
class BridgeFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.StartShard());
    worker_ = cluster_.StartWorker();
    ASSERT_FALSE(worker_.empty());
  }
  // The bridge on the worker with `flags`; returns its port.
  int Start(std::vector<std::string> flags = {}) {
    const int port = cluster_.StartBridge({worker_}, std::move(flags));
    EXPECT_GT(port, 0);
    return port;
  }
  BridgeCluster cluster_;
  std::string worker_;
};

using HttpReply = McpHttpReply;

// The shared MCP client (common/mcp_client.h) with the tests' shorthands: Initialize
// returns the session id, Call the JSON-RPC result or error object, whatever the status.
class McpHttp {
 public:
  explicit McpHttp(int port) : client_(LoopbackMcpUrl(port), Options()) {}
  httplib::Headers Headers() const { return client_.Headers(); }
  HttpReply Post(const std::string& body, const httplib::Headers& h,
                 const std::string& ctype = "application/json") {
    return client_.Post(body, h, ctype);
  }
  HttpReply Send(const json& message) { return client_.Send(message); }
  // DELETE of the session; returns the HTTP status (0: no reply).
  int Delete() { return client_.Delete(); }
  // initialize + notifications/initialized; returns the session id ("" on failure).
  std::string Initialize(const std::string& version = kMcpProtocolVersion) {
    return client_.Initialize(version).ok() ? client_.session_id() : "";
  }
  // tools/call; returns the JSON-RPC result (or the error message object).
  json Call(const std::string& tool, const json& args, int* status = nullptr) {
    HttpReply r = client_.SendToolCall(tool, args);
    if (status) *status = r.status;
    if (!r.body.is_object()) return json();
    return r.body.contains("result") ? r.body["result"] : r.body;
  }
  void set_token(std::string t) { client_.set_token(std::move(t)); }
  void set_keep_alive(bool on) { client_.set_keep_alive(on); }
  void set_session(std::string s) { client_.set_session(std::move(s)); }
  const std::string& session() const { return client_.session_id(); }
  int next_id() { return static_cast<int>(client_.NextId()); }

 private:
  static McpClientOptions Options() {
    McpClientOptions o;
    o.timeout_ms = 60000;
    o.client_name = "bridge-test";
    return o;
  }
  McpHttpClient client_;
};

}  // namespace onlineps::testing

#endif  // ONLINEPS_TESTS_BRIDGE_BRIDGE_CLUSTER_H_
