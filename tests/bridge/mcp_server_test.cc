// McpServer's extension points (the tools, methods, capabilities and response handler a
// test binary registers) and the revision rule both transports call (ChooseRevision).
#include "mcp_bridge/mcp_server.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mcp_bridge/protocol.h"
#include "mcp_bridge/tool_call_adapter.h"

namespace onlineps::bridge {
namespace {

using nlohmann::json;

Reply Send(McpServer* server, const std::string& sid, const std::string& method,
           json params = json::object(), bool stateless = false) {
  Request req;
  req.message = {{"jsonrpc", "2.0"}, {"id", 1}, {"method", method}, {"params", params}};
  req.session_id = sid;
  req.stateless = stateless;
  return server->Handle(req);
}

json ModernMeta() {
  return {{kMetaProtocolVersion, kModernVersion}, {kMetaClientCapabilities, json::object()}};
}

TEST(McpServerTest, RegisteredToolsMethodsAndCapabilitiesAreServed) {
  McpServer server({}, nullptr, nullptr, nullptr);
  ToolDefinition echo;
  echo.declaration = {{"name", "echo"}, {"inputSchema", {{"type", "object"}}}};
  std::string seen_key;
  echo.handler = [&](const json& args, const CallContext& ctx) {
    seen_key = ctx.session_key;
    return Outcome::Ok({{"content", {{{"type", "text"}, {"text", args.dump()}}}}});
  };
  echo.streams = [](const json&) { return true; };
  server.RegisterTool(std::move(echo));
  server.RegisterMethod("things/list", Revisions::kStateful, [](const json&, const CallContext&) {
    return Outcome::Ok({{"things", json::array()}});
  });
  server.RegisterMethod("things/fail", Revisions::kBoth, [](const json&, const CallContext&) {
    return Outcome::Error(kInvalidParams, "no such thing", {{"why", 1}});
  });
  server.AddCapabilities({{"things", {{"subscribe", true}}}});

  const Reply init = Send(&server, "", "initialize", {{"protocolVersion", "2025-11-25"}});
  const std::string sid = init.new_session_id;
  ASSERT_FALSE(sid.empty()) << init.body.dump();
  EXPECT_TRUE(init.body["result"]["capabilities"].contains("things"));
  EXPECT_EQ(Send(&server, sid, "tools/list").body["result"]["tools"][0]["name"], "echo");
  const Reply call =
      Send(&server, sid, "tools/call", {{"name", "echo"}, {"arguments", {{"a", 1}}}});
  EXPECT_EQ(call.body["result"]["content"][0]["text"], "{\"a\":1}") << call.body.dump();
  EXPECT_EQ(seen_key, SessionTable::KeyOf("", sid));
  EXPECT_TRUE(server.WantsStream({{"method", "tools/call"}, {"params", {{"name", "echo"}}}}));
  EXPECT_EQ(Send(&server, sid, "things/list").body["result"]["things"], json::array());
  const Reply fail = Send(&server, sid, "things/fail");
  EXPECT_EQ(fail.body["error"]["code"], kInvalidParams);
  EXPECT_EQ(fail.body["error"]["data"]["why"], 1);

  // Stateless: a stateful-only method is not found (404); results carry resultType.
  json params = {{"_meta", ModernMeta()}};
  EXPECT_EQ(Send(&server, "", "things/list", params, true).http_status, 404);
  const Reply listed = Send(&server, "", "tools/list", params, true);
  EXPECT_EQ(listed.body["result"]["resultType"], "complete") << listed.body.dump();
  const Reply discover = Send(&server, "", "server/discover", params, true);
  EXPECT_TRUE(discover.body["result"]["capabilities"]["things"].is_object());
}

// Registers tool "later", whose calls wait in `pending` until the test answers them.
void RegisterLater(McpServer* server, std::vector<Respond>* pending) {
  ToolDefinition later;
  later.declaration = {{"name", "later"}, {"inputSchema", {{"type", "object"}}}};
  later.async_handler = [pending](const json&, const CallContext&, Respond respond) {
    pending->push_back(std::move(respond));
  };
  later.blocks = false;
  server->RegisterTool(std::move(later));
}

// A tool with an asynchronous handler holds no thread: HandleAsync returns before the
// tool answers, answers may come in any order from another thread, and each request gets
// its own reply once (Blocks says such a call may run on an I/O thread).
TEST(McpServerTest, AsyncToolsAnswerLaterFromAnotherThreadEachOnce) {
  McpServer server({}, nullptr, nullptr, nullptr);
  std::mutex mu;  // guards pending and args_seen
  std::vector<Respond> pending;
  std::vector<std::string> args_seen;
  ToolDefinition later;
  later.declaration = {{"name", "later"}, {"inputSchema", {{"type", "object"}}}};
  later.async_handler = [&](const json& args, const CallContext& ctx, Respond respond) {
    std::lock_guard<std::mutex> lock(mu);
    args_seen.push_back(args.dump());
    EXPECT_NE(ctx.cancelled, nullptr);
    pending.push_back(std::move(respond));
  };
  later.blocks = false;
  server.RegisterTool(std::move(later));
  ToolDefinition sync;
  sync.declaration = {{"name", "sync"}, {"inputSchema", {{"type", "object"}}}};
  sync.handler = [](const json&, const CallContext&) { return Outcome::Ok(json::object()); };
  server.RegisterTool(std::move(sync));

  const std::string sid =
      Send(&server, "", "initialize", {{"protocolVersion", "2025-11-25"}}).new_session_id;
  ASSERT_FALSE(sid.empty());
  auto call = [&](const std::string& tool, int id) {
    json m = {{"jsonrpc", "2.0"},
              {"id", id},
              {"method", "tools/call"},
              {"params", {{"name", tool}, {"arguments", {{"n", id}}}}}};
    return m;
  };
  EXPECT_FALSE(server.Blocks(call("later", 1)));
  EXPECT_TRUE(server.Blocks(call("sync", 1)));   // a handler without an async form may block
  EXPECT_FALSE(server.Blocks(call("nope", 1)));  // refused at once
  EXPECT_TRUE(server.Blocks({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "initialize"}}));
  EXPECT_FALSE(server.Blocks({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "tools/list"}}));

  std::vector<std::optional<Reply>> replies(3);
  std::vector<int> answers(3, 0);
  for (int i = 0; i < 3; ++i) {
    Request req;
    req.message = call("later", i);
    req.session_id = sid;
    server.HandleAsync(std::move(req), [&, i](Reply r) {
      replies[i] = std::move(r);
      ++answers[i];
    });
  }
  ASSERT_EQ(pending.size(), 3u);  // all three running at once, none answered yet
  EXPECT_EQ(args_seen[2], "{\"n\":2}");
  for (const auto& r : replies) EXPECT_FALSE(r.has_value());
  // Answered out of order, from another thread; an error outcome becomes a JSON-RPC error.
  std::thread([&] {
    pending[2](Outcome::Ok({{"content", json::array()}, {"v", 2}}));
    pending[0](Outcome::Error(kInvalidParams, "bad zero"));
    pending[1](Outcome::Ok({{"content", json::array()}, {"v", 1}}));
  }).join();
  EXPECT_EQ(answers, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(replies[2]->body["id"], 2);
  EXPECT_EQ(replies[2]->body["result"]["v"], 2);
  EXPECT_EQ(replies[1]->body["result"]["v"], 1);
  EXPECT_EQ(replies[0]->body["error"]["code"], kInvalidParams);
  EXPECT_EQ(replies[0]->body["error"]["message"], "bad zero");
  // The synchronous form waits for the same kind of answer.
  std::thread answer([&] {
    Respond fourth;
    for (int i = 0; i < 5000 && !fourth; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::lock_guard<std::mutex> lock(mu);
      if (pending.size() == 4) fourth = pending[3];
    }
    if (!fourth) return ADD_FAILURE() << "the synchronous call never reached the tool";
    fourth(Outcome::Ok({{"content", json::array()}, {"v", 3}}));
  });
  const Reply r =
      Send(&server, sid, "tools/call", {{"name", "later"}, {"arguments", json::object()}});
  answer.join();
  EXPECT_EQ(r.body["result"]["v"], 3) << r.body.dump();
}

// A request id reused while its first request is in flight is refused (the spec forbids
// reusing an id within a session), and the first request is still answered and still
// cancellable under that id: the refusal takes nothing of it.
TEST(McpServerTest, AnIdReusedWhileInFlightIsRefusedAndTheFirstKeepsIt) {
  McpServer server({}, nullptr, nullptr, nullptr);
  std::mutex mu;
  std::vector<Respond> pending;
  std::vector<const std::atomic<bool>*> flags;
  ToolDefinition later;
  later.declaration = {{"name", "later"}, {"inputSchema", {{"type", "object"}}}};
  later.async_handler = [&](const json&, const CallContext& ctx, Respond respond) {
    std::lock_guard<std::mutex> lock(mu);
    flags.push_back(ctx.cancelled);
    pending.push_back(std::move(respond));
  };
  later.blocks = false;
  server.RegisterTool(std::move(later));
  const std::string sid =
      Send(&server, "", "initialize", {{"protocolVersion", "2025-11-25"}}).new_session_id;
  ASSERT_FALSE(sid.empty());
  auto call = [&](int id, std::optional<Reply>* out) {
    Request req;
    req.message = {{"jsonrpc", "2.0"},
                   {"id", id},
                   {"method", "tools/call"},
                   {"params", {{"name", "later"}, {"arguments", json::object()}}}};
    req.session_id = sid;
    server.HandleAsync(std::move(req), [out](Reply r) { *out = std::move(r); });
  };
  std::optional<Reply> first, again, other;
  call(5, &first);
  call(5, &again);
  ASSERT_TRUE(again.has_value()) << "the reused id was not refused at once";
  EXPECT_EQ(again->body["error"]["code"], kInvalidRequest) << again->body.dump();
  EXPECT_EQ(again->http_status, 400);
  ASSERT_EQ(pending.size(), 1u) << "the reused id reached the tool";
  // Cancelling id 5 reaches the first request, which then gets no answer.
  Request cancel;
  cancel.message = {
      {"jsonrpc", "2.0"}, {"method", "notifications/cancelled"}, {"params", {{"requestId", 5}}}};
  cancel.session_id = sid;
  (void)server.Handle(cancel);
  ASSERT_NE(flags[0], nullptr);
  EXPECT_TRUE(flags[0]->load()) << "the cancel did not reach the first request";
  pending[0](Outcome::Ok({{"content", json::array()}}));
  ASSERT_TRUE(first.has_value());
  // Once it has ended, the id may be used again.
  call(5, &other);
  EXPECT_FALSE(other.has_value());
  EXPECT_EQ(pending.size(), 2u);
  pending[1](Outcome::Ok({{"content", json::array()}}));
  ASSERT_TRUE(other.has_value());
  EXPECT_TRUE(other->body.contains("result")) << other->body.dump();
}

// One client cannot take every session: past --max-sessions-per-client its own least
// recently used session (without a call in flight) ends for the new one; other clients'
// sessions stay. Clients are identities, or without auth addresses (loopback uncounted).
TEST(McpServerTest, AClientPastItsSessionShareEndsItsOwnOldestSession) {
  McpServerOptions o;
  o.max_sessions = 100;
  o.max_sessions_per_client = 3;
  McpServer server(o, nullptr, nullptr, nullptr);
  std::vector<Respond> pending;
  RegisterLater(&server, &pending);
  auto init = [&](const std::string& principal, const std::string& address) {
    Request req;
    req.message = {{"jsonrpc", "2.0"},
                   {"id", 1},
                   {"method", "initialize"},
                   {"params", {{"protocolVersion", "2025-11-25"}}}};
    req.principal = principal;
    req.client_address = address;
    return server.Handle(req);
  };
  auto ping = [&](const std::string& principal, const std::string& sid) {
    Request req;
    req.message = {{"jsonrpc", "2.0"}, {"id", 2}, {"method", "ping"}};
    req.principal = principal;
    req.session_id = sid;
    return server.Handle(req).http_status;
  };
  std::vector<std::string> alice;
  for (int i = 0; i < 3; ++i) alice.push_back(init("alice", "10.0.0.1").new_session_id);
  const std::string bob = init("bob", "10.0.0.1").new_session_id;
  ASSERT_EQ(ping("alice", alice[0]), 200);  // alice[1] is now the least recently used
  const Reply fourth = init("alice", "10.0.0.2");
  ASSERT_FALSE(fourth.new_session_id.empty()) << fourth.body.dump();
  EXPECT_EQ(ping("alice", alice[1]), 404) << "the least recently used session did not end";
  EXPECT_EQ(ping("alice", alice[0]), 200);
  EXPECT_EQ(ping("alice", alice[2]), 200);
  EXPECT_EQ(ping("alice", fourth.new_session_id), 200);
  EXPECT_EQ(ping("bob", bob), 200) << "another identity's session ended";

  // A session with a call in flight is never the one ended: with one on each, refused.
  for (const std::string& sid : {alice[0], alice[2], fourth.new_session_id}) {
    Request call;
    call.message = {{"jsonrpc", "2.0"},
                    {"id", 7},
                    {"method", "tools/call"},
                    {"params", {{"name", "later"}, {"arguments", json::object()}}}};
    call.principal = "alice";
    call.session_id = sid;
    server.HandleAsync(std::move(call), [](Reply) {});
  }
  ASSERT_EQ(pending.size(), 3u);
  const Reply refused = init("alice", "10.0.0.1");
  EXPECT_TRUE(refused.new_session_id.empty());
  EXPECT_EQ(refused.http_status, 503);
  EXPECT_NE(refused.body.dump().find("--max-sessions-per-client"), std::string::npos)
      << refused.body.dump();
  for (Respond& r : pending) r(Outcome::Ok({{"content", json::array()}}));

  // Without auth a client is its address; loopback (a local proxy for every client) is
  // not counted.
  std::vector<std::string> far;
  for (int i = 0; i < 4; ++i) far.push_back(init("", "192.0.2.7").new_session_id);
  EXPECT_EQ(ping("", far[0]), 404);
  EXPECT_EQ(ping("", far[3]), 200);
  std::vector<std::string> local;
  for (int i = 0; i < 5; ++i) local.push_back(init("", "127.0.0.1").new_session_id);
  for (const std::string& sid : local) EXPECT_EQ(ping("", sid), 200);
}

// A session with a call in flight is not idle: the idle sweep leaves it (and so its
// context) alone, and its next request after a call longer than --session-idle-s is
// served. Only a session idle that long after its last call ends.
TEST(McpServerTest, ASessionWithACallInFlightIsNotIdle) {
  McpServerOptions o;
  o.session_idle = std::chrono::milliseconds(50);
  std::vector<std::string> ended;
  McpServer server(o, nullptr, nullptr, [&](const std::string& key) { ended.push_back(key); });
  std::vector<Respond> pending;
  RegisterLater(&server, &pending);
  const std::string sid =
      Send(&server, "", "initialize", {{"protocolVersion", "2025-11-25"}}).new_session_id;
  ASSERT_FALSE(sid.empty());
  std::optional<Reply> answer;
  Request call;
  call.message = {{"jsonrpc", "2.0"},
                  {"id", 7},
                  {"method", "tools/call"},
                  {"params", {{"name", "later"}, {"arguments", json::object()}}}};
  call.session_id = sid;
  server.HandleAsync(std::move(call), [&](Reply r) { answer = std::move(r); });
  ASSERT_EQ(pending.size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  EXPECT_EQ(server.ExpireIdle(), 0u) << "a session with a call in flight expired";
  EXPECT_TRUE(ended.empty());
  EXPECT_EQ(Send(&server, sid, "ping").http_status, 200) << "404 during a call";
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  pending[0](Outcome::Ok({{"content", json::array()}}));
  ASSERT_TRUE(answer.has_value());
  EXPECT_TRUE(answer->body.contains("result")) << answer->body.dump();
  EXPECT_EQ(Send(&server, sid, "ping").http_status, 200) << "404 right after a long call";
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  EXPECT_EQ(server.ExpireIdle(), 1u);
  EXPECT_EQ(Send(&server, sid, "ping").http_status, 404);
}

// A tool result serialized once (Outcome::result_text) is the same answer as the document
// it replaces, byte for byte, whatever the result holds; stateless requests, which gain
// members, and errors keep the document.
TEST(McpServerTest, AToolResultSerializedOnceIsTheSameAnswerAsItsDocument) {
  const std::vector<json> results = {
      json::object(),
      {{"label", "pos"}, {"scores", {0.25, -1e-7, 3.5e300}}, {"version", {{"w", 7}}}},
      {{"text", "quote \" backslash \\ newline \n tab \t nul " + std::string(1, '\0') + " é 猫"}},
      {{"bad_utf8", std::string("a\xff\xfe"
                                "b")},
       {"nested", {{"a", {{"b", {1, 2, 3}}}}}}},
  };
  McpServer server({}, nullptr, nullptr, nullptr);
  size_t which = 0;
  bool error = false;
  ToolDefinition tool;
  tool.declaration = {{"name", "t"}, {"inputSchema", {{"type", "object"}}}};
  tool.async_handler = [&](const json&, const CallContext& ctx, Respond respond) {
    ToolResult r;
    r.structured = results[which];
    r.is_error = error;
    r.error = "it failed: \"x\"";
    respond(ToolOutcome(std::move(r), ctx.request->stateless));
  };
  tool.blocks = false;
  server.RegisterTool(std::move(tool));
  const std::string sid =
      Send(&server, "", "initialize", {{"protocolVersion", "2025-11-25"}}).new_session_id;
  ASSERT_FALSE(sid.empty());
  for (which = 0; which < results.size(); ++which) {
    for (bool is_error : {false, true}) {
      error = is_error;
      ToolResult r;
      r.structured = results[which];
      r.is_error = is_error;
      r.error = "it failed: \"x\"";
      const json expected_body = {
          {"jsonrpc", "2.0"}, {"id", 1}, {"result", CallToolResult(std::move(r))}};
      const std::string expected =
          expected_body.dump(-1, ' ', false, json::error_handler_t::replace);
      const Reply reply =
          Send(&server, sid, "tools/call", {{"name", "t"}, {"arguments", json::object()}});
      EXPECT_EQ(reply.body_text.empty(), is_error) << which;  // errors keep the document
      EXPECT_TRUE(reply.has_body());
      EXPECT_EQ(reply.Text(), expected) << which << " error " << is_error;
      EXPECT_EQ(reply.Document(), json::parse(expected)) << which;
    }
  }
  // Stateless: the result gains resultType and the server's _meta, so it stays a document.
  error = false;
  which = 1;
  json params = {{"name", "t"}, {"arguments", json::object()}, {"_meta", ModernMeta()}};
  const Reply stateless = Send(&server, "", "tools/call", params, /*stateless=*/true);
  EXPECT_TRUE(stateless.body_text.empty());
  ASSERT_TRUE(stateless.body.contains("result")) << stateless.body.dump();
  EXPECT_EQ(stateless.body["result"]["resultType"], "complete");
  EXPECT_EQ(stateless.body["result"]["structuredContent"], results[1]);
}

TEST(McpServerTest, ClientResponsesGoToTheResponseHandler) {
  McpServer server({}, nullptr, nullptr, nullptr);
  std::vector<std::string> sessions;
  server.SetResponseHandler(
      [&](const json& response, const std::string& sid) { sessions.push_back(sid); });
  Request req;
  req.message = {{"jsonrpc", "2.0"}, {"id", "q1"}, {"result", json::object()}};
  req.session_id = "s1";
  EXPECT_EQ(server.Handle(req).http_status, 202);
  EXPECT_EQ(sessions, std::vector<std::string>{"s1"});
}

TEST(McpServerTest, WithoutExtensionsThereAreNoFixtureMethods) {
  McpServer server({}, nullptr, nullptr, nullptr);
  const std::string sid =
      Send(&server, "", "initialize", {{"protocolVersion", "2025-11-25"}}).new_session_id;
  for (const char* m : {"resources/list", "prompts/list", "completion/complete"}) {
    EXPECT_EQ(Send(&server, sid, m).body["error"]["code"], kMethodNotFound) << m;
  }
  EXPECT_EQ(Send(&server, sid, "tools/call", {{"name", "test_simple_text"}}).body["error"]["code"],
            kInvalidParams);
}

TEST(ChooseRevisionTest, HttpAndStdioRules) {
  const json ping = {{"jsonrpc", "2.0"}, {"id", 3}, {"method", "ping"}};
  const json init = {{"jsonrpc", "2.0"}, {"id", 1}, {"method", "initialize"}};
  // stdio: ping before initialize is answered; another request is refused.
  RevisionChoice c = ChooseRevision(ping, "", "", TransportKind::kStdio);
  ASSERT_TRUE(c.refused());
  EXPECT_EQ(c.body["result"], json::object());
  json list = {{"jsonrpc", "2.0"}, {"id", 4}, {"method", "tools/list"}};
  c = ChooseRevision(list, "", "", TransportKind::kStdio);
  ASSERT_TRUE(c.refused());
  EXPECT_EQ(c.body["error"]["code"], kInvalidRequest);
  // stdio: 2026-07-28 named in _meta is stateless.
  list["params"] = {{"_meta", {{kMetaProtocolVersion, kModernVersion}}}};
  c = ChooseRevision(list, "", "", TransportKind::kStdio);
  EXPECT_FALSE(c.refused());
  EXPECT_TRUE(c.stateless);
  // HTTP: the header names the revision; _meta without it is a mismatch.
  c = ChooseRevision(list, "", "", TransportKind::kHttp);
  ASSERT_TRUE(c.refused());
  EXPECT_EQ(c.body["error"]["code"], kHeaderMismatch);
  c = ChooseRevision(list, "", kModernVersion, TransportKind::kHttp);
  EXPECT_TRUE(c.stateless && !c.refused());
  // 2026-07-28 ignores Mcp-Session-Id: a request that still carries one is stateless.
  c = ChooseRevision(list, "0123456789abcdef0123456789abcdef", kModernVersion,
                     TransportKind::kHttp);
  EXPECT_TRUE(c.stateless && !c.refused());
  c = ChooseRevision(list, "", "1999-01-01", TransportKind::kHttp);
  ASSERT_TRUE(c.refused());
  EXPECT_EQ(*c.http_status, 400);
  EXPECT_EQ(c.body["error"]["code"], kUnsupportedVersion);
  c = ChooseRevision(init, "", kModernVersion, TransportKind::kHttp);
  ASSERT_TRUE(c.refused());
  EXPECT_EQ(*c.http_status, 404);
  c = ChooseRevision(init, "", "", TransportKind::kHttp);
  EXPECT_FALSE(c.refused() || c.stateless);
}

}  // namespace
}  // namespace onlineps::bridge
