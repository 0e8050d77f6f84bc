// Writes the seed corpora fuzz/corpus/<target>/ with the real encoders (run by hand
// after a wire, MCP or trace format change: build-fuzz/make_seeds fuzz/corpus).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/wire.h"
#include "ps/table_spec.h"
#include "replay/trace.h"

namespace onlineps {
namespace {

using nlohmann::json;

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void WireSeeds(const std::string& dir) {
  Header h;
  Write(dir + "/ping", EncodeHeader(h));
  h.op = Op::kCreateTable;
  h.table = "emb";
  ps::TableSpec spec;
  spec.name = "emb";
  spec.kind = ps::TableKind::kSparse;
  spec.dim = 8;
  spec.optimizer = "adagrad";
  h.spec = ps::EncodeSpec(spec);
  Write(dir + "/create_table", EncodeHeader(h));
  h = Header();
  h.op = Op::kPushDense;
  h.request_id = 7;
  h.sender = 0x1234567890;
  h.seq = 42;
  h.table = "w";
  h.shape = {16};
  h.base_version = 9;
  h.flags = kFlagDelta;
  Write(dir + "/push_dense", EncodeHeader(h));
  h.op = Op::kPullSparse;
  h.flags = kFlagAveraged | kFlagNoBackup;
  h.shape = {3};
  Write(dir + "/pull_sparse", EncodeHeader(h));
  h.op = Op::kPushSparse;
  h.shape = {3, 24};
  Write(dir + "/push_sparse", EncodeHeader(h));
  Header reply = MakeReply(h, InvalidArgument("bad shape"));
  reply.version = 10;
  reply.tau = 1;
  reply.queued = true;
  Write(dir + "/reply_error", EncodeHeader(reply));
  reply = MakeReply(h, Status::Ok());
  reply.spec = {{"rows", "12"}, {"version", "3"}};
  Write(dir + "/reply_info", EncodeHeader(reply));
  h = Header();
  h.op = Op::kInfer;
  h.request_id = 3;
  Write(dir + "/infer", EncodeHeader(h));
}

// Byte 0 of an mcp_fuzz input: see fuzz/mcp_entry.cc.
void McpSeeds(const std::string& dir) {
  auto rpc = [](const json& id, const std::string& method, json params) {
    json m = {{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
    if (!id.is_null()) m["id"] = id;
    return m.dump();
  };
  const json modern_meta = {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
                            {"io.modelcontextprotocol/clientCapabilities", json::object()}};
  const std::string session = std::string(1, '\x04');  // HTTP, a live session
  Write(dir + "/http_initialize",
        std::string(1, '\x00') +
            rpc(1, "initialize", {{"protocolVersion", "2025-06-18"}, {"capabilities", {}}}));
  Write(dir + "/http_tools_list", session + rpc(2, "tools/list", json::object()));
  Write(dir + "/http_ping", session + rpc("p", "ping", json::object()));
  Write(dir + "/http_set_level", session + rpc(3, "logging/setLevel", {{"level", "info"}}));
  Write(dir + "/http_infer",
        session + rpc(4, "tools/call",
                      {{"name", "infer"},
                       {"arguments", {{"session", "s1"}, {"examples", {{{"text", "hello"}}}}}}}));
  Write(
      dir + "/http_learn_progress",
      session +
          rpc(5, "tools/call",
              {{"name", "learn"},
               {"_meta", {{"progressToken", "t"}}},
               {"arguments",
                {{"examples",
                  {{{"text", "a"}, {"label", "x"}}, {{"features", {1.0, 2.0}}, {"label", 1}}}}}}}));
  Write(dir + "/http_set_context",
        session +
            rpc(6, "tools/call",
                {{"name", "set_context"},
                 {"arguments", {{"session", "s1"}, {"items", {"a", "b"}}, {"features", {0.5}}}}}));
  Write(dir + "/http_get_context",
        session +
            rpc(7, "tools/call", {{"name", "get_context"}, {"arguments", {{"session", "s1"}}}}));
  Write(dir + "/http_model_info", session + rpc(8, "tools/call", {{"name", "model_info"}}));
  Write(dir + "/http_cancelled",
        session + rpc(nullptr, "notifications/cancelled", {{"requestId", 4}}));
  Write(dir + "/http_response",
        session + json({{"jsonrpc", "2.0"}, {"id", "onlineps-1"}, {"result", {}}}).dump());
  const std::string modern = std::string(1, '\x10');  // HTTP, no session, 2026-07-28
  Write(dir + "/http_discover", modern + rpc(9, "server/discover", {{"_meta", modern_meta}}));
  Write(dir + "/http_stateless_call",
        modern + rpc(10, "tools/call",
                     {{"name", "infer"},
                      {"_meta", modern_meta},
                      {"arguments", {{"session", "s2"}, {"text", "hi"}}}}));
  const std::string fixtures = std::string(1, '\x06');  // HTTP, fixtures, a live session
  Write(dir + "/http_fixture_tool",
        fixtures + rpc(11, "tools/call", {{"name", "test_simple_text"}}));
  Write(dir + "/http_fixture_prompt",
        fixtures + rpc(12, "prompts/get",
                       {{"name", "test_prompt_with_arguments"}, {"arguments", {{"arg1", "a"}}}}));
  Write(dir + "/http_fixture_resource",
        fixtures + rpc(13, "resources/read", {{"uri", "test://static-text"}}));
  Write(dir + "/http_fixture_complete",
        fixtures + rpc(14, "completion/complete",
                       {{"ref", {{"type", "ref/prompt"}, {"name", "test_prompt_with_arguments"}}},
                        {"argument", {{"name", "arg1"}, {"value", "a"}}}}));
  std::string lines =
      rpc(1, "initialize", {{"protocolVersion", "2025-11-25"}, {"capabilities", {}}}) + "\n" +
      rpc(nullptr, "notifications/initialized", json::object()) + "\n" +
      rpc(2, "tools/list", json::object()) + "\n" +
      rpc(3, "tools/call", {{"name", "infer"}, {"arguments", {{"text", "x"}}}}) + "\n" +
      rpc(4, "ping", json::object()) + "\n";
  Write(dir + "/stdio_session", std::string(1, '\x01') + lines);
  Write(dir + "/stdio_stateless", std::string(1, '\x01') +
                                      rpc(1, "server/discover", {{"_meta", modern_meta}}) + "\n" +
                                      rpc(2, "tools/list", {{"_meta", modern_meta}}) + "\n");
}

void TraceSeeds(const std::string& dir) {
  replay::TraceHeader h;
  h.run_id = "0123456789abcdef";
  h.source = "make_seeds";
  h.start_unix_us = 1700000000000000;
  h.dataset = {{"name", "toy"}, {"split_seed", 1}};
  h.model = {{"labels", {"a", "b"}}};
  h.optimizer = {{"name", "sgd"}, {"params", {{"lr", 0.1}}}};
  h.workers = {"w0", "w1"};
  h.seeds = {{"data", 3}};
  const std::string path = dir + "/trace";
  auto w = replay::TraceWriter::Create(path, h, /*overwrite=*/true);
  if (!w.ok()) return;
  replay::TraceRecord r;
  r.kind = replay::RecordKind::kCall;
  r.seq = 1;
  r.t_us = 10;
  r.session = "s";
  r.tool = "infer";
  r.arguments = {{"text", "hi"}};
  r.summary = "ok";
  r.latency_us = 100;
  r.wait_us = 1;
  r.run_us = 99;
  r.version = 4;
  (void)(*w)->Write(r);
  r = replay::TraceRecord();
  r.kind = replay::RecordKind::kLearn;
  r.seq = 2;
  r.t_us = 20;
  r.ref = {{"split", "train"}, {"offset", 0}, {"count", 8}};
  r.loss = 0.5;
  (void)(*w)->Write(r);
  r = replay::TraceRecord();
  r.kind = replay::RecordKind::kPush;
  r.seq = 3;
  r.t_us = 30;
  r.table = "emb";
  r.shard = 1;
  r.base_version = 3;
  r.applied_version = 5;
  r.tau = 2;
  r.nnz = 10;
  r.bytes = 400;
  (void)(*w)->Write(r);
  r.kind = replay::RecordKind::kPull;
  r.seq = 4;
  (void)(*w)->Write(r);
  (void)(*w)->Close();
}

}  // namespace
}  // namespace onlineps

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR (fuzz/corpus)\n");
    return 2;
  }
  const std::string root = argv[1];
  onlineps::WireSeeds(root + "/wire_fuzz");
  onlineps::McpSeeds(root + "/mcp_fuzz");
  onlineps::TraceSeeds(root + "/trace_fuzz");
  return 0;
}
