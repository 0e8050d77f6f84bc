// Test helper: a PS shard, workers and an MCP bridge as real processes on loopback,
// and a raw MCP-over-HTTP client (httplib) that speaks the wire format the spec
// defines, so tests see status codes and headers exactly as an MCP client would.
#ifndef ONLINEPS_TESTS_BRIDGE_CLUSTER_H_
#define ONLINEPS_TESTS_BRIDGE_CLUSTER_H_

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

#include "tests/subprocess.h"

namespace onlineps::testing {

using nlohmann::json;

inline constexpr std::chrono::milliseconds kProcessStart{30000};

// A port that was free a moment ago (for a worker the bridge must know before it starts).
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

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

struct HttpReply {
  int status = 0;
  json body;                 // null when empty; the last SSE message for event streams
  std::vector<json> events;  // every SSE message
  std::string session_id;
  std::string raw;
};

class McpHttp {
 public:
  explicit McpHttp(int port) : client_("127.0.0.1", port) {
    client_.set_read_timeout(60, 0);
    client_.set_keep_alive(true);
    client_.set_tcp_nodelay(true);
  }
  httplib::Headers Headers() const {
    httplib::Headers h = {{"Accept", "application/json, text/event-stream"}};
    if (!session_.empty()) h.emplace("Mcp-Session-Id", session_);
    if (!version_.empty()) h.emplace("MCP-Protocol-Version", version_);
    if (!token_.empty()) h.emplace("Authorization", "Bearer " + token_);
    return h;
  }
  HttpReply Post(const std::string& body, httplib::Headers h,
                 const std::string& ctype = "application/json") {
    auto r = client_.Post("/mcp", h, body, ctype);
    HttpReply out;
    if (!r) return out;
    out.status = r->status;
    out.raw = r->body;
    out.session_id = r->get_header_value("Mcp-Session-Id");
    if (r->get_header_value("Content-Type").rfind("text/event-stream", 0) == 0) {
      size_t pos = 0;
      while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
        const size_t end = r->body.find('\n', pos);
        out.events.push_back(json::parse(r->body.substr(pos + 6, end - pos - 6), nullptr, false));
        pos = end;
      }
      if (!out.events.empty()) out.body = out.events.back();
    } else if (!r->body.empty()) {
      out.body = json::parse(r->body, nullptr, false);
    }
    return out;
  }
  HttpReply Send(const json& message) { return Post(message.dump(), Headers()); }
  // DELETE of the session; returns the HTTP status (0: no reply).
  int Delete() {
    auto r = client_.Delete("/mcp", Headers());
    return r ? r->status : 0;
  }
  // initialize + notifications/initialized; returns the session id ("" on failure).
  std::string Initialize(const std::string& version = "2025-11-25") {
    HttpReply r = Send({{"jsonrpc", "2.0"},
                        {"id", next_id_++},
                        {"method", "initialize"},
                        {"params",
                         {{"protocolVersion", version},
                          {"capabilities", json::object()},
                          {"clientInfo", {{"name", "bridge-test"}, {"version", "1"}}}}}});
    if (r.status != 200) return "";
    session_ = r.session_id;
    version_ = r.body["result"]["protocolVersion"];
    Send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
    return session_;
  }
  // tools/call; returns the JSON-RPC result (or the error message object).
  json Call(const std::string& tool, const json& args, int* status = nullptr) {
    HttpReply r = Send({{"jsonrpc", "2.0"},
                        {"id", next_id_++},
                        {"method", "tools/call"},
                        {"params", {{"name", tool}, {"arguments", args}}}});
    if (status) *status = r.status;
    if (!r.body.is_object()) return json();
    return r.body.contains("result") ? r.body["result"] : r.body;
  }
  void set_token(std::string t) { token_ = std::move(t); }
  void set_keep_alive(bool on) { client_.set_keep_alive(on); }
  void set_session(std::string s) { session_ = std::move(s); }
  const std::string& session() const { return session_; }
  int next_id() { return next_id_++; }

 private:
  httplib::Client client_;
  std::string session_, version_, token_;
  int next_id_ = 1;
};

}  // namespace onlineps::testing

#endif  // ONLINEPS_TESTS_BRIDGE_CLUSTER_H_
