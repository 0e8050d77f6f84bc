// Replays every input under fuzz/regressions/<target>/ (the crashes libFuzzer found,
// minimized) through the fuzz targets' entry points (fuzz/fuzz_entries.h) in the normal
// build: each must be handled without a crash and answered with a clean error. The
// sanitized replay of the same files is the first step of scripts/fuzz.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/json_depth.h"
#include "common/wire.h"
#include "fuzz/fuzz_entries.h"
#include "mcp_bridge/mcp_server.h"
#include "nlohmann/json.hpp"
#include "worker/worker_rpc.h"

namespace onlineps::fuzz {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The inputs of one target, in name order (README files are notes, not inputs).
std::vector<fs::path> Inputs(const std::string& target) {
  std::vector<fs::path> out;
  const fs::path dir = fs::path(ONLINEPS_FUZZ_REGRESSIONS) / target;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() != ".md") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void ReplayAll(const std::string& target, std::string (*entry)(const uint8_t* data, size_t size)) {
  for (const fs::path& p : Inputs(target)) {
    SCOPED_TRACE(p.string());
    const std::string bytes = ReadAll(p);
    EXPECT_EQ(entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "");
  }
}

TEST(FuzzRegressionTest, WireInputsAreRefusedCleanly) { ReplayAll("wire_fuzz", WireOne); }
TEST(FuzzRegressionTest, McpInputsGetJsonRpcAnswers) { ReplayAll("mcp_fuzz", McpOne); }
TEST(FuzzRegressionTest, TraceInputsAreReadOrRefused) { ReplayAll("trace_fuzz", TraceOne); }

// wire_fuzz: a map32 header declaring 2^31 entries made msgpack allocate 128 GiB before
// reading any of them. A count above the frame's size is refused before allocating.
TEST(FuzzRegressionTest, HeaderWithHugeMapCountIsMalformed) {
  const std::string frame("\xdf\x81\x14\x00\xff\xff\x40", 7);
  StatusOr<Header> h = DecodeHeader(frame.data(), frame.size());
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kMalformed);
}

// mcp_fuzz / trace_fuzz: nlohmann::json copies and prints recursively, so ~100k levels
// of '[' overflowed the stack of the bridge's request thread and of the trace reader.
TEST(FuzzRegressionTest, NestingDepthIsMeasuredOutsideStrings) {
  EXPECT_FALSE(bridge::NestsDeeperThan(R"({"a":[[1]],"b":"[[[[[[\"[["})", 3));
  EXPECT_TRUE(bridge::NestsDeeperThan("[[[[", 3));
  EXPECT_FALSE(bridge::NestsDeeperThan("[[[]][[]]]", 3));
  EXPECT_TRUE(bridge::NestsDeeperThan(std::string(1000000, '['), bridge::kMaxJsonDepth));
}

TEST(FuzzRegressionTest, SeedCorporaAreHandledCleanly) {
  const fs::path corpus = fs::path(ONLINEPS_FUZZ_REGRESSIONS).parent_path() / "corpus";
  const std::pair<const char*, std::string (*)(const uint8_t*, size_t)> targets[] = {
      {"wire_fuzz", WireOne}, {"mcp_fuzz", McpOne}, {"trace_fuzz", TraceOne}};
  for (const auto& [target, entry] : targets) {
    for (const auto& e : fs::directory_iterator(corpus / target)) {
      SCOPED_TRACE(e.path().string());
      const std::string bytes = ReadAll(e.path());
      EXPECT_EQ(entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "");
    }
  }
}

// The worker RPC decodes msgpack bodies with a recursive parser: 100,000 nested
// one-element arrays (one byte a level) would overflow its stack. Refused first.
TEST(FuzzRegressionTest, WorkerBodyNestingIsRefusedBeforeParsing) {
  std::string deep =
      "\x81\xa8"
      "examples";  // {"examples": [[[...]]]}
  deep.append(100000, '\x91');
  deep.push_back('\x01');
  auto body = worker::DecodeBody(deep.data(), deep.size());
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(body.status().code(), StatusCode::kMalformed);
  EXPECT_NE(body.status().message().find("nests deeper than 64"), std::string::npos)
      << body.status().ToString();

  // Real bodies, of every msgpack type, pass and decode; depth is counted exactly.
  const nlohmann::json ok = {{"session", "s"},
                             {"examples", {{{"text", "a \"[[[\" film"}, {"label", 1}}}},
                             {"f", {1.5, -3, 70000, 5000000000LL, nullptr, true}},
                             {"b", nlohmann::json::binary({1, 2, 3})}};
  const std::vector<uint8_t> bytes = nlohmann::json::to_msgpack(ok);
  EXPECT_FALSE(MsgpackNestsDeeperThan(bytes.data(), bytes.size(), 3));
  EXPECT_TRUE(MsgpackNestsDeeperThan(bytes.data(), bytes.size(), 2));
  auto decoded = worker::DecodeBody(bytes.data(), bytes.size());
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, ok);
  for (size_t depth : {1, 63, 64, 65}) {
    std::string nest(depth, '\x91');
    nest.push_back('\x01');
    const auto* p = reinterpret_cast<const uint8_t*>(nest.data());
    EXPECT_EQ(MsgpackNestsDeeperThan(p, nest.size(), 64), depth > 64) << depth;
  }
}

}  // namespace
}  // namespace onlineps::fuzz
