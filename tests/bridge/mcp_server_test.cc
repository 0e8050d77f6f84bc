// McpServer's extension points (the tools, methods, capabilities and response handler a
// test binary registers) and the revision rule both transports call (ChooseRevision).
#include "mcp_bridge/mcp_server.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mcp_bridge/protocol.h"

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
