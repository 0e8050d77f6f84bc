// The bridge's Streamable HTTP rules, through the real binary: status codes, JSON-RPC
// errors, sessions, security checks, the stateless revision and recording.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "mcp_bridge/tools.h"
#include "tests/bridge/bridge_cluster.h"
#include "worker/request_limits.h"

namespace onlineps::testing {
namespace {

class BridgeHttpTest : public BridgeFixture {};

json Request(int id, const std::string& method, json params = json::object()) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}};
}

TEST_F(BridgeHttpTest, InitializeMintsAnUnguessableSessionAndNegotiates) {
  const int port = Start();
  McpHttp c(port), d(port);
  const std::string sid = c.Initialize();
  EXPECT_TRUE(std::regex_match(sid, std::regex("[0-9a-f]{32}"))) << sid;  // 128 bits
  EXPECT_NE(d.Initialize(), sid);
  // Every supported revision is echoed; an unknown one gets the latest.
  for (const std::string v : {"2025-03-26", "2025-06-18", "2025-11-25", "1999-01-01"}) {
    McpHttp e(port);
    HttpReply r = e.Send(Request(1, "initialize",
                                 {{"protocolVersion", v},
                                  {"capabilities", json::object()},
                                  {"clientInfo", {{"name", "t"}, {"version", "1"}}}}));
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.body["result"]["protocolVersion"], v == "1999-01-01" ? "2025-11-25" : v);
    EXPECT_TRUE(r.body["result"]["capabilities"].contains("tools"));
  }
  McpHttp f(port);
  HttpReply bad = f.Send(Request(1, "initialize", json::object()));
  EXPECT_EQ(bad.body["error"]["code"], -32602);
  // A client cannot choose its session id (session fixation).
  McpHttp g(port);
  g.set_session("1");
  HttpReply fixed = g.Send(Request(1, "initialize", {{"protocolVersion", "2025-11-25"}}));
  ASSERT_EQ(fixed.status, 200);
  EXPECT_NE(fixed.session_id, "1");
  EXPECT_TRUE(std::regex_match(fixed.session_id, std::regex("[0-9a-f]{32}")));
}

TEST_F(BridgeHttpTest, StatusCodesFollowTheSpec) {
  const int port = Start({"--max-request-bytes", "65536"});
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  // Notifications and responses: 202, no body.
  HttpReply n = c.Send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  EXPECT_EQ(n.status, 202);
  EXPECT_TRUE(n.raw.empty());
  EXPECT_EQ(c.Send({{"jsonrpc", "2.0"}, {"id", 99}, {"result", json::object()}}).status, 202);
  // A request without a session id: 400; an unknown one: 404. A client's response too
  // (it was 202 whatever its session).
  McpHttp none(port);
  EXPECT_EQ(none.Send(Request(1, "tools/list")).status, 400);
  EXPECT_EQ(none.Send({{"jsonrpc", "2.0"}, {"id", 99}, {"result", json::object()}}).status, 400);
  McpHttp unknown(port);
  unknown.set_session("00000000000000000000000000000000");
  HttpReply u = unknown.Send(Request(1, "tools/list"));
  EXPECT_EQ(u.status, 404);
  EXPECT_EQ(u.body["error"]["code"], -32001);
  EXPECT_EQ(unknown.Send({{"jsonrpc", "2.0"}, {"id", 99}, {"result", json::object()}}).status, 404);
  // An unsupported MCP-Protocol-Version header: 400.
  auto h = c.Headers();
  h.erase("MCP-Protocol-Version");
  h.emplace("MCP-Protocol-Version", "2024-01-01");
  EXPECT_EQ(c.Post(Request(2, "tools/list").dump(), h).status, 400);
  // Accept without text/event-stream: 406. Content-Type not JSON: 415.
  h = c.Headers();
  h.erase("Accept");
  h.emplace("Accept", "application/json");
  EXPECT_EQ(c.Post(Request(3, "ping").dump(), h).status, 406);
  EXPECT_EQ(c.Post(Request(4, "ping").dump(), c.Headers(), "text/plain").status, 415);
  // Not JSON: 400 with -32700; a batch: -32600; no method: -32600.
  HttpReply p = c.Post("{not json", c.Headers());
  EXPECT_EQ(p.status, 400);
  EXPECT_EQ(p.body["error"]["code"], -32700);
  HttpReply b = c.Post("[" + Request(5, "ping").dump() + "]", c.Headers());
  EXPECT_EQ(b.status, 400);
  EXPECT_EQ(b.body["error"]["code"], -32600);
  EXPECT_EQ(c.Send({{"jsonrpc", "2.0"}, {"id", 6}}).body["error"]["code"], -32600);
  EXPECT_EQ(c.Send({{"jsonrpc", "2.0"}, {"id", nullptr}, {"method", "ping"}}).body["error"]["code"],
            -32600);
  // Unknown method: -32601; unknown tool: -32602; ping answers {}.
  EXPECT_EQ(c.Send(Request(7, "resources/list")).body["error"]["code"], -32601);
  EXPECT_EQ(c.Send(Request(8, "tools/call", {{"name", "nope"}})).body["error"]["code"], -32602);
  EXPECT_EQ(c.Send(Request(9, "ping")).body["result"], json::object());
  EXPECT_EQ(c.Send(Request(10, "logging/setLevel", {{"level", "loud"}})).body["error"]["code"],
            -32602);
  EXPECT_EQ(c.Send(Request(11, "logging/setLevel", {{"level", "info"}})).body["result"],
            json::object());
  // Too large: 413. GET: 405.
  EXPECT_EQ(c.Post(std::string(70000, ' '), c.Headers()).status, 413);
  httplib::Client raw("127.0.0.1", port);
  EXPECT_EQ(raw.Get("/mcp", c.Headers())->status, 405);
  // The session still serves after all of that; DELETE ends it, then 404.
  EXPECT_EQ(c.Send(Request(12, "ping")).status, 200);
  EXPECT_EQ(raw.Delete("/mcp", c.Headers())->status, 200);
  EXPECT_EQ(c.Send(Request(13, "ping")).status, 404);
  EXPECT_EQ(raw.Delete("/mcp", c.Headers())->status, 404);
}

// Revision 2025-03-26 says a receiver MUST take JSON-RPC batches; 2025-06-18 removed
// them. A batch was refused (400, -32600) whatever the session's revision.
TEST_F(BridgeHttpTest, BatchesAreServedOnA20250326SessionOnly) {
  const int port = Start();
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize("2025-03-26").empty());
  const json batch = {
      Request(1, "ping"),
      {{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}},
      Request(2, "tools/call", {{"name", "infer"}, {"arguments", {{"text", "a"}}}}),
      Request(3, "tools/call", {{"name", "set_context"}, {"arguments", {{"items", {"x"}}}}}),
      Request(4, "initialize", {{"protocolVersion", "2025-03-26"}}),
      Request(5, "no/such/method")};
  HttpReply r = c.Post(batch.dump(), c.Headers());
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_TRUE(r.body.is_array()) << r.raw;
  std::map<int, json> by_id;
  for (const json& a : r.body) by_id[a.value("id", 0)] = a;
  ASSERT_EQ(by_id.size(), 5u) << r.raw;  // the notification has no answer
  EXPECT_EQ(by_id[1]["result"], json::object());
  EXPECT_EQ(by_id[2]["result"]["isError"], false) << by_id[2].dump();
  EXPECT_EQ(by_id[3]["result"]["structuredContent"]["items"], json({"x"})) << by_id[3].dump();
  EXPECT_EQ(by_id[4]["error"]["code"], -32600);  // initialize MUST NOT be in a batch
  EXPECT_EQ(by_id[5]["error"]["code"], -32601);
  // Only notifications and responses: 202, no body. An empty batch: one error.
  const json quiet = {{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}},
                      {{"jsonrpc", "2.0"}, {"id", 99}, {"result", json::object()}}};
  HttpReply q = c.Post(quiet.dump(), c.Headers());
  EXPECT_EQ(q.status, 202);
  EXPECT_TRUE(q.raw.empty());
  HttpReply e = c.Post("[]", c.Headers());
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.body["error"]["code"], -32600);
  // 2025-06-18 and later: refused, naming the revision.
  McpHttp d(port);
  ASSERT_FALSE(d.Initialize("2025-06-18").empty());
  HttpReply refused = d.Post(json::array({Request(1, "ping")}).dump(), d.Headers());
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.body["error"]["code"], -32600);
  EXPECT_NE(refused.raw.find("2025-06-18"), std::string::npos) << refused.raw;
  EXPECT_EQ(c.Send(Request(6, "ping")).status, 200);  // both sessions go on
  EXPECT_EQ(d.Send(Request(2, "ping")).status, 200);
}

// Accept and Content-Type were matched as substrings: application/json-seq passed for
// application/json, a type the client weighted q=0 (refused) passed, application/* did
// not, and a Content-Type of application/jsonx was read as JSON.
TEST_F(BridgeHttpTest, AcceptAndContentTypeAreReadAsMediaTypes) {
  const int port = Start();
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  auto status = [&](const std::string& accept, const std::string& ctype = "application/json") {
    auto h = c.Headers();
    h.erase("Accept");
    h.emplace("Accept", accept);
    return c.Post(Request(c.next_id(), "ping").dump(), h, ctype).status;
  };
  EXPECT_EQ(status("application/json, text/event-stream"), 200);
  EXPECT_EQ(status("Application/JSON; q=0.5 , text/event-stream;q=1"), 200);
  EXPECT_EQ(status("*/*"), 200);
  EXPECT_EQ(status("application/*, text/*"), 200);
  EXPECT_EQ(status("application/json;q=0, text/event-stream"), 406);
  EXPECT_EQ(status("application/json, text/event-stream; q=0"), 406);
  EXPECT_EQ(status("application/json-seq, text/event-stream"), 406);
  EXPECT_EQ(status("application/json, text/event-stream-x"), 406);
  const std::string both = "application/json, text/event-stream";
  EXPECT_EQ(status(both, "application/json; charset=utf-8"), 200);
  EXPECT_EQ(status(both, "application/jsonx"), 415);
  EXPECT_EQ(status(both, "application/json-patch+json"), 415);
}

// DELETE ended the session whatever its MCP-Protocol-Version header said: an
// unsupported one must be a 400 (2025-06-18), and 2026-07-28, which ignores session ids
// and has no DELETE, ended a session of an earlier revision.
TEST_F(BridgeHttpTest, DeleteChecksTheProtocolVersionHeader) {
  const int port = Start();
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize("2025-06-18").empty());
  httplib::Client raw("127.0.0.1", port);
  auto with_version = [&](const std::string& v) {
    auto h = c.Headers();
    h.erase("MCP-Protocol-Version");
    h.emplace("MCP-Protocol-Version", v);
    return h;
  };
  auto unsupported = raw.Delete("/mcp", with_version("1999-01-01"));
  ASSERT_TRUE(unsupported);
  EXPECT_EQ(unsupported->status, 400);
  EXPECT_NE(unsupported->body.find("1999-01-01"), std::string::npos) << unsupported->body;
  EXPECT_EQ(c.Send(Request(1, "ping")).status, 200);  // not ended
  auto modern = raw.Delete("/mcp", with_version("2026-07-28"));
  ASSERT_TRUE(modern);
  EXPECT_EQ(modern->status, 405);
  EXPECT_EQ(c.Send(Request(2, "ping")).status, 200);  // not ended
  auto ok = raw.Delete("/mcp", with_version("2025-06-18"));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(c.Send(Request(3, "ping")).status, 404);
}

TEST_F(BridgeHttpTest, ForeignHostAndOriginAreRefused) {
  const int port = Start();
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  auto h = c.Headers();
  h.emplace("Origin", "http://evil.example.com");
  HttpReply o = c.Post(Request(1, "ping").dump(), h);
  EXPECT_EQ(o.status, 403);
  EXPECT_NE(o.raw.find("Origin"), std::string::npos);
  h = c.Headers();
  h.emplace("Origin", "http://localhost:6274");
  EXPECT_EQ(c.Post(Request(2, "ping").dump(), h).status, 200);
  h = c.Headers();
  h.emplace("Host", "evil.example.com");
  EXPECT_EQ(c.Post(Request(3, "ping").dump(), h).status, 403);
}

TEST_F(BridgeHttpTest, BearerTokensBindSessionsToTheirIdentity) {
  const std::string file = ::testing::TempDir() + "/bridge_tokens";
  {
    std::ofstream f(file);
    f << "# identity token\nalice alice-token-0123456789\nbob bob-token-0123456789ab\n";
  }
  const int port = Start({"--tokens-file", file});
  McpHttp anon(port);
  HttpReply r = anon.Send(Request(1, "initialize", {{"protocolVersion", "2025-11-25"}}));
  EXPECT_EQ(r.status, 401);
  anon.set_token("wrong-token-0123456789");
  EXPECT_EQ(anon.Send(Request(1, "initialize", {{"protocolVersion", "2025-11-25"}})).status, 401);
  McpHttp alice(port);
  alice.set_token("alice-token-0123456789");
  ASSERT_FALSE(alice.Initialize().empty());
  ASSERT_FALSE(alice.Call("set_context", {{"items", {"alice's secret"}}}).value("isError", true));
  // Bob presenting Alice's session id finds nothing.
  McpHttp bob(port);
  bob.set_token("bob-token-0123456789ab");
  bob.set_session(alice.session());
  EXPECT_EQ(
      bob.Send(Request(2, "tools/call", {{"name", "get_context"}, {"arguments", json::object()}}))
          .status,
      404);
  // Named sessions are per identity too: the same name is two contexts.
  ASSERT_FALSE(bob.Initialize().empty());
  alice.Call("set_context", {{"session", "shared-name"}, {"items", {"from alice"}}});
  json got = bob.Call("get_context", {{"session", "shared-name"}});
  EXPECT_FALSE(got["structuredContent"]["found"].get<bool>());
  // Nor can Bob change Alice's context, through her session id or the shared name.
  McpHttp intruder(port);
  intruder.set_token("bob-token-0123456789ab");
  intruder.set_session(alice.session());
  EXPECT_EQ(
      intruder
          .Send(Request(3, "tools/call",
                        {{"name", "set_context"}, {"arguments", {{"items", {"bob was here"}}}}}))
          .status,
      404);
  bob.Call("set_context", {{"session", "shared-name"}, {"items", {"from bob"}}});
  bob.Call("clear_context", {{"session", "shared-name"}});
  json mine = alice.Call("get_context", json::object());
  EXPECT_EQ(mine["structuredContent"]["items"], json::array({"alice's secret"})) << mine.dump();
  json named = alice.Call("get_context", {{"session", "shared-name"}});
  EXPECT_EQ(named["structuredContent"]["items"], json::array({"from alice"})) << named.dump();
}

TEST_F(BridgeHttpTest, PerSessionRateLimitIsAClearError) {
  McpHttp c(Start({"--rate-limit", "2", "--rate-burst", "3"}));
  ASSERT_FALSE(c.Initialize().empty());
  int limited = 0, ok = 0;
  std::string message;
  for (int i = 0; i < 8; ++i) {
    int status = 0;
    json r = c.Call("get_context", json::object(), &status);
    if (status == 429) {
      ++limited;
      message = r["error"]["message"];
    } else if (status == 200) {
      ++ok;
    }
  }
  EXPECT_GE(ok, 3);
  EXPECT_GE(limited, 1);
  EXPECT_NE(message.find("--rate-limit"), std::string::npos);
}

// A call that would stream (a learn with a progress token) but is refused before it
// runs gets the same status code as without the stream, not a 200 event stream holding
// the error: 429 past the rate limit, 400 for a request id still in flight.
TEST_F(BridgeHttpTest, AStreamingCallRefusedBeforeItRunsGetsItsStatusCode) {
  McpHttp c(Start({"--rate-limit", "1", "--rate-burst", "2", "--learn-chunk", "1"}));
  ASSERT_FALSE(c.Initialize().empty());
  const json learn = {{"name", "learn"},
                      {"arguments",
                       {{"examples",
                         {{{"text", "great fun"}, {"label", "positive"}},
                          {{"text", "dull mess"}, {"label", "negative"}}}}}},
                      {"_meta", {{"progressToken", "p"}}}};
  int streamed = 0, limited = 0;
  for (int id = 1; id <= 6; ++id) {
    HttpReply r = c.Send(Request(id, "tools/call", learn));
    if (r.status == 200) {
      EXPECT_FALSE(r.events.empty()) << "a served learn with a token streams its progress";
      ++streamed;
    } else {
      EXPECT_EQ(r.status, 429) << r.body.dump();
      EXPECT_TRUE(r.events.empty()) << "a refusal came as an event stream";
      EXPECT_NE(r.body.dump().find("--rate-limit"), std::string::npos) << r.body.dump();
      ++limited;
    }
  }
  EXPECT_GE(streamed, 1);
  EXPECT_GE(limited, 1);
}

TEST_F(BridgeHttpTest, InvalidArgumentsAreToolErrorsNamingTheProblem) {
  McpHttp c(Start());
  ASSERT_FALSE(c.Initialize().empty());
  struct Case {
    std::string tool;
    json args;
    std::string says;
  } cases[] = {
      {"infer", {{"txt", "x"}}, "unknown argument 'txt'"},
      {"infer", json::object(), "give 'text', 'features' or 'examples'"},
      {"infer", {{"text", 5}}, "text must be a string"},
      {"infer", {{"features", {1, "a"}}}, "features[1] is not a finite number"},
      {"learn", {{"text", "good"}}, "needs a 'label'"},
      {"learn", {{"examples", {{{"text", "good"}, {"label", "meh"}}}}}, "meh"},
      {"infer", {{"session", "bad name!"}, {"text", "x"}}, "session may hold only"},
      {"set_context", {{"items", {1}}}, "items[0] is not a string"},
      {"append_context", json::object(), "needs 'text'"},
  };
  for (const Case& k : cases) {
    json r = c.Call(k.tool, k.args);
    EXPECT_TRUE(r.value("isError", false)) << k.tool << " " << k.args.dump();
    const std::string text = r["content"][0]["text"];
    EXPECT_NE(text.find(k.says), std::string::npos) << text;
  }
  EXPECT_FALSE(c.Call("infer", {{"text", "still serving"}}).value("isError", true));
}

// With default flags on both sides, every infer the bridge accepts fits in one worker call
// (--max-examples <= the worker's --max-batch), and one more example is refused by the
// bridge with a message naming the flag.
TEST_F(BridgeHttpTest, LargestDefaultInferIsServedAndOneMoreIsRefused) {
  McpHttp c(Start());
  ASSERT_FALSE(c.Initialize().empty());
  const size_t limit = bridge::ToolsOptions{}.max_examples;
  json examples = json::array();
  for (size_t i = 0; i < limit; ++i) examples.push_back({{"text", "x " + std::to_string(i)}});
  json r = c.Call("infer", {{"examples", examples}});
  ASSERT_FALSE(r.value("isError", true)) << r.dump().substr(0, 400);
  EXPECT_EQ(r["structuredContent"]["predictions"].size(), limit);
  examples.push_back({{"text", "one too many"}});
  r = c.Call("infer", {{"examples", examples}});
  EXPECT_TRUE(r.value("isError", false));
  EXPECT_NE(r["content"][0]["text"].get<std::string>().find("--max-examples"), std::string::npos)
      << r.dump().substr(0, 400);
}

// The bridge's size limits default to the worker's (worker/request_limits.h) and are
// checked with the worker's messages: an infer at every text limit at once is served by
// a default worker; one byte or one word more is refused by the bridge, naming the flag.
TEST_F(BridgeHttpTest, InferAtTheTextLimitsIsServedAndOneMoreByteOrWordIsRefused) {
  const bridge::ToolsOptions tools;
  const worker::RequestLimits limits;
  EXPECT_LE(tools.max_examples, limits.max_batch);
  EXPECT_LE(tools.max_text_bytes, limits.max_text_bytes);
  EXPECT_LE(tools.max_tokens, limits.max_tokens);
  EXPECT_LE(tools.max_features, limits.max_features);
  McpHttp c(Start());
  ASSERT_FALSE(c.Initialize().empty());
  // 4 texts of 8,192 words (32,768 in all); the last one exactly max_text_bytes long.
  json examples = json::array();
  for (int i = 0; i < 4; ++i) {
    std::string t;
    for (int w = 0; w < 8192; ++w) t += (w ? " " : "") + std::string(1, static_cast<char>('a' + i));
    if (i == 3) t += std::string(tools.max_text_bytes - t.size(), 'z');  // a longer last word
    examples.push_back({{"text", t}});
  }
  ASSERT_EQ(examples[3]["text"].get<std::string>().size(), tools.max_text_bytes);
  json r = c.Call("infer", {{"examples", examples}});
  ASSERT_FALSE(r.value("isError", true)) << r.dump().substr(0, 400);
  EXPECT_EQ(r["structuredContent"]["predictions"].size(), 4u);

  auto refused = [&](json ex, const std::string& says) {
    json r = c.Call("infer", {{"examples", ex}});
    EXPECT_TRUE(r.value("isError", false)) << says;
    const std::string text = r["content"][0]["text"];
    EXPECT_NE(text.find(says), std::string::npos) << text.substr(0, 400);
  };
  json longer = examples;
  longer[3]["text"] = longer[3]["text"].get<std::string>() + "z";
  refused(longer, "examples[3].text is 65537 bytes; at most 65536 bytes (--max-text-bytes)");
  json more_words = examples;
  more_words[0]["text"] = more_words[0]["text"].get<std::string>() + " a";
  refused(more_words, "have 32769 words; at most 32768 per request (--max-tokens)");
  refused({{{"features", std::vector<float>(tools.max_features + 1, 0.5f)}}},
          "examples[0].features has 4097 values; at most 4096 per example (--max-features)");
  // A learn is checked per worker call (--learn-chunk examples), all before the first.
  json learn = json::array();
  for (int i = 0; i < 64; ++i) learn.push_back({{"text", "fine"}, {"label", "positive"}});
  for (int i = 0; i < 2; ++i) {  // 16,384 words, then 16,385
    learn.push_back({{"text", examples[i]["text"].get<std::string>() + " " +
                                  examples[i + 1]["text"].get<std::string>() + (i ? " x" : "")},
                     {"label", "negative"}});
  }
  r = c.Call("learn", {{"examples", learn}});
  EXPECT_TRUE(r.value("isError", false));
  const std::string text = r["content"][0]["text"];
  EXPECT_NE(text.find("examples 64..65 (--learn-chunk) have 32769 words"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("were learned"), std::string::npos) << text;
}

// A bridge whose context limits are raised above the worker's (the worker keeps 16
// items and 4096 features, by default): a context the worker would trim (items) or
// refuse (features) is a clear error naming both sides' limits, at set_context and at
// every call of the session, never a call run on the part the worker kept. Before, the
// infer ran on the newest 16 items as if it had all 20, and a context of 5000 features
// failed every call as UNAVAILABLE (with a probe of the worker each time), naming only
// the worker's limit.
TEST_F(BridgeHttpTest, ContextLimitsAboveTheWorkersAreAClearError) {
  const int port = Start({"--context-max-items", "32", "--context-max-features", "8192"});
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  ASSERT_FALSE(c.Call("infer", {{"text", "hello"}}).value("isError", true));  // placed
  json items = json::array();
  for (int i = 0; i < 20; ++i) items.push_back("item " + std::to_string(i));
  const json set = c.Call("set_context", {{"items", items}});
  EXPECT_TRUE(set.value("isError", false)) << set.dump();
  EXPECT_NE(set.dump().find("--context-max-items is 32"), std::string::npos) << set.dump();
  const json infer = c.Call("infer", {{"text", "hello"}});
  EXPECT_TRUE(infer.value("isError", false)) << "ran on a trimmed context: " << infer.dump();
  EXPECT_NE(infer.dump().find("kept 16 of the 20 items"), std::string::npos) << infer.dump();

  const json features = c.Call("set_context", {{"features", std::vector<double>(5000, 0.5)}});
  EXPECT_TRUE(features.value("isError", false)) << features.dump();
  const json refused = c.Call("infer", {{"text", "hello"}});
  EXPECT_TRUE(refused.value("isError", false)) << refused.dump();
  const std::string text = refused.dump();
  EXPECT_NE(text.find("INVALID_ARGUMENT"), std::string::npos) << text;
  EXPECT_NE(text.find("4096"), std::string::npos) << "the worker's limit: " << text;
  EXPECT_NE(text.find("--context-max-features 8192"), std::string::npos) << text;
  // A context that fits both is served again.
  ASSERT_FALSE(c.Call("set_context", {{"items", {"fits"}}}).value("isError", true));
  EXPECT_FALSE(c.Call("infer", {{"text", "hello"}}).value("isError", true));
}

TEST_F(BridgeHttpTest, LongLearnStreamsProgressOverSse) {
  McpHttp c(Start({"--learn-chunk", "8"}));
  ASSERT_FALSE(c.Initialize().empty());
  json examples = json::array();
  for (int i = 0; i < 40; ++i) {
    examples.push_back(
        {{"text", i % 2 ? "great fun" : "dull mess"}, {"label", i % 2 ? "positive" : "negative"}});
  }
  // A progress token is a string or any number (the spec's ProgressToken).
  int id = 5;
  for (const json& token : {json("tok"), json(2.5)}) {
    HttpReply r = c.Send(Request(id, "tools/call",
                                 {{"name", "learn"},
                                  {"arguments", {{"examples", examples}}},
                                  {"_meta", {{"progressToken", token}}}}));
    ASSERT_EQ(r.status, 200);
    ASSERT_EQ(r.events.size(), 6u) << token;  // 5 chunks of 8, then the result
    double last = 0;
    for (size_t i = 0; i + 1 < r.events.size(); ++i) {
      EXPECT_EQ(r.events[i]["method"], "notifications/progress");
      EXPECT_EQ(r.events[i]["params"]["progressToken"], token);
      EXPECT_GT(r.events[i]["params"]["progress"].get<double>(), last);
      last = r.events[i]["params"]["progress"];
    }
    EXPECT_EQ(last, 40.0);
    EXPECT_EQ(r.body["id"], id);
    EXPECT_EQ(r.body["result"]["structuredContent"]["examples"], 40);
    EXPECT_EQ(r.body["result"]["structuredContent"]["chunks"], 5);
    ++id;
  }
}

TEST_F(BridgeHttpTest, CancelledLearnStopsBetweenChunks) {
  const int port = Start({"--learn-chunk", "1", "--max-examples", "3000"});
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  json examples = json::array();
  for (int i = 0; i < 3000; ++i)
    examples.push_back({{"text", "slow " + std::to_string(i)}, {"label", "positive"}});
  HttpReply reply;
  std::thread call([&] {
    reply = c.Send(Request(77, "tools/call",
                           {{"name", "learn"},
                            {"arguments", {{"examples", examples}}},
                            {"_meta", {{"progressToken", 1}}}}));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  McpHttp other(port);
  other.set_session(c.session());
  EXPECT_EQ(other
                .Send({{"jsonrpc", "2.0"},
                       {"method", "notifications/cancelled"},
                       {"params", {{"requestId", 77}, {"reason", "test"}}}})
                .status,
            202);
  call.join();
  ASSERT_EQ(reply.status, 200);
  // Some progress, then the stream ends without a response: the spec says a cancelled
  // request gets none (it was a -32800 error, which the TypeScript SDK reports as a
  // response to an unknown id).
  ASSERT_GE(reply.events.size(), 1u) << reply.raw;
  for (const json& e : reply.events) {
    EXPECT_EQ(e.value("method", ""), "notifications/progress") << e.dump();
    EXPECT_FALSE(e.contains("id")) << e.dump();
  }
  EXPECT_LT(reply.events.back()["params"]["progress"].get<double>(), 3000);
  // The session serves its next call at once.
  EXPECT_FALSE(c.Call("infer", {{"text", "after"}}).value("isError", true));
}

// A cancelled call answered as plain JSON (no progressToken) got a -32800 error body, a
// response the spec says a cancelled request does not get; its POST is now answered with
// an empty event stream.
TEST_F(BridgeHttpTest, ACancelledCallWithoutProgressGetsNoResponse) {
  const int port = Start({"--learn-chunk", "1", "--max-examples", "3000"});
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  json examples = json::array();
  for (int i = 0; i < 3000; ++i)
    examples.push_back({{"text", "slow " + std::to_string(i)}, {"label", "positive"}});
  HttpReply reply;
  std::thread call([&] {
    reply = c.Send(
        Request(78, "tools/call", {{"name", "learn"}, {"arguments", {{"examples", examples}}}}));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  McpHttp other(port);
  other.set_session(c.session());
  EXPECT_EQ(other
                .Send({{"jsonrpc", "2.0"},
                       {"method", "notifications/cancelled"},
                       {"params", {{"requestId", 78}, {"reason", "test"}}}})
                .status,
            202);
  call.join();
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.content_type.rfind("text/event-stream", 0), 0u) << reply.content_type;
  EXPECT_TRUE(reply.raw.empty()) << reply.raw;
  EXPECT_FALSE(c.Call("infer", {{"text", "after"}}).value("isError", true));
}

// A call waiting its turn behind a running one when its session ends (DELETE) never
// runs: a queued set_context must not bring back the context the DELETE dropped, which
// would then be held, for a session no one can reach, until --context-ttl-s.
TEST_F(BridgeHttpTest, ACallQueuedInASessionThatEndsDoesNotRun) {
  int admin = 0;
  const int port =
      cluster_.StartBridge({worker_}, {"--learn-chunk", "1", "--max-examples", "3000"}, &admin);
  ASSERT_GT(admin, 0);
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  json examples = json::array();
  for (int i = 0; i < 3000; ++i)
    examples.push_back({{"text", "slow " + std::to_string(i)}, {"label", "positive"}});
  std::thread learn([&] {
    McpHttp l(port);
    l.set_session(c.session());
    l.Call("learn", {{"examples", examples}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread set([&] {
    McpHttp s(port);
    s.set_session(c.session());
    s.Call("set_context", {{"text", "queued"}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(c.Delete(), 200);
  learn.join();
  set.join();
  httplib::Client a("127.0.0.1", admin);
  std::string metrics;
  for (int i = 0; i < 30; ++i) {  // gauges are copied once a second
    metrics = a.Get("/metrics")->body;
    if (metrics.find("onlineps_bridge_mcp_sessions 0") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  metrics = a.Get("/metrics")->body;
  EXPECT_NE(metrics.find("onlineps_bridge_mcp_sessions 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("onlineps_bridge_contexts 0"), std::string::npos)
      << "the ended session's context came back: "
      << metrics.substr(metrics.find("\nonlineps_bridge_contexts "), 30);
}

json Modern(int id, const std::string& method, json params = json::object()) {
  params["_meta"] = {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
                     {"io.modelcontextprotocol/clientCapabilities", json::object()}};
  return Request(id, method, params);
}

httplib::Headers ModernHeaders(const std::string& method, const std::string& name = "") {
  httplib::Headers h = {{"Accept", "application/json, text/event-stream"},
                        {"MCP-Protocol-Version", "2026-07-28"},
                        {"Mcp-Method", method}};
  if (!name.empty()) h.emplace("Mcp-Name", name);
  return h;
}

// The 429 names the limit as the operator wrote it ("2", not "2.000000"), and says whose
// bucket ran dry: a stateful session's, or, for stateless calls (whose handles the client
// chooses), the one bucket of the client's identity.
TEST_F(BridgeHttpTest, RateLimitMessageNamesTheLimitAndTheBucket) {
  const int port = Start({"--rate-limit", "2", "--rate-burst", "1"});
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  std::string stateful;
  for (int i = 0; i < 5 && stateful.empty(); ++i) {
    int status = 0;
    json r = c.Call("get_context", json::object(), &status);
    if (status == 429) stateful = r["error"]["message"];
  }
  EXPECT_EQ(stateful,
            "rate limit: more than 2 calls/s on this session (--rate-limit 2, --rate-burst 1); "
            "slow down and retry");
  McpHttp m(port);
  std::string stateless;
  for (int i = 0; i < 5 && stateless.empty(); ++i) {
    json call =
        Modern(10 + i, "tools/call", {{"name", "model_info"}, {"arguments", json::object()}});
    HttpReply r = m.Post(call.dump(), ModernHeaders("tools/call", "model_info"));
    if (r.status == 429) stateless = r.body["error"]["message"];
  }
  EXPECT_EQ(stateless,
            "rate limit: more than 2 calls/s from this client, whose stateless calls share one "
            "bucket (--rate-limit 2, --rate-burst 1); slow down and retry");
}

TEST_F(BridgeHttpTest, StatelessRevisionRoutesOnTheSessionHeader) {
  const int port = Start();
  McpHttp c(port);
  HttpReply d = c.Post(Modern(1, "server/discover").dump(), ModernHeaders("server/discover"));
  ASSERT_EQ(d.status, 200) << d.raw;
  EXPECT_EQ(d.body["result"]["supportedVersions"][0], "2026-07-28");
  EXPECT_EQ(d.body["result"]["resultType"], "complete");
  EXPECT_TRUE(d.session_id.empty());
  // tools/list: the session property is marked for the Mcp-Param-Session header.
  HttpReply l = c.Post(Modern(2, "tools/list").dump(), ModernHeaders("tools/list"));
  ASSERT_EQ(l.status, 200);
  EXPECT_EQ(l.body["result"]["tools"][0]["inputSchema"]["properties"]["session"]["x-mcp-header"],
            "Session");
  // A call with a session: the header must match the argument.
  json call =
      Modern(3, "tools/call",
             {{"name", "set_context"}, {"arguments", {{"session", "s-42"}, {"items", {"x"}}}}});
  HttpReply missing = c.Post(call.dump(), ModernHeaders("tools/call", "set_context"));
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(missing.body["error"]["code"], -32020);
  auto h = ModernHeaders("tools/call", "set_context");
  h.emplace("Mcp-Param-Session", "s-42");
  HttpReply ok = c.Post(call.dump(), h);
  ASSERT_EQ(ok.status, 200) << ok.raw;
  EXPECT_EQ(ok.body["result"]["resultType"], "complete");
  json get =
      Modern(4, "tools/call", {{"name", "get_context"}, {"arguments", {{"session", "s-42"}}}});
  h = ModernHeaders("tools/call", "get_context");
  h.emplace("Mcp-Param-Session", "s-42");
  EXPECT_EQ(c.Post(get.dump(), h).body["result"]["structuredContent"]["items"], json({"x"}));
  // Mismatches and unknowns.
  EXPECT_EQ(c.Post(Modern(5, "tools/list").dump(), ModernHeaders("ping")).body["error"]["code"],
            -32020);
  HttpReply nf = c.Post(Modern(6, "nope/nothing").dump(), ModernHeaders("nope/nothing"));
  EXPECT_EQ(nf.status, 404);
  EXPECT_EQ(nf.body["error"]["code"], -32601);
  json old = Modern(7, "tools/list");
  old["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2030-01-01";
  auto vh = ModernHeaders("tools/list");
  vh.erase("MCP-Protocol-Version");
  vh.emplace("MCP-Protocol-Version", "2026-07-28");
  HttpReply v = c.Post(old.dump(), vh);
  EXPECT_EQ(v.status, 400);
  // 2026-07-28 ignores Mcp-Session-Id: a client that moved up from a legacy session and
  // still sends its id (here an ended one) is served statelessly, and no id is echoed.
  McpHttp legacy(port);
  const std::string sid = legacy.Initialize();
  ASSERT_FALSE(sid.empty());
  auto sh = ModernHeaders("tools/call", "get_context");
  sh.emplace("Mcp-Param-Session", "s-42");
  sh.emplace("Mcp-Session-Id", "ffffffffffffffffffffffffffffffff");
  HttpReply carried = c.Post(get.dump(), sh);
  ASSERT_EQ(carried.status, 200) << carried.raw;
  EXPECT_EQ(carried.body["result"]["structuredContent"]["items"], json({"x"})) << carried.raw;
  EXPECT_TRUE(carried.session_id.empty());
  sh.erase("Mcp-Session-Id");
  sh.emplace("Mcp-Session-Id", sid);
  EXPECT_EQ(c.Post(get.dump(), sh).status, 200);
}

TEST_F(BridgeHttpTest, RecordWritesEveryToolCall) {
  const std::string trace = ::testing::TempDir() + "/bridge_trace.jsonl";
  McpHttp c(Start({"--record", trace}));
  ASSERT_FALSE(c.Initialize().empty());
  c.Call("learn", {{"text", "lovely"}, {"label", "positive"}});
  c.Call("infer", {{"text", "lovely"}});
  c.Call("infer", {{"bad", 1}});
  std::ifstream in(trace);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["kind"], "header");
  EXPECT_EQ(lines[0]["format"], "onlineps-trace");
  EXPECT_EQ(lines[1]["tool"], "learn");
  EXPECT_EQ(lines[1]["seq"], 1);
  // The session id is a bearer secret: the trace names the session by a hash of it, the
  // same for all its calls, and the file is the bridge user's alone.
  const std::string recorded = lines[1]["session"];
  EXPECT_EQ(recorded.rfind("m:", 0), 0u) << recorded;
  EXPECT_EQ(recorded.find(c.session()), std::string::npos) << recorded;
  EXPECT_EQ(lines[2]["session"], recorded);
  struct stat st;
  ASSERT_EQ(::stat(trace.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(lines[1]["worker"], worker_);
  EXPECT_GE(lines[1]["version"].get<int64_t>(), 1);
  EXPECT_EQ(lines[1]["summary"], "applied");
  EXPECT_EQ(lines[2]["tool"], "infer");
  EXPECT_EQ(lines[2]["arguments"]["text"], "lovely");
  EXPECT_TRUE(lines[3]["is_error"].get<bool>());
  EXPECT_GT(lines[2]["latency_us"].get<int64_t>(), 0);
}

// --record never writes through a symbolic link planted at its path (it would overwrite
// whatever the link names): the bridge refuses to start, naming the path.
TEST_F(BridgeHttpTest, RecordRefusesASymbolicLink) {
  const std::string dir = ::testing::TempDir() + "/record_link_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string victim = dir + "/victim", link = dir + "/trace.jsonl";
  std::ofstream(victim) << "keep me\n";
  std::filesystem::remove(link);
  std::filesystem::create_symlink(victim, link);
  testing::Subprocess bridge({ONLINEPS_BIN_DIR "/onlineps_mcp_bridge", "--workers", worker_,
                              "--port", "0", "--admin-port", "-1", "--record", link},
                             /*with_stderr=*/true);
  const std::string out = bridge.ReadToEnd(std::chrono::milliseconds(20000));
  EXPECT_NE(bridge.Wait(std::chrono::milliseconds(20000)), 0) << out;
  EXPECT_NE(out.find("symbolic link"), std::string::npos) << out;
  std::ifstream in(victim);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "keep me");
  std::filesystem::remove_all(dir);
}

TEST_F(BridgeHttpTest, MetricsCountToolCallsAndReadinessFollowsWorkers) {
  int admin = 0;
  const int port = cluster_.StartBridge({worker_}, {}, &admin);
  ASSERT_GT(admin, 0);
  McpHttp c(port);
  ASSERT_FALSE(c.Initialize().empty());
  c.Call("infer", {{"text", "good"}});
  c.Call("infer", {{"text", "good"}});
  c.Call("infer", {{"nope", 1}});
  c.Call("learn", {{"text", "good"}, {"label", "positive"}});
  McpHttp stranger(port);  // a session the bridge never gave out: HTTP 404
  stranger.set_session("no-such-session");
  stranger.Call("infer", {{"text", "good"}});
  httplib::Client a("127.0.0.1", admin);
  std::string metrics;
  const std::string not_found = "onlineps_bridge_http_responses_total{code=\"404\"} 1";
  for (int i = 0; i < 30; ++i) {  // gauges and HTTP counts are copied once a second
    metrics = a.Get("/metrics")->body;
    if (metrics.find("onlineps_bridge_mcp_sessions 1") != std::string::npos &&
        metrics.find(not_found) != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(metrics.find(not_found), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("onlineps_bridge_http_responses_total{code=\"401\"} 0"),
            std::string::npos);
  EXPECT_EQ(metrics.find("onlineps_bridge_http_responses_total{code=\"200\"} 0"),
            std::string::npos);
  EXPECT_NE(metrics.find("onlineps_bridge_tool_calls_total{result=\"ok\",tool=\"infer\"} 2"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("onlineps_bridge_tool_calls_total{result=\"error\",tool=\"infer\"} 1"),
            std::string::npos);
  EXPECT_NE(metrics.find("onlineps_bridge_learn_staleness_count 1"), std::string::npos);
  EXPECT_NE(metrics.find("onlineps_bridge_workers{state=\"healthy\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("onlineps_bridge_mcp_sessions 1"), std::string::npos);
  EXPECT_EQ(a.Get("/readyz")->status, 200);
}

TEST_F(BridgeHttpTest, CallsOfOneSessionRunOneAtATime) {
  const std::string trace = ::testing::TempDir() + "/bridge_order.jsonl";
  const int port = Start({"--record", trace});
  McpHttp first(port);
  const std::string sid = first.Initialize();
  ASSERT_FALSE(sid.empty());
  // Six connections send into the same session at once: learns and infers (which wait
  // for their turn without a thread) and append_context (which blocks a thread).
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([port, sid, t] {
      McpHttp c(port);
      c.set_session(sid);
      for (int k = 0; k < 5; ++k) {
        json r;
        if (t % 3 == 0) {
          r = c.Call("learn", {{"examples",
                                {{{"text", "fun " + std::to_string(t)}, {"label", "positive"}},
                                 {{"text", "dull " + std::to_string(k)}, {"label", "negative"}}}}});
        } else if (t % 3 == 1) {
          r = c.Call("infer", {{"text", "fun " + std::to_string(k)}});
        } else {
          r = c.Call("append_context", {{"text", "note " + std::to_string(k)}});
        }
        EXPECT_EQ(r.value("isError", true), false) << r.dump();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::ifstream in(trace);
  std::vector<std::pair<int64_t, int64_t>> runs;  // [start, end] of each call's own work
  int64_t waited = 0;
  for (std::string line; std::getline(in, line);) {
    json r = json::parse(line);
    if (r["kind"] != "call") continue;
    const int64_t start =
        r["t_us"].get<int64_t>() - r["latency_us"].get<int64_t>() + r["wait_us"].get<int64_t>();
    runs.emplace_back(start, start + r["run_us"].get<int64_t>());
    waited += r["wait_us"].get<int64_t>();
  }
  ASSERT_EQ(runs.size(), 30u);
  std::sort(runs.begin(), runs.end());
  for (size_t i = 1; i < runs.size(); ++i) {
    // +2: each of the three durations is rounded down to a microsecond.
    EXPECT_GE(runs[i].first + 2, runs[i - 1].second)
        << "calls " << i - 1 << " and " << i << " overlap";
  }
  EXPECT_GT(waited, 0);  // some calls did arrive while another one ran
}

TEST_F(BridgeHttpTest, SigtermExitsCleanly) {
  McpHttp c(Start());
  ASSERT_FALSE(c.Initialize().empty());
  EXPECT_EQ(cluster_.StopBridge(), 0);
}

}  // namespace
}  // namespace onlineps::testing
