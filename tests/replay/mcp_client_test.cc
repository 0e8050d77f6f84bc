// The shared MCP client (common/mcp_client.h) against a scripted Streamable HTTP server
// in this process (real HTTP on loopback): what it sends, how it reads JSON and SSE
// replies, and which Status each failure becomes.
#include "common/mcp_client.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace onlineps {
namespace {

using nlohmann::json;

// What the fake server saw of one request.
struct Seen {
  std::string method;  // HTTP method
  json body;
  std::string session, version, auth, accept;
};

// A Streamable HTTP endpoint at /mcp whose answers the test scripts with `answer`.
class FakeMcpServer {
 public:
  using Answer = std::function<void(const json& request, httplib::Response& res)>;
  explicit FakeMcpServer(Answer answer) : answer_(std::move(answer)) {
    server_.Post("/mcp", [this](const httplib::Request& req, httplib::Response& res) {
      const json body = json::parse(req.body, nullptr, false);
      Record("POST", req, body);
      answer_(body, res);
    });
    server_.Delete("/mcp", [this](const httplib::Request& req, httplib::Response& res) {
      Record("DELETE", req, json());
      res.status = 200;
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() is a no-op before the loop runs; connections queue in the backlog anyway.
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeMcpServer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  void Record(const std::string& method, const httplib::Request& req, const json& body) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back({method, body, req.get_header_value("Mcp-Session-Id"),
                     req.get_header_value("MCP-Protocol-Version"),
                     req.get_header_value("Authorization"), req.get_header_value("Accept")});
  }

  Answer answer_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Seen> seen_;  // guarded by mu_
};

json Result(const json& request, json result) {
  return {{"jsonrpc", "2.0"}, {"id", request["id"]}, {"result", std::move(result)}};
}

// Answers initialize with session "s-1" and revision 2025-06-18, notifications with 202,
// and tools/call with `call`.
FakeMcpServer::Answer Scripted(FakeMcpServer::Answer call) {
  return [call](const json& req, httplib::Response& res) {
    const std::string method = req.value("method", "");
    if (method == "initialize") {
      res.set_header("Mcp-Session-Id", "s-1");
      res.set_content(Result(req, {{"protocolVersion", "2025-06-18"}}).dump(), "application/json");
    } else if (!req.contains("id")) {
      res.status = 202;
    } else {
      call(req, res);
    }
  };
}

McpHttpClient Client(int port, int timeout_ms = 5000) {
  McpClientOptions o;
  o.timeout_ms = timeout_ms;
  o.token = "tok";
  o.client_name = "mcp-client-test";
  return McpHttpClient(LoopbackMcpUrl(port), o);
}

TEST(McpUrlTest, ParsesHttpUrlsAndRefusesOthers) {
  auto u = ParseMcpUrl("http://127.0.0.1:8080/x/mcp");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->scheme_host_port, "http://127.0.0.1:8080");
  EXPECT_EQ(u->path, "/x/mcp");
  EXPECT_EQ(ParseMcpUrl("http://localhost")->path, "/mcp");
  EXPECT_EQ(ParseMcpUrl("http://[::1]:9/")->scheme_host_port, "http://[::1]:9");
  EXPECT_EQ(ParseMcpUrl("https://a:1/mcp").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ParseMcpUrl("https://a:1/mcp").status().message().find("https"), std::string::npos);
  EXPECT_EQ(ParseMcpUrl("ftp://a/b").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoopbackMcpUrl(7).scheme_host_port, "http://127.0.0.1:7");
}

TEST(McpSseTest, SplitsEventsAndJoinsTheirDataLines) {
  const auto m = ParseSseMessages(
      ": comment\r\nevent: message\r\ndata: {\"a\":1}\r\n\r\n"
      "data:{\"b\":\ndata: 2}\n\nid: 3\n\ndata: not json\n\ndata: {\"c\":3}");
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0], json({{"a", 1}}));
  EXPECT_EQ(m[1], json({{"b", 2}}));
  EXPECT_TRUE(m[2].is_discarded());
  EXPECT_EQ(m[3], json({{"c", 3}}));  // the last event needs no blank line
  EXPECT_TRUE(ParseSseMessages("").empty());
}

TEST(McpHttpClientTest, InitializeThenCallsCarryTheSessionAndTheChosenRevision) {
  FakeMcpServer server(Scripted([](const json& req, httplib::Response& res) {
    res.set_content(
        Result(req, {{"content", json::array()}, {"structuredContent", {{"x", 1}}}}).dump(),
        "application/json");
  }));
  McpHttpClient c = Client(server.port());
  ASSERT_TRUE(c.Initialize().ok());
  EXPECT_EQ(c.session_id(), "s-1");
  EXPECT_EQ(c.protocol_version(), "2025-06-18");
  auto r = c.CallTool("infer", {{"text", "hi"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->is_error);
  EXPECT_EQ(r->result["structuredContent"]["x"], 1);
  c.Close();
  EXPECT_TRUE(c.session_id().empty());

  const std::vector<Seen> seen = server.seen();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].body["method"], "initialize");
  EXPECT_EQ(seen[0].body["params"]["protocolVersion"], kMcpProtocolVersion);
  EXPECT_EQ(seen[0].body["params"]["clientInfo"]["name"], "mcp-client-test");
  EXPECT_EQ(seen[0].session, "");
  EXPECT_EQ(seen[0].version, "");
  EXPECT_EQ(seen[0].accept, "application/json, text/event-stream");
  EXPECT_EQ(seen[1].body["method"], "notifications/initialized");
  EXPECT_FALSE(seen[1].body.contains("id"));
  EXPECT_EQ(seen[2].body["method"], "tools/call");
  EXPECT_EQ(seen[2].body["params"], json({{"name", "infer"}, {"arguments", {{"text", "hi"}}}}));
  EXPECT_NE(seen[2].body["id"], seen[0].body["id"]);
  EXPECT_EQ(seen[3].method, "DELETE");
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].session, "s-1") << i;
    EXPECT_EQ(seen[i].version, "2025-06-18") << i;
  }
  for (const Seen& s : seen) EXPECT_EQ(s.auth, "Bearer tok");
}

TEST(McpHttpClientTest, SseRepliesYieldTheResultAfterTheProgress) {
  FakeMcpServer server(Scripted([](const json& req, httplib::Response& res) {
    const json progress = {
        {"jsonrpc", "2.0"}, {"method", "notifications/progress"}, {"params", {{"progress", 1}}}};
    const json result = Result(req, {{"content", json::array()}, {"isError", true}});
    res.set_content("event: message\ndata: " + progress.dump() +
                        "\n\nevent: message\ndata: " + result.dump() + "\n\n",
                    "text/event-stream");
  }));
  McpHttpClient c = Client(server.port());
  ASSERT_TRUE(c.Initialize().ok());
  auto r = c.CallTool("learn", json::object());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->is_error);  // a tool error is a reply, not a failure
  // The raw layer keeps every message.
  McpHttpReply raw = c.SendToolCall("learn", json::object());
  EXPECT_EQ(raw.status, 200);
  ASSERT_EQ(raw.events.size(), 2u);
  EXPECT_EQ(raw.events[0]["method"], "notifications/progress");
  EXPECT_EQ(raw.body, raw.events[1]);
  EXPECT_EQ(raw.content_type, "text/event-stream");
}

TEST(McpHttpClientTest, FailuresBecomeStatuses) {
  // The tool's name says how the server answers: an HTTP status, or "rpc-error".
  FakeMcpServer server(Scripted([](const json& req, httplib::Response& res) {
    const std::string how = req["params"]["name"];
    if (how == "rpc-error") {
      const json e = {{"code", -32602}, {"message", "unknown tool"}};
      res.set_content(json({{"jsonrpc", "2.0"}, {"id", req["id"]}, {"error", e}}).dump(),
                      "application/json");
      return;
    }
    res.status = std::stoi(how);
    if (res.status == 200) res.set_content("plain words", "text/plain");
  }));
  McpHttpClient c = Client(server.port());
  ASSERT_TRUE(c.Initialize().ok());
  auto code = [&](const std::string& how) { return c.CallTool(how, {}).status().code(); };
  EXPECT_EQ(code("200"), StatusCode::kMalformed);  // not JSON-RPC
  EXPECT_EQ(code("404"), StatusCode::kNotFound);   // the session is gone
  EXPECT_EQ(code("429"), StatusCode::kUnavailable);
  EXPECT_EQ(code("503"), StatusCode::kUnavailable);
  EXPECT_EQ(code("403"), StatusCode::kFailedPrecondition);
  EXPECT_EQ(code("500"), StatusCode::kUnavailable);
  auto r = c.CallTool("rpc-error", json::object());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("unknown tool"), std::string::npos);
}

TEST(McpHttpClientTest, RefusedInitializeIsAFailedPrecondition) {
  FakeMcpServer server([](const json& req, httplib::Response& res) {
    if (req.value("method", "") == "initialize" && req["params"]["protocolVersion"] == "old") {
      res.set_content(
          json(
              {{"jsonrpc", "2.0"}, {"id", req["id"]}, {"error", {{"code", -1}, {"message", "no"}}}})
              .dump(),
          "application/json");
      return;
    }
    res.status = 401;
    res.set_content("who are you", "text/plain");
  });
  McpHttpClient c = Client(server.port());
  EXPECT_EQ(c.Initialize().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.Initialize("old").code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(c.session_id().empty());
}

TEST(McpHttpClientTest, NoServerIsUnavailableAndASilentOneADeadline) {
  int free_port = 0;
  {
    FakeMcpServer gone(Scripted([](const json&, httplib::Response&) {}));
    free_port = gone.port();
  }
  McpHttpClient none = Client(free_port);
  EXPECT_EQ(none.Initialize().code(), StatusCode::kUnavailable);
  // The message says what went wrong in words (httplib's own name for it is the bare
  // "Connection") and names the URL once.
  const std::string url = "http://127.0.0.1:" + std::to_string(free_port) + "/mcp";
  EXPECT_EQ(none.Initialize().message(),
            url + ": cannot connect (nothing listening there, or the host is unreachable)");
  EXPECT_EQ(none.Send(json::object()).status, 0);

  FakeMcpServer slow(Scripted([](const json& req, httplib::Response& res) {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    res.set_content(Result(req, json::object()).dump(), "application/json");
  }));
  McpHttpClient c = Client(slow.port(), /*timeout_ms=*/200);
  ASSERT_TRUE(c.Initialize().ok());
  EXPECT_EQ(c.CallTool("t", json::object()).status().code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace onlineps
