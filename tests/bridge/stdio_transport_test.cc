// StdioTransport over real pipes: how lines are read (NUL bytes, over-long lines), and
// which requests wait for which (a cancelled request still queued is dropped; the tools
// the bridge answers alone never wait behind a call that reaches a worker).
#include "mcp_bridge/stdio_transport.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "mcp_bridge/protocol.h"

namespace onlineps::bridge {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// A bridge-like server: `slow` waits (ordered, as the tools that reach a worker) until
// released or cancelled; `local` answers at once and is declared unordered.
class StdioTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ToolDefinition slow;
    slow.declaration = {{"name", "slow"}, {"inputSchema", {{"type", "object"}}}};
    slow.handler = [this](const json& args, const CallContext& ctx) {
      ++slow_started_;
      const auto until = std::chrono::steady_clock::now() + milliseconds(5000);
      while (!release_ && !(ctx.cancelled && *ctx.cancelled) &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(milliseconds(2));
      }
      ++slow_ended_;
      return Outcome::Ok({{"content", {{{"type", "text"}, {"text", args.dump()}}}}});
    };
    server_.RegisterTool(std::move(slow));
    ToolDefinition local;
    local.declaration = {{"name", "local"}, {"inputSchema", {{"type", "object"}}}};
    local.handler = [](const json&, const CallContext&) {
      return Outcome::Ok({{"content", {{{"type", "text"}, {"text", "here"}}}}});
    };
    local.blocks = false;
    local.ordered = false;
    server_.RegisterTool(std::move(local));

    int in[2], out[2];
    ASSERT_EQ(pipe(in), 0);
    ASSERT_EQ(pipe(out), 0);
    in_write_ = in[1];
    out_read_ = out[0];
    in_ = fdopen(in[0], "r");
    out_ = fdopen(out[1], "w");
    transport_ = std::make_unique<StdioTransport>(StdioTransportOptions{}, &server_, in_, out_);
    runner_ = std::thread([this] { transport_->Run(); });
  }

  void TearDown() override {
    release_ = true;
    CloseInput();
    if (runner_.joinable()) runner_.join();
    std::fclose(in_);
    std::fclose(out_);
    close(out_read_);
  }

  void CloseInput() {
    if (in_write_ >= 0) close(in_write_);
    in_write_ = -1;
  }

  void Send(const std::string& bytes) {
    ASSERT_EQ(write(in_write_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }

  // The next message written to stdout, or null after `timeout` without one.
  json Next(milliseconds timeout = milliseconds(5000)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (const size_t nl = pending_.find('\n'); nl != std::string::npos) {
        json m = json::parse(pending_.substr(0, nl), nullptr, false);
        pending_.erase(0, nl + 1);
        return m;
      }
      const auto left =
          std::chrono::duration_cast<milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return nullptr;
      pollfd p{out_read_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(out_read_, buf, sizeof buf);
      if (n <= 0) return nullptr;
      pending_.append(buf, static_cast<size_t>(n));
    }
  }

  void Initialize() {
    Send(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":)"
         R"("2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}})"
         "\n");
    const json init = Next();
    ASSERT_TRUE(init.is_object() && init.contains("result")) << init.dump();
    Send(R"({"jsonrpc":"2.0","method":"notifications/initialized"})"
         "\n");
  }

  // Sends a stateless (2026-07-28) call of `slow` with `id` and waits until it runs.
  void StartStatelessSlowCall(int id) {
    Send(R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
         R"(,"method":"tools/call","params":{"name":"slow",)"
         R"("arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",)"
         R"("io.modelcontextprotocol/clientCapabilities":{}}}})"
         "\n");
    const auto until = std::chrono::steady_clock::now() + milliseconds(5000);
    while (slow_started_ == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(2));
    }
  }

  static std::string Call(int id, const std::string& tool) {
    return R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
           R"(,"method":"tools/call","params":{"name":")" + tool + R"(","arguments":{}}})" + "\n";
  }

  McpServer server_{{}, nullptr, nullptr, nullptr};
  std::unique_ptr<StdioTransport> transport_;
  std::thread runner_;
  std::FILE* in_ = nullptr;
  std::FILE* out_ = nullptr;
  int in_write_ = -1, out_read_ = -1;
  std::string pending_;
  std::atomic<bool> release_{false};
  std::atomic<int> slow_started_{0}, slow_ended_{0};
};

// A line with a NUL byte is one bad line: the request after it is still read and answered.
TEST_F(StdioTransportTest, ANulByteSpoilsOnlyItsOwnLine) {
  Initialize();
  Send(std::string(R"({"jsonrpc":"2.0","id":2,"method":"ping")") + '\0' + "}\n" +
       R"({"jsonrpc":"2.0","id":3,"method":"ping"})" + "\n" +
       R"({"jsonrpc":"2.0","id":4,"method":"ping"})" + "\n");
  const json bad = Next();
  ASSERT_TRUE(bad.is_object()) << "no answer to the line with a NUL";
  EXPECT_EQ(bad["error"]["code"], kParseError) << bad.dump();
  const json three = Next();
  const json four = Next();
  ASSERT_TRUE(three.is_object() && four.is_object());
  EXPECT_EQ(three["id"], 3) << three.dump();
  EXPECT_EQ(four["id"], 4) << four.dump();
}

// Before initialize a ping is answered, but only a valid one: a malformed request is
// refused as it would be after initialize, never answered with a result (a response
// whose id is null or an object, or that answers a message that is no JSON-RPC 2.0).
TEST_F(StdioTransportTest, AMalformedPingBeforeInitializeIsRefused) {
  for (const std::string bad :
       {R"({"jsonrpc":"2.0","id":null,"method":"ping"})",
        R"({"jsonrpc":"2.0","id":{"a":1},"method":"ping"})",
        R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})",
        R"({"jsonrpc":"1.0","id":2,"method":"ping"})", R"({"id":3,"method":"ping"})",
        R"({"jsonrpc":"2.0","id":4,"method":"ping","params":[1]})",
        R"({"jsonrpc":"2.0","id":[5],"method":"tools/list"})"}) {
    Send(bad + "\n");
    const json answer = Next();
    ASSERT_TRUE(answer.is_object()) << "no answer to " << bad;
    EXPECT_FALSE(answer.contains("result")) << bad << " -> " << answer.dump();
    EXPECT_TRUE(answer.contains("error")) << bad << " -> " << answer.dump();
    if (answer.contains("id")) {
      EXPECT_TRUE(answer["id"].is_string() || answer["id"].is_number_integer())
          << bad << " -> " << answer.dump();
    }
  }
  Send(R"({"jsonrpc":"2.0","id":6,"method":"ping"})"
       "\n");
  const json pong = Next();
  EXPECT_EQ(pong["id"], 6) << pong.dump();
  EXPECT_EQ(pong["result"], json::object()) << pong.dump();
}

// An over-long line is refused alone, naming the limit (it said only "the line limit");
// the next line is served.
TEST_F(StdioTransportTest, AnOverLongLineIsRefusedAndTheNextServed) {
  Initialize();
  std::thread writer([this] {
    Send(std::string((4 << 20) + 10, 'x') + "\n" + R"({"jsonrpc":"2.0","id":5,"method":"ping"})" +
         "\n");
  });
  const json refused = Next();
  const json ping = Next();
  writer.join();
  ASSERT_TRUE(refused.is_object() && ping.is_object());
  EXPECT_EQ(refused["error"]["code"], kInvalidRequest) << refused.dump();
  // The error names the limit, so that a client knows what to send instead.
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("longer than 4194304 bytes"),
            std::string::npos)
      << refused.dump();
  EXPECT_EQ(ping["id"], 5) << ping.dump();
}

// While an ordered call runs: a tool the bridge answers alone is answered at once, and a
// queued request that the client cancels is dropped without an answer or a run.
TEST_F(StdioTransportTest, CancelledQueuedRequestsAreDroppedAndLocalToolsDoNotWait) {
  Initialize();
  Send(Call(10, "slow"));
  const auto until = std::chrono::steady_clock::now() + milliseconds(5000);
  while (slow_started_ == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  ASSERT_EQ(slow_started_, 1);
  Send(Call(11, "slow") + Call(12, "local") +
       R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":11}})" + "\n");
  const json local = Next(milliseconds(2000));
  ASSERT_TRUE(local.is_object()) << "the local tool waited behind the slow call";
  EXPECT_EQ(local["id"], 12) << local.dump();
  release_ = true;
  const json first = Next();
  ASSERT_TRUE(first.is_object());
  EXPECT_EQ(first["id"], 10) << first.dump();
  EXPECT_TRUE(Next(milliseconds(300)).is_null()) << "the cancelled request was answered";
  CloseInput();
  runner_.join();
  EXPECT_EQ(slow_started_, 1) << "the cancelled request ran";
}

// Revision 2026-07-28 over stdio (no session) cancels by notifications/cancelled too:
// a running call is told to stop, and gets no answer.
TEST_F(StdioTransportTest, AStatelessCallInFlightIsCancelled) {
  StartStatelessSlowCall(20);
  ASSERT_EQ(slow_started_, 1);
  Send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":20}})"
       "\n");
  const auto stop_by = std::chrono::steady_clock::now() + milliseconds(2000);
  while (slow_ended_ == 0 && std::chrono::steady_clock::now() < stop_by) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  EXPECT_EQ(slow_ended_, 1) << "the cancelled call did not stop";
  Send(R"({"jsonrpc":"2.0","id":21,"method":"tools/list","params":{"_meta":{)"
       R"("io.modelcontextprotocol/protocolVersion":"2026-07-28",)"
       R"("io.modelcontextprotocol/clientCapabilities":{}}}})"
       "\n");
  const json next = Next();
  ASSERT_TRUE(next.is_object());
  EXPECT_NE(next["id"], 20) << "the cancelled request was answered: " << next.dump();
}

// initialize MUST NOT be cancelled: a notifications/cancelled naming one still queued
// (behind a running call) leaves it to be answered.
TEST_F(StdioTransportTest, AQueuedInitializeIsNotCancelled) {
  StartStatelessSlowCall(20);
  ASSERT_EQ(slow_started_, 1);
  Send(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":)"
       R"("2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}})"
       "\n"
       R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}})"
       "\n");
  std::this_thread::sleep_for(milliseconds(50));
  release_ = true;
  bool initialized = false;
  for (json m = Next(); m.is_object(); m = Next(milliseconds(1000))) {
    if (m.value("id", json()) == 1) initialized = m.contains("result");
  }
  EXPECT_TRUE(initialized) << "the queued initialize was dropped by a cancellation";
}

// Revision 2025-03-26 has JSON-RPC batches (a receiver MUST take them): a batch line is
// answered with one line holding the answers to its requests. It was refused.
TEST_F(StdioTransportTest, ABatchLineIsAnsweredWithOneArrayOnA20250326Session) {
  Send(R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":)"
       R"("2025-03-26","capabilities":{}}})"
       "\n");
  ASSERT_TRUE(Next().contains("result"));
  Send(R"([{"jsonrpc":"2.0","id":2,"method":"ping"},)"
       R"({"jsonrpc":"2.0","method":"notifications/initialized"},)"
       R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"local"}}])"
       "\n");
  const json answers = Next();
  ASSERT_TRUE(answers.is_array()) << answers.dump();
  ASSERT_EQ(answers.size(), 2u) << answers.dump();
  EXPECT_EQ(answers[0]["id"], 2);
  EXPECT_EQ(answers[0]["result"], json::object());
  EXPECT_EQ(answers[1]["id"], 3);
  EXPECT_EQ(answers[1]["result"]["content"][0]["text"], "here");
}

}  // namespace
}  // namespace onlineps::bridge
