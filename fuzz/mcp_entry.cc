// The MCP bridge's request handling on one input, with the production tools and no
// worker (every worker call fails fast with kUnavailable; nothing touches the network).
// Byte 0 chooses:
//   bit 0     transport: 0 = one HTTP POST body, 1 = stdio lines (StdioTransport::Run)
//   bit 1     HTTP: serve the conformance fixtures too
//   bits 2-3  HTTP Mcp-Session-Id: none, a live session, an unknown id, a live session of
//             another identity
//   bits 4-5  HTTP MCP-Protocol-Version: none, 2026-07-28, 2025-11-25, an unknown one
//   bit 6     HTTP caller identity: none or "alice"
// Every reply must be one JSON-RPC response (a result or an error) that is not an
// internal error: an exception from a malformed message is a bug, not an answer.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_entries.h"
#include "mcp_bridge/backend.h"
#include "mcp_bridge/context_store.h"
#include "mcp_bridge/mcp_server.h"
#include "mcp_bridge/router.h"
#include "mcp_bridge/stdio_transport.h"
#include "mcp_bridge/tools.h"
#include "mcp_bridge/worker_pool.h"
#include "testing/mcp_fixtures/conformance_fixtures.h"

namespace onlineps::fuzz {
namespace {

using bridge::Reply;
using bridge::Request;
using nlohmann::json;

// What a bridge holds besides its McpServer. Built once: the tool schemas cost
// milliseconds under the sanitizers. Its state (contexts of sessions that
// set_context named) is bounded by a small store.
struct Backing {
  Backing()
      : router(bridge::RouterOptions{}),
        pool(bridge::WorkerPoolOptions{}, &router),
        contexts(ContextOptions()),
        backend(bridge::BackendOptions{}, &router, &pool, &contexts),
        tools(bridge::ToolsOptions{}, &backend, &contexts, &pool, &router) {}
  static bridge::ContextStoreOptions ContextOptions() {
    bridge::ContextStoreOptions o;
    o.max_sessions = 64;
    return o;
  }
  bridge::Router router;
  bridge::WorkerPool pool;  // no workers: every call fails fast with kUnavailable
  bridge::ContextStore contexts;
  bridge::Backend backend;
  bridge::Tools tools;
};

Backing* Shared() {
  static Backing* const b = new Backing();  // never destroyed: no exit-time order issues
  return b;
}

// A fresh McpServer per input, so that sessions of one input never reach the next.
struct Bridge {
  explicit Bridge(bool with_fixtures)
      : mcp(Options(), &Shared()->tools, nullptr,
            [](const std::string& key) { Shared()->backend.EndSession(key); }) {
    if (with_fixtures) fixtures = testing::ConformanceFixtures::Install(&mcp);
  }
  static bridge::McpServerOptions Options() {
    bridge::McpServerOptions o;
    o.max_sessions = 4;
    o.rate_limit = 1000;
    return o;
  }
  bridge::McpServer mcp;
  std::unique_ptr<testing::ConformanceFixtures> fixtures;  // destroyed before mcp
};

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// "" when `m` is a well-formed JSON-RPC response or notification that is no internal error.
std::string CheckMessage(const json& m) {
  if (!m.is_object()) return "a message that is not a JSON object: " + Dump(m);
  if (m.value("jsonrpc", json()) != "2.0") return "a message without jsonrpc 2.0: " + Dump(m);
  if (m.contains("method")) return m["method"].is_string() ? "" : "a non-string method";
  if (m.contains("result") == m.contains("error")) {
    return "a response needs exactly one of result and error: " + Dump(m);
  }
  if (m.contains("error")) {
    const json& e = m["error"];
    if (!e.is_object() || !e.contains("code") || !e["code"].is_number_integer() ||
        !e.contains("message") || !e["message"].is_string()) {
      return "a malformed error object: " + Dump(m);
    }
    if (e["code"] == bridge::kInternalError) return "an internal error: " + Dump(m);
  }
  return "";
}

std::string CheckReply(const Reply& r) {
  if (r.http_status < 200 || r.http_status > 599) {
    return "HTTP status " + std::to_string(r.http_status);
  }
  if (!r.has_body()) return r.http_status == 202 ? "" : "no body with a status other than 202";
  // A tool result may come serialized (Reply::body_text): checked as the document it is.
  const json body = r.Document();
  if (r.http_status >= 500 && r.http_status != 503) {
    return "HTTP " + std::to_string(r.http_status) + ": " + Dump(body);
  }
  return CheckMessage(body);
}

std::string Initialize(Bridge* b, const std::string& principal, std::string* session) {
  Request init;
  init.principal = principal;
  init.message = {
      {"jsonrpc", "2.0"},
      {"id", 0},
      {"method", "initialize"},
      {"params", {{"protocolVersion", "2025-11-25"}, {"capabilities", json::object()}}}};
  Reply r = b->mcp.Handle(init);
  *session = r.new_session_id;
  return session->empty() ? "initialize failed: " + Dump(r.body) : "";
}

// As HttpTransport::Post hands a body that passed the HTTP checks to the McpServer.
std::string Http(uint8_t flags, const std::string& body) {
  const bool with_fixtures = flags & 2;
  Bridge b(with_fixtures);
  static const char* kVersions[] = {"", bridge::kModernVersion, "2025-11-25", "1999-01-01"};
  Request r;
  r.principal = flags & 64 ? "alice" : "";
  r.header_version = kVersions[(flags >> 4) & 3];
  const int session_kind = (flags >> 2) & 3;
  if (session_kind == 1 || session_kind == 3) {
    std::string problem =
        Initialize(&b, session_kind == 3 ? "mallory" : r.principal, &r.session_id);
    if (!problem.empty()) return problem;
  } else if (session_kind == 2) {
    r.session_id = "00000000000000000000000000000000";
  }
  // The transport answers these itself (400): too deep to parse safely, or not JSON.
  if (bridge::NestsDeeperThan(body, bridge::kMaxJsonDepth)) return "";
  json m = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded()) return "";
  const bool is_init = m.is_object() && m.value("method", json()) == "initialize";
  r.stateless = !is_init && r.session_id.empty() && r.header_version == bridge::kModernVersion;
  std::vector<json> sent;
  const bool stream =
      b.mcp.WantsStream(m) && (r.stateless || b.mcp.HasSession(r.session_id, r.principal));
  // A fixture that asks the client something would wait 30 s for an answer: give fixtures
  // no stream (they then fail at once with kUnavailable).
  if (stream && !with_fixtures) r.notify = [&sent](const json& n) { sent.push_back(n); };
  r.message = std::move(m);
  Reply reply = b.mcp.Handle(r);
  for (const json& n : sent) {
    if (std::string p = CheckMessage(n); !p.empty()) return "notification: " + p;
  }
  (void)reply.Text();
  return CheckReply(reply);
}

// StdioTransport::Run on the input as stdin; every line it writes must be a message.
std::string Stdio(const std::string& in) {
  Bridge b(/*with_fixtures=*/false);
  std::string input = in;
  if (input.empty()) input = "\n";  // fmemopen refuses a zero-size buffer
  std::FILE* fin = fmemopen(input.data(), input.size(), "r");
  char* out_buf = nullptr;
  size_t out_size = 0;
  std::FILE* fout = open_memstream(&out_buf, &out_size);
  if (!fin || !fout) {
    if (fin) std::fclose(fin);
    if (fout) std::fclose(fout);
    std::free(out_buf);
    return "";  // no memory streams: nothing to test
  }
  {
    bridge::StdioTransport t(bridge::StdioTransportOptions{}, &b.mcp, fin, fout);
    t.Run();
  }
  std::fclose(fin);
  std::fclose(fout);
  std::string out(out_buf, out_size);
  std::free(out_buf);
  std::istringstream lines(out);
  std::string problem;
  for (std::string line; problem.empty() && std::getline(lines, line);) {
    json m = json::parse(line, nullptr, /*allow_exceptions=*/false);
    problem = m.is_discarded() ? "stdout line is not JSON: " + line : CheckMessage(m);
  }
  return problem;
}

}  // namespace

std::string McpOne(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  return data[0] & 1 ? Stdio(rest) : Http(data[0], rest);
}

}  // namespace onlineps::fuzz
