// Trace reader / writer (replay/trace.h) against the format in docs/trace.md, including
// files written by the MCP bridge's own recorder.
#include "replay/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mcp_bridge/recorder.h"

namespace onlineps::replay {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A fresh path per test, removed with the directory at the end.
class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trace_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string WriteFile(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::binary) << text;
    return Path(name);
  }
  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Reads every record; fails the test on an error.
  static std::vector<TraceRecord> ReadAllRecords(TraceReader* r) {
    std::vector<TraceRecord> out;
    TraceRecord rec;
    for (;;) {
      auto more = r->Next(&rec);
      EXPECT_TRUE(more.ok()) << more.status().ToString();
      if (!more.ok() || !*more) return out;
      out.push_back(rec);
    }
  }
  // The status of the first failing Open or Next.
  static Status FirstError(const std::string& path) {
    auto r = TraceReader::Open(path);
    if (!r.ok()) return r.status();
    TraceRecord rec;
    for (;;) {
      auto more = (*r)->Next(&rec);
      if (!more.ok()) return more.status();
      if (!*more) return Status::Ok();
    }
  }

  fs::path dir_;
};

const char kHeaderLine[] =
    R"({"kind":"header","format":"onlineps-trace","format_version":1,"run_id":"00ff","source":"t","start_unix_us":5})";

// The example of docs/trace.md, verbatim.
const char kBridgeExample[] =
    R"jsonl({"clock":{"latency_us":"microseconds","t_us":"microseconds since start_unix_us (monotonic)"},"format":"onlineps-trace","format_version":1,"kind":"header","model":{"labels":["negative","positive"],"tables":[{"kind":"sparse","shape":[32],"table":"text/embed"},{"kind":"dense","shape":[2,32],"table":"text/out.weight"},{"kind":"dense","shape":[2],"table":"text/out.bias"}]},"run_id":"4191868dd8e6af73","source":"mcp_bridge","start_unix_us":1796279253537562,"workers":["tcp://127.0.0.1:7610"]}
{"arguments":{"text":"a great film"},"is_error":false,"kind":"call","latency_us":15249,"seq":1,"session":"m:75a28db0582fa2c23e7e6c61ece095fd","summary":"negative","t_us":1541672,"tau":-1,"tool":"infer","version":0,"worker":"tcp://127.0.0.1:7610"}
{"arguments":{"examples":[{"label":"positive","text":"great film"},{"label":"negative","text":"dull film"}]},"is_error":false,"kind":"call","latency_us":2241,"seq":2,"session":"m:75a28db0582fa2c23e7e6c61ece095fd","summary":"applied","t_us":1551638,"tau":0,"tool":"learn","version":1,"worker":"tcp://127.0.0.1:7610"}
)jsonl";

TraceHeader FullHeader() {
  TraceHeader h;
  h.run_id = NewRunId();
  h.source = "onlineps_replay";
  h.commit = "80e8896";
  h.start_unix_us = 1796279253537562;
  h.dataset = {{"name", "digits"},
               {"package", "python3-sklearn"},
               {"files", json::array({{{"path", "/x"}, {"sha256", "ab"}, {"bytes", 3}}})},
               {"split_seed", 7}};
  h.model = {{"labels", {"a", "b"}}};
  h.optimizer = {{"name", "sgd"}, {"params", {{"lr", 0.1}}}, {"staleness", "none"}};
  h.workers = {"w0", "w1"};
  h.seeds = {{"delay", 3}, {"order", 4}};
  h.extra = {{"clock", {{"t_us", "microseconds"}}}};
  return h;
}

// One record of every kind, each with the fields that kind uses.
std::vector<TraceRecord> OneOfEachKind() {
  std::vector<TraceRecord> v(5);
  v[0].kind = RecordKind::kCall, v[0].tool = "infer", v[0].session = "s:a";
  v[0].arguments = {{"text", "hello"}}, v[0].summary = "positive", v[0].is_error = true;
  v[0].version = 4, v[0].latency_us = 100, v[0].wait_us = 30, v[0].run_us = 70, v[0].worker = "w0";
  v[1].kind = RecordKind::kLearn, v[1].session = "s:b", v[1].loss = 0.25;
  v[1].arguments = {{"examples", {{{"text", "x"}, {"label", "a"}}}}};
  v[2].kind = RecordKind::kInfer, v[2].ref = {{"split", "test"}, {"offset", 96}, {"count", 32}};
  v[3].kind = RecordKind::kPull, v[3].table = "mlp/w", v[3].shard = 2, v[3].base_version = 9;
  v[3].bytes = 4096, v[3].worker = "w1";
  v[4].kind = RecordKind::kPush, v[4].table = "mlp/w", v[4].shard = 0, v[4].base_version = 9;
  v[4].applied_version = 12, v[4].tau = 2, v[4].nnz = 17, v[4].bytes = 68, v[4].loss = -1.5;
  for (size_t i = 0; i < v.size(); ++i) v[i].seq = i + 1, v[i].t_us = 1000 * (i + 1);
  return v;
}

TEST_F(TraceTest, HeaderAndEveryKindRoundTrip) {
  const TraceHeader h = FullHeader();
  const std::vector<TraceRecord> recs = OneOfEachKind();
  auto w = TraceWriter::Create(Path("t.jsonl"), h);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (const TraceRecord& r : recs) ASSERT_TRUE((*w)->Write(r).ok());
  ASSERT_TRUE((*w)->Close().ok());

  auto r = TraceReader::Open(Path("t.jsonl"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ToJson((*r)->header()), ToJson(h));
  EXPECT_EQ((*r)->header().run_id, h.run_id);
  EXPECT_EQ((*r)->header().seeds["order"], 4);
  EXPECT_EQ((*r)->header().extra["clock"]["t_us"], "microseconds");
  const std::vector<TraceRecord> got = ReadAllRecords(r->get());
  ASSERT_EQ(got.size(), recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(got[i].kind, recs[i].kind) << i;
    EXPECT_EQ(ToJson(got[i]), ToJson(recs[i])) << i;
  }
  EXPECT_EQ(got[0].latency_us, 100);
  EXPECT_TRUE(got[0].is_error);
  EXPECT_EQ(got[1].arguments["examples"][0]["label"], "a");
  EXPECT_DOUBLE_EQ(got[1].loss, 0.25);
  EXPECT_TRUE(std::isnan(got[2].loss));
  EXPECT_EQ(got[2].ref["offset"], 96);
  EXPECT_EQ(got[3].shard, 2);
  EXPECT_EQ(got[3].applied_version, -1);
  EXPECT_EQ(got[4].applied_version, 12);
  EXPECT_EQ(got[4].tau, 2);
  EXPECT_EQ(got[4].nnz, 17u);
  EXPECT_EQ((*r)->line(), 6u);
  EXPECT_FALSE((*r)->truncated_tail());
}

TEST_F(TraceTest, UnsetFieldsAreOmitted) {
  TraceRecord push;
  push.kind = RecordKind::kPush;
  push.seq = 3;
  EXPECT_EQ(ToJson(push), json::parse(R"({"kind":"push","seq":3,"t_us":0})"));
  TraceRecord call;  // calls always say whether they failed, as the bridge does
  EXPECT_EQ(ToJson(call), json::parse(R"({"kind":"call","seq":0,"t_us":0,"is_error":false})"));
}

TEST_F(TraceTest, ReadsTheBridgeExampleOfTheDocs) {
  auto r = TraceReader::Open(WriteFile("bridge.jsonl", kBridgeExample));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const TraceHeader& h = (*r)->header();
  EXPECT_EQ(h.source, "mcp_bridge");
  EXPECT_EQ(h.run_id, "4191868dd8e6af73");
  EXPECT_EQ(h.start_unix_us, 1796279253537562);
  EXPECT_EQ(h.workers, json::array({"tcp://127.0.0.1:7610"}));
  EXPECT_EQ(h.model["tables"][1]["shape"], json::array({2, 32}));
  EXPECT_EQ(h.extra["clock"]["latency_us"], "microseconds");
  const std::vector<TraceRecord> got = ReadAllRecords(r->get());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].tool, "infer");
  EXPECT_EQ(got[0].arguments["text"], "a great film");
  EXPECT_EQ(got[0].session, "m:75a28db0582fa2c23e7e6c61ece095fd");
  EXPECT_EQ(got[0].summary, "negative");
  EXPECT_EQ(got[0].t_us, 1541672);
  EXPECT_EQ(got[0].latency_us, 15249);
  EXPECT_EQ(got[0].wait_us, -1);  // this example predates wait_us / run_us
  EXPECT_EQ(got[0].version, 0);
  EXPECT_EQ(got[0].tau, -1);
  EXPECT_EQ(got[1].seq, 2u);
  EXPECT_EQ(got[1].tool, "learn");
  EXPECT_EQ(got[1].arguments["examples"].size(), 2u);
  EXPECT_EQ(got[1].tau, 0);
  EXPECT_EQ(got[1].worker, "tcp://127.0.0.1:7610");
  EXPECT_FALSE(got[1].is_error);
  EXPECT_TRUE(got[1].extra.is_null());
}

TEST_F(TraceTest, ReadsWhatTheBridgeRecorderWrites) {
  const json fields = {{"workers", {"tcp://127.0.0.1:1"}}, {"model", {{"labels", {"n", "p"}}}}};
  auto rec = bridge::Recorder::Open(Path("rec.jsonl"), 1 << 20, fields);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  bridge::TraceRecord a;
  a.session = "s:x", a.tool = "learn", a.worker = "w", a.summary = "applied";
  a.arguments = {{"examples", {{{"text", "t"}, {"label", "p"}}}}};
  a.version = 3, a.tau = 1, a.latency_us = 50, a.wait_us = 10, a.run_us = 40;
  (*rec)->Record(a);
  a.is_error = true, a.summary = "boom";
  (*rec)->Record(a);
  rec->reset();

  auto r = TraceReader::Open(Path("rec.jsonl"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->header().source, "mcp_bridge");
  EXPECT_EQ((*r)->header().run_id.size(), 16u);
  EXPECT_EQ((*r)->header().model["labels"][1], "p");
  EXPECT_TRUE((*r)->header().extra.contains("clock"));
  const std::vector<TraceRecord> got = ReadAllRecords(r->get());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, RecordKind::kCall);
  EXPECT_EQ(got[0].seq, 1u);
  EXPECT_EQ(got[0].arguments, a.arguments);
  EXPECT_EQ(got[0].session, "s:x");
  EXPECT_EQ(got[0].version, 3);
  EXPECT_EQ(got[0].tau, 1);
  EXPECT_EQ(got[0].wait_us, 10);
  EXPECT_EQ(got[0].run_us, 40);
  EXPECT_FALSE(got[0].is_error);
  EXPECT_TRUE(got[1].is_error);
  EXPECT_EQ(got[1].summary, "boom");
  EXPECT_GE(got[1].t_us, got[0].t_us);
}

TEST_F(TraceTest, MissingFileIsNotFoundNamingIt) {
  auto r = TraceReader::Open(Path("nope.jsonl"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(Path("nope.jsonl")), std::string::npos);
}

struct BadTrace {
  const char* name;
  std::string text;
  StatusCode code;
  int line;
  const char* mentions;  // a word the message must contain
};

TEST_F(TraceTest, ErrorsNameFileLineAndField) {
  const std::string h = std::string(kHeaderLine) + "\n";
  const std::string ok = R"({"kind":"call","seq":1,"t_us":2})"
                         "\n";
  const BadTrace cases[] = {
      {"empty", "", StatusCode::kInvalidArgument, 1, "empty"},
      {"header_not_json", "{nope\n" + ok, StatusCode::kInvalidArgument, 1, "JSON"},
      {"header_array", "[1]\n", StatusCode::kInvalidArgument, 1, "object"},
      {"wrong_format",
       R"({"kind":"header","format":"other-trace","format_version":1})"
       "\n",
       StatusCode::kInvalidArgument, 1, "other-trace"},
      {"no_format",
       R"({"kind":"header","format_version":1})"
       "\n",
       StatusCode::kInvalidArgument, 1, "format"},
      {"unknown_version",
       R"({"kind":"header","format":"onlineps-trace","format_version":2})"
       "\n",
       StatusCode::kInvalidArgument, 1, "format_version 2"},
      {"header_field_type",
       R"({"kind":"header","format":"onlineps-trace","format_version":1,"workers":"w"})"
       "\n",
       StatusCode::kInvalidArgument, 1, "workers"},
      {"middle_not_json", h + ok + "{\"kind\":\"call\",\n" + ok, StatusCode::kDataLoss, 3, "JSON"},
      {"middle_not_object", h + ok + ok + "42\n" + ok, StatusCode::kDataLoss, 4, "object"},
      {"unknown_kind",
       h + R"({"kind":"pop","seq":1,"t_us":2})"
           "\n",
       StatusCode::kInvalidArgument, 2, "pop"},
      {"missing_kind",
       h + R"({"seq":1,"t_us":2})"
           "\n",
       StatusCode::kInvalidArgument, 2, "kind"},
      {"string_seq",
       h + R"({"kind":"push","seq":"1","t_us":2})"
           "\n",
       StatusCode::kInvalidArgument, 2, "'seq'"},
      {"negative_seq",
       h + R"({"kind":"push","seq":-1,"t_us":2})"
           "\n",
       StatusCode::kInvalidArgument, 2, "'seq'"},
      {"float_tau",
       h + ok +
           R"({"kind":"push","seq":2,"t_us":2,"tau":1.5})"
           "\n",
       StatusCode::kInvalidArgument, 3, "'tau'"},
      {"bool_is_string",
       h + R"({"kind":"call","seq":1,"t_us":2,"is_error":"no"})"
           "\n",
       StatusCode::kInvalidArgument, 2, "'is_error'"},
      {"args_not_object",
       h + R"({"kind":"call","seq":1,"t_us":2,"arguments":[1]})"
           "\n",
       StatusCode::kInvalidArgument, 2, "'arguments'"},
  };
  for (const BadTrace& c : cases) {
    const std::string path = WriteFile(std::string(c.name) + ".jsonl", c.text);
    const Status s = FirstError(path);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s.ToString();
    const std::string where = path + ":" + std::to_string(c.line) + ":";
    EXPECT_NE(s.message().find(where), std::string::npos) << c.name << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.mentions), std::string::npos) << c.name << ": " << s.ToString();
  }
}

TEST_F(TraceTest, CutOffLastLineEndsTheTraceAndIsReported) {
  std::string text = std::string(kHeaderLine) + "\n";
  for (int i = 1; i <= 3; ++i) {
    text += R"({"kind":"push","seq":)" + std::to_string(i) +
            R"(,"t_us":10,"tau":0})"
            "\n";
  }
  text += R"({"kind":"push","seq":4,"t_us":1)";  // the writer died here
  auto r = TraceReader::Open(WriteFile("cut.jsonl", text));
  ASSERT_TRUE(r.ok());
  const std::vector<TraceRecord> got = ReadAllRecords(r->get());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].seq, 3u);
  EXPECT_EQ((*r)->line(), 4u);
  EXPECT_TRUE((*r)->truncated_tail());
  TraceRecord again;
  auto more = (*r)->Next(&again);  // stays at the end
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(*more);
}

// A line past the limit is refused, naming it, without reading it (or the rest of the
// file) into memory: a file with no newline (/dev/zero) cannot take all memory.
TEST_F(TraceTest, LinesLongerThanTheLimitAreRefusedNamingThem) {
  const std::string record = R"({"kind":"push","seq":1,"t_us":10,"tau":0})";
  const std::string text = std::string(kHeaderLine) + "\n" + record + "\n" +
                           R"({"kind":"push","seq":2,"t_us":10,"note":")" + std::string(5000, 'x') +
                           "\"}\n" + record + "\n";
  const std::string path = WriteFile("long.jsonl", text);
  auto r = TraceReader::Open(path, 1000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  TraceRecord rec;
  auto first = (*r)->Next(&rec);
  ASSERT_TRUE(first.ok() && *first);
  auto second = (*r)->Next(&rec);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(second.status().message().find(path + ":3"), std::string::npos)
      << second.status().ToString();
  EXPECT_NE(second.status().message().find("longer than 1000 bytes"), std::string::npos);
  // The header too.
  auto header = TraceReader::Open(path, 20);
  ASSERT_FALSE(header.ok());
  EXPECT_NE(header.status().message().find(":1: header longer than 20 bytes"), std::string::npos)
      << header.status().ToString();
  // The default limit reads it all.
  auto all = TraceReader::Open(path);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(ReadAllRecords(all->get()).size(), 3u);
}

TEST_F(TraceTest, CompleteLastLineWithoutNewlineAndBlankLinesAreRead) {
  const std::string text = std::string(kHeaderLine) + "\n\n" +
                           R"({"kind":"pull","seq":1,"t_us":1})"
                           "\n   \n" +
                           R"({"kind":"pull","seq":2,"t_us":2})";
  auto r = TraceReader::Open(WriteFile("t.jsonl", text));
  ASSERT_TRUE(r.ok());
  const std::vector<TraceRecord> got = ReadAllRecords(r->get());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ((*r)->line(), 5u);
  EXPECT_FALSE((*r)->truncated_tail());
}

TEST_F(TraceTest, WriterRefusesToOverwriteUnlessAsked) {
  const std::string path = WriteFile("old.jsonl", "precious\n");
  auto w = TraceWriter::Create(path, FullHeader());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(w.status().message().find(path), std::string::npos);
  EXPECT_EQ(ReadAll(path), "precious\n");

  auto w2 = TraceWriter::Create(path, FullHeader(), /*overwrite=*/true);
  ASSERT_TRUE(w2.ok()) << w2.status().ToString();
  ASSERT_TRUE((*w2)->Close().ok());
  EXPECT_TRUE(TraceReader::Open(path).ok());
  EXPECT_FALSE((*w2)->Write(TraceRecord()).ok());  // closed
}

TEST_F(TraceTest, UnknownFieldsSurviveARoundTrip) {
  const std::string text =
      R"({"kind":"header","format":"onlineps-trace","format_version":1,"run_id":"ab","source":"x","start_unix_us":1,"future":{"a":[1,2]},"note":"n"})"
      "\n"
      R"({"kind":"push","seq":1,"t_us":2,"tau":3,"grad_norm":0.5,"tags":["x"],"nested":{"k":null}})"
      "\n";
  auto r = TraceReader::Open(WriteFile("in.jsonl", text));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->header().extra, json::parse(R"({"future":{"a":[1,2]},"note":"n"})"));
  std::vector<TraceRecord> got = ReadAllRecords(r->get());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].extra, json::parse(R"({"grad_norm":0.5,"tags":["x"],"nested":{"k":null}})"));

  auto w = TraceWriter::Create(Path("out.jsonl"), (*r)->header());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write(got[0]).ok());
  ASSERT_TRUE((*w)->Close().ok());
  std::istringstream in(text), out(ReadAll(Path("out.jsonl")));
  for (std::string a, b; std::getline(in, a);) {
    ASSERT_TRUE(std::getline(out, b));
    EXPECT_EQ(json::parse(a), json::parse(b));
  }
}

TEST_F(TraceTest, KnownFieldsInExtraDoNotOverrideTheirMembers) {
  TraceRecord r;
  r.kind = RecordKind::kPush;
  r.tau = 5;
  r.extra = {{"tau", 99}, {"shard", 3}, {"mine", 1}};
  const json j = ToJson(r);
  EXPECT_EQ(j["tau"], 5);
  EXPECT_FALSE(j.contains("shard"));  // unset (-1) stays unset
  EXPECT_EQ(j["mine"], 1);
}

TEST_F(TraceTest, RecordKindNamesRoundTrip) {
  for (RecordKind k : {RecordKind::kCall, RecordKind::kLearn, RecordKind::kInfer, RecordKind::kPull,
                       RecordKind::kPush}) {
    auto parsed = ParseRecordKind(RecordKindName(k));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_STREQ(RecordKindName(RecordKind::kPull), "pull");
  auto bad = ParseRecordKind("header");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("header"), std::string::npos);
}

TEST_F(TraceTest, RunIdsAreSixteenHexDigitsAndDiffer) {
  const std::string a = NewRunId(), b = NewRunId();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

TEST_F(TraceTest, InvalidUtf8IsReplacedNotFatal) {
  auto w = TraceWriter::Create(Path("u.jsonl"), FullHeader());
  ASSERT_TRUE(w.ok());
  TraceRecord r;
  r.summary = "bad \xff byte";
  ASSERT_TRUE((*w)->Write(r).ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto rd = TraceReader::Open(Path("u.jsonl"));
  ASSERT_TRUE(rd.ok());
  const std::vector<TraceRecord> got = ReadAllRecords(rd->get());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].summary, "bad \xef\xbf\xbd byte");
}

}  // namespace
}  // namespace onlineps::replay
