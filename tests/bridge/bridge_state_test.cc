// StateDir and the ContextStore and McpServer kept in it (--state-dir): what a restarted
// bridge loads, and what another local user can learn from the directory (nothing).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "mcp_bridge/context_store.h"
#include "mcp_bridge/mcp_server.h"
#include "mcp_bridge/state_dir.h"

namespace onlineps::bridge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string H(const std::string& key) { return StateDir::HashOf(key); }

std::string Hex(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : s) hex += {kHex[c >> 4], kHex[c & 15]};
  return hex;
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;  // a folder in a setgid one is setgid too: harmless
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// How files were named before hashing (state_dir.cc keeps its own copy to check them).
std::string LegacyName(const std::string& key) {
  std::string hex = Hex(key);
  if (hex.size() > 160) {
    uint64_t h = 1469598103934665603ULL;
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
    hex.resize(128);
    hex += '-';
    for (int i = 60; i >= 0; i -= 4) hex += "0123456789abcdef"[(h >> i) & 15];
  }
  return hex + ".json";
}

// Checks what another user could learn from the directory: folders 0700, files 0600, and
// no name or content showing a session id (nor its hex, as old names did). Returns how
// many files there are, so that a check of an empty directory cannot pass unnoticed.
size_t ExpectPrivate(const std::string& root, const std::vector<std::string>& ids) {
  EXPECT_EQ(ModeOf(root), 0700u) << root;
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    const std::string text = e.is_regular_file() ? Slurp(e.path()) : "";
    for (const std::string& id : ids) {
      for (const std::string& shown : {id, Hex(id)}) {
        EXPECT_EQ(name.find(shown), std::string::npos) << e.path();
        EXPECT_EQ(text.find(shown), std::string::npos) << e.path() << ": " << text;
      }
    }
    if (e.is_regular_file()) {
      EXPECT_EQ(text.find("\"key\""), std::string::npos) << e.path() << ": " << text;
      EXPECT_EQ(ModeOf(e.path()), 0600u) << e.path();
      ++files;
    } else {
      EXPECT_EQ(ModeOf(e.path()), 0700u) << e.path();
    }
  }
  return files;
}

class BridgeStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    old_umask_ = ::umask(022);  // the usual one: files would be 0644 unless asked otherwise
    std::string tmpl = ::testing::TempDir() + "/bridge_state.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  void TearDown() override {
    fs::remove_all(path_);
    ::umask(old_umask_);
  }
  std::unique_ptr<StateDir> Open() {
    auto d = StateDir::Open({path_, false}, {"contexts", "sessions"});
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(*d) : nullptr;
  }
  std::string File(const StateDir& dir, const std::string& kind, const std::string& key) {
    return dir.FileOf(kind, H(key));
  }
  std::unique_ptr<McpServer> Server(McpServerOptions o = {}) {
    return std::make_unique<McpServer>(o, nullptr, nullptr, nullptr);
  }
  static Reply Send(McpServer* server, const std::string& principal, const std::string& sid,
                    const std::string& method, json params = json::object()) {
    Request req;
    req.message = {{"jsonrpc", "2.0"}, {"id", 1}, {"method", method}, {"params", params}};
    req.principal = principal;
    req.session_id = sid;
    return server->Handle(req);
  }
  static std::string Initialize(McpServer* server, const std::string& principal) {
    return Send(server, principal, "", "initialize", {{"protocolVersion", "2025-06-18"}})
        .new_session_id;
  }
  std::unique_ptr<ContextStore> Store(ContextStoreOptions o = {}) {
    return std::make_unique<ContextStore>(o, [this] { return now_; });
  }
  static void Age(const std::string& file, int seconds) {
    struct timespec times[2];
    clock_gettime(CLOCK_REALTIME, &times[0]);
    times[0].tv_sec -= seconds;
    times[1] = times[0];
    ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  }
  std::string path_;
  int64_t now_ = 5000;
  mode_t old_umask_ = 0;
};

TEST_F(BridgeStateTest, RecordsAreNamedBySha256OfTheirKeys) {
  // FIPS 180-2 test vectors.
  EXPECT_EQ(H(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(H("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(H("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(H(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  auto dir = Open();
  const std::string long_key = "identity/s:" + std::string(300, 'x');
  const std::string near_key = "identity/s:" + std::string(299, 'x') + "y";
  for (const std::string& key : {std::string("alice/m:0a1b"), long_key, near_key}) {
    ASSERT_TRUE(dir->Put("contexts", H(key), {{"n", key.size()}}).ok());
    EXPECT_EQ(fs::path(File(*dir, "contexts", key)).filename(), H(key) + ".json");
  }
  EXPECT_FALSE(dir->Put("contexts", "alice/m:0a1b", {{"n", 1}}).ok());  // a key, not a hash
  std::map<std::string, size_t> got;
  for (const auto& r : dir->Load("contexts")) got[r.hash] = r.value["n"];
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(got[H(long_key)], long_key.size());
  EXPECT_EQ(got[H("alice/m:0a1b")], 12u);
  dir->Remove("contexts", H(long_key));
  EXPECT_EQ(dir->Load("contexts").size(), 2u);
  EXPECT_FALSE(dir->Touch("contexts", H(long_key)));
  EXPECT_TRUE(dir->Touch("contexts", H(near_key)));
}

TEST_F(BridgeStateTest, UnreadableFilesAreSetAsideAndTheRestLoads) {
  auto dir = Open();
  ASSERT_TRUE(dir->Put("contexts", H("good"), {{"items", {"a"}}}).ok());
  const std::string good = File(*dir, "contexts", "good");
  const std::string torn = File(*dir, "contexts", "torn");
  const std::string other = File(*dir, "contexts", "other");
  const std::string renamed = File(*dir, "contexts", "renamed");
  const std::string unnamed = path_ + "/contexts/" + Hex("alice/m:0a1b") + ".json";
  std::ofstream(torn) << "{\"items\": [";
  std::ofstream(other) << "[1, 2]";
  std::ofstream(renamed) << "{\"key\": \"good\"}";  // an old-format file not named by its key
  std::ofstream(unnamed) << "{\"items\": [";        // neither format: its name may hold an id
  // Torn, of the old format, with a hash's length: the hex of a session id.
  const std::string old_torn = path_ + "/contexts/" + Hex(std::string(32, 'a')) + ".json";
  std::ofstream(old_torn) << "{\"key\": \"aaaa";
  std::ofstream(good + ".tmp") << "half a write";
  dir.reset();  // a restart
  dir = Open();
  EXPECT_FALSE(fs::exists(good + ".tmp"));
  auto records = dir->Load("contexts");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].hash, H("good"));
  EXPECT_TRUE(fs::exists(other + ".bad"));
  EXPECT_TRUE(fs::exists(torn + ".bad"));
  // Set aside, these would keep a key: they go.
  EXPECT_FALSE(fs::exists(renamed) || fs::exists(renamed + ".bad"));
  EXPECT_FALSE(fs::exists(unnamed) || fs::exists(unnamed + ".bad"));
  EXPECT_FALSE(fs::exists(old_torn) || fs::exists(old_torn + ".bad"));
  EXPECT_TRUE(dir->Load("contexts").size() == 1u);  // set aside once, not again
}

TEST_F(BridgeStateTest, OpenNamesAPathItCannotUse) {
  const std::string file = path_ + "/plain-file";
  std::ofstream(file) << "x";
  auto d = StateDir::Open({file, false}, {"contexts"});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(file), std::string::npos) << d.status().ToString();
}

// One bridge per directory: a second Open of the same path is refused while the first
// holds it (two bridges would each rewrite the other's sessions), and allowed after.
TEST_F(BridgeStateTest, ASecondBridgeOnTheSameDirectoryIsRefused) {
  auto first = StateDir::Open({path_, false}, {"contexts"});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = StateDir::Open({path_, false}, {"contexts"});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("--state-dir " + path_), std::string::npos)
      << second.status().ToString();
  first->reset();
  EXPECT_TRUE(StateDir::Open({path_, false}, {"contexts"}).ok());
}

TEST_F(BridgeStateTest, ContextsSurviveARestartAndRevisionsMoveOn) {
  auto dir = Open();
  uint64_t last = 0;
  {
    auto s = Store();
    s->Persist(dir.get());
    ASSERT_TRUE(s->Set("alice/m:1", {"likes thrillers"}, {0.25f, -1.5f}).ok());
    size_t dropped = 0;
    last = s->Append("alice/m:1", "hates musicals", &dropped).value().revision;
    ASSERT_TRUE(s->Set("bob/s:notes", {"x"}, {}).ok());
    ASSERT_TRUE(s->Set("gone", {"y"}, {}).ok());
    EXPECT_TRUE(s->Clear("gone"));
  }
  auto s = Store();
  EXPECT_EQ(s->Persist(dir.get()), 2u);
  auto a = s->Get("alice/m:1");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->items, (std::vector<std::string>{"likes thrillers", "hates musicals"}));
  EXPECT_EQ(a->features, (std::vector<float>{0.25f, -1.5f}));
  EXPECT_EQ(a->revision, last);
  EXPECT_FALSE(s->Get("gone").has_value());
  EXPECT_GT(s->Set("carol/m:2", {"z"}, {}).value().revision, last);
  // The identity a restored context counts for comes back with it: past the per-identity
  // limit a new one of alice's is refused after the restart too.
  ContextStoreOptions capped;
  capped.max_per_identity = 1;
  auto t = Store(capped);
  t->Persist(dir.get());
  EXPECT_EQ(t->Set("alice/s:another", {"x"}, {}).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(t->Set("dave/s:first", {"x"}, {}).ok());
}

TEST_F(BridgeStateTest, ExpiryRemovesFilesAndOldFilesLoadExpired) {
  auto dir = Open();
  ContextStoreOptions o;
  o.ttl_ms = 60 * 1000;
  {
    auto s = Store(o);
    s->Persist(dir.get());
    ASSERT_TRUE(s->Set("old", {"a"}, {}).ok());
    now_ += 40 * 1000;
    ASSERT_TRUE(s->Set("new", {"b"}, {}).ok());
    now_ += 30 * 1000;  // "old" is 70 s idle, "new" 30 s
    s->Expire();
    EXPECT_FALSE(fs::exists(File(*dir, "contexts", "old")));
    EXPECT_TRUE(fs::exists(File(*dir, "contexts", "new")));
    ASSERT_TRUE(s->Set("stale", {"c"}, {}).ok());
  }
  Age(File(*dir, "contexts", "stale"), 120);  // last used two minutes before the restart
  auto s = Store(o);
  EXPECT_EQ(s->Persist(dir.get()), 1u);
  EXPECT_TRUE(s->Get("new").has_value());
  EXPECT_FALSE(s->Get("stale").has_value());
  EXPECT_FALSE(fs::exists(File(*dir, "contexts", "stale")));
  EXPECT_EQ(s->stats().expired, 1u);
}

TEST_F(BridgeStateTest, SavedContextsPastTodaysLimitsAreDropped) {
  auto dir = Open();
  {
    auto s = Store();
    s->Persist(dir.get());
    ASSERT_TRUE(s->Set("three", {"a", "b", "c"}, {}).ok());
    ASSERT_TRUE(s->Set("one", {"a"}, {}).ok());
  }
  std::ofstream(File(*dir, "contexts", "nan"))
      << R"({"items": [], "features": ["NaN"], "revision": 1})";
  ContextStoreOptions o;
  o.max_items = 2;
  auto s = Store(o);
  EXPECT_EQ(s->Persist(dir.get()), 1u);
  EXPECT_TRUE(s->Get("one").has_value());
  EXPECT_FALSE(s->Get("three").has_value());
  EXPECT_FALSE(s->Get("nan").has_value());
  EXPECT_FALSE(fs::exists(File(*dir, "contexts", "three")));
}

// A context within the store's limits (raised by flags) whose file is larger than a
// restart reads: it must not be acknowledged as saved and then dropped at the restart.
TEST_F(BridgeStateTest, ASavedContextIsOneARestartLoads) {
  auto dir = Open();
  ContextStoreOptions o;
  o.max_bytes = size_t{4} << 20;                      // --context-max-bytes 4 MiB
  const std::string text(size_t{600} << 10, '\x01');  // 600 KiB; 6 bytes each in JSON
  {
    auto s = Store(o);
    s->Persist(dir.get());
    auto r = s->Set("big", {text}, {});
    if (!r.ok()) {  // refused: then nothing was changed, and the error says why
      EXPECT_NE(r.status().message().find("--state-dir"), std::string::npos)
          << r.status().ToString();
      EXPECT_FALSE(s->Get("big").has_value());
      return;
    }
  }
  auto s = Store(o);
  EXPECT_EQ(s->Persist(dir.get()), 1u);
  auto c = s->Get("big");
  ASSERT_TRUE(c.has_value()) << "an acknowledged context was lost at the restart";
  EXPECT_EQ(c->items, std::vector<std::string>{text});
}

TEST_F(BridgeStateTest, AFailedSaveChangesNothing) {
  auto dir = Open();
  auto s = Store();
  s->Persist(dir.get());
  ASSERT_TRUE(s->Set("a", {"kept"}, {}).ok());
  fs::remove_all(path_ + "/contexts");  // the volume went away
  auto r = s->Set("a", {"lost"}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--state-dir"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(s->Get("a")->items, std::vector<std::string>{"kept"});
  EXPECT_FALSE(s->Set("b", {"new"}, {}).ok());
  EXPECT_FALSE(s->Get("b").has_value());
  EXPECT_EQ(s->stats().save_errors, 2u);
}

// Changes, clears and expiries of many sessions at once: afterwards the directory holds
// exactly what the store does.
TEST_F(BridgeStateTest, ConcurrentChangesLeaveTheDirectoryEqualToMemory) {
  auto dir = Open();
  ContextStoreOptions o;
  o.ttl_ms = 0;
  auto s = Store(o);
  s->Persist(dir.get());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&s, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 400; ++i) {
        const std::string key = "k" + std::to_string(rng() % 24);
        size_t dropped = 0;
        switch (rng() % 4) {
          case 0:
            s->Clear(key);
            break;
          case 1:
            (void)s->Append(key, "t" + std::to_string(t) + "." + std::to_string(i), &dropped);
            break;
          default:
            (void)s->Set(key, {std::to_string(i)}, {static_cast<float>(t)});
            break;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  auto reloaded = Store(o);
  const size_t n = reloaded->Persist(dir.get());
  EXPECT_EQ(n, s->stats().sessions);
  for (int k = 0; k < 24; ++k) {
    const std::string key = "k" + std::to_string(k);
    auto mem = s->Get(key), disk = reloaded->Get(key);
    ASSERT_EQ(mem.has_value(), disk.has_value()) << key;
    if (!mem) continue;
    EXPECT_EQ(mem->items, disk->items) << key;
    EXPECT_EQ(mem->features, disk->features) << key;
    EXPECT_EQ(mem->revision, disk->revision) << key;
  }
}

TEST_F(BridgeStateTest, FoldersAre0700AndFiles0600WhateverTheUmask) {
  const std::string root = path_ + "/nested/state/";
  auto dir = StateDir::Open({root, false}, {"contexts", "sessions"});
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_EQ(ModeOf(path_ + "/nested/state"), 0700u);
  const std::string file = (*dir)->FileOf("contexts", H("a"));
  std::ofstream(file + ".tmp") << "left by a crash";  // 0644: a write must not keep it
  ASSERT_EQ(ModeOf(file + ".tmp"), 0644u);
  ASSERT_TRUE((*dir)->Put("contexts", H("a"), {{"items", {"x"}}}).ok());
  ASSERT_TRUE((*dir)->Put("sessions", H("b"), {{"version", "2025-06-18"}}).ok());
  EXPECT_EQ(ExpectPrivate(root, {}), 3u);  // and the lock file
}

TEST_F(BridgeStateTest, AnExistingDirectoryOpenToOthersIsTightened) {
  fs::create_directories(path_ + "/contexts");
  ASSERT_EQ(::chmod(path_.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((path_ + "/contexts").c_str(), 0755), 0);  // as older bridges made them
  std::ofstream(path_ + "/contexts/" + H("a") + ".json") << R"({"items": []})";
  auto dir = Open();
  EXPECT_EQ(ModeOf(path_), 0700u);
  EXPECT_EQ(ModeOf(path_ + "/contexts"), 0700u);
  EXPECT_EQ(ModeOf(path_ + "/sessions"), 0700u);
  EXPECT_EQ(dir->Load("contexts").size(), 1u);
}

TEST_F(BridgeStateTest, FoldersOthersControlAreRefused) {
  fs::create_directory(path_ + "/elsewhere");
  fs::create_directory_symlink(path_ + "/elsewhere", path_ + "/contexts");
  auto d = StateDir::Open({path_, false}, {"contexts"});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(path_ + "/contexts is not a directory"), std::string::npos)
      << d.status().ToString();
  fs::remove(path_ + "/contexts");
  if (::geteuid() != 0) GTEST_SKIP() << "giving a folder to another user needs root";
  fs::create_directory(path_ + "/contexts");
  ASSERT_EQ(::chown((path_ + "/contexts").c_str(), 4242, 4242), 0);
  d = StateDir::Open({path_, false}, {"contexts"});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("belongs to uid 4242"), std::string::npos)
      << d.status().ToString();
  // DIR itself may be another user's, shared through its group (a volume's root): the
  // kind folders keep others out. Writable by anyone, it is refused.
  fs::remove(path_ + "/contexts");
  const std::string top = path_ + "/volume";
  fs::create_directory(top);
  ASSERT_EQ(::chown(top.c_str(), 4242, 4242), 0);
  ASSERT_EQ(::chmod(top.c_str(), 02775), 0);
  d = StateDir::Open({top, false}, {"contexts"});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(ModeOf(top), 0775u);  // left as it is
  EXPECT_EQ(ModeOf(top + "/contexts"), 0700u);
  ASSERT_EQ(::chmod(top.c_str(), 0777), 0);
  d = StateDir::Open({top, false}, {"contexts"});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(top), std::string::npos) << d.status().ToString();
}

TEST_F(BridgeStateTest, NoFileShowsASessionIdYetARestartFindsItsRecords) {
  std::string sid;
  {
    auto dir = Open();
    auto server = Server();
    server->Persist(dir.get());
    auto store = Store();
    store->Persist(dir.get());
    sid = Initialize(server.get(), "alice");
    ASSERT_EQ(sid.size(), 32u);
    ASSERT_EQ(
        Send(server.get(), "alice", sid, "logging/setLevel", {{"level", "debug"}}).http_status,
        200);
    ASSERT_TRUE(store->Set("alice/m:" + sid, {"likes thrillers"}, {0.5f}).ok());
    ASSERT_TRUE(store->Set("alice/s:notes", {"named"}, {}).ok());
    EXPECT_EQ(ExpectPrivate(path_, {sid}), 4u);  // and the lock file
  }
  auto dir = Open();  // a restart: the records are known by hash only
  auto server = Server();
  EXPECT_EQ(server->Persist(dir.get()), 1u);
  auto store = Store();
  EXPECT_EQ(store->Persist(dir.get()), 2u);
  EXPECT_TRUE(server->HasSession(sid, "alice"));
  EXPECT_FALSE(server->HasSession(sid, "bob"));
  EXPECT_EQ(Send(server.get(), "bob", sid, "ping").http_status, 404);  // still Alice's
  EXPECT_EQ(Send(server.get(), "alice", std::string(32, '0'), "ping").http_status, 404);
  Reply pong = Send(server.get(), "alice", sid, "ping");
  EXPECT_EQ(pong.http_status, 200) << pong.body.dump();
  EXPECT_TRUE(pong.body.contains("result")) << pong.body.dump();
  EXPECT_EQ(server->sessions(), 1u);
  auto c = store->Get("alice/m:" + sid);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->items, std::vector<std::string>{"likes thrillers"});
  EXPECT_EQ(c->features, std::vector<float>{0.5f});
  EXPECT_TRUE(store->Get("alice/s:notes").has_value());
  EXPECT_EQ(ExpectPrivate(path_, {sid}), 4u);
  EXPECT_TRUE(server->EndSession(sid, "alice"));
  EXPECT_FALSE(fs::exists(File(*dir, "sessions", sid)));
  EXPECT_EQ(server->sessions(), 0u);
}

TEST_F(BridgeStateTest, ARestoredSessionNeverUsedAgainExpires) {
  McpServerOptions o;
  o.session_idle = std::chrono::seconds(2);
  std::string sid;
  {
    auto dir = Open();
    auto server = Server(o);
    server->Persist(dir.get());
    sid = Initialize(server.get(), "alice");
    Age(File(*dir, "sessions", sid), 1);
  }
  auto dir = Open();
  auto server = Server(o);
  EXPECT_EQ(server->Persist(dir.get()), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  server->ExpireIdle();
  EXPECT_EQ(server->sessions(), 0u);
  EXPECT_FALSE(fs::exists(File(*dir, "sessions", sid)));
  EXPECT_EQ(Send(server.get(), "alice", sid, "ping").http_status, 404);
}

TEST_F(BridgeStateTest, OldFormatFilesAreConvertedKeepingTheirLastUse) {
  const std::string sid = "0123456789abcdef0123456789abcdef";
  const std::string named = "alice/s:" + std::string(100, 'n');  // a long key: a shortened name
  const std::string guessable = "session-1";                     // never an id this bridge makes
  const std::vector<std::pair<std::string, std::string>> old = {{"sessions", sid},
                                                                {"sessions", guessable},
                                                                {"contexts", "alice/m:" + sid},
                                                                {"contexts", named}};
  fs::create_directories(path_ + "/sessions");
  fs::create_directories(path_ + "/contexts");
  const std::map<std::string, json> values = {
      {"sessions",
       {{"principal", "alice"},
        {"version", "2025-06-18"},
        {"log_level", ""},
        {"client_capabilities", json::object()}}},
      {"contexts", {{"items", {"likes thrillers"}}, {"features", {0.5}}, {"revision", 7}}}};
  for (const auto& [kind, key] : old) {
    json v = values.at(kind);
    v["key"] = key;
    const std::string file = path_ + "/" + kind + "/" + LegacyName(key);
    std::ofstream(file) << v.dump();
    Age(file, 100);
  }
  auto dir = Open();
  auto server = Server();
  EXPECT_EQ(server->Persist(dir.get()), 2u);
  auto store = Store();
  EXPECT_EQ(store->Persist(dir.get()), 2u);
  EXPECT_EQ(ExpectPrivate(path_, {sid}), 5u);  // the old names are gone (the lock file stays)
  for (const auto& [kind, key] : old) {
    const std::string file = File(*dir, kind, key);
    EXPECT_FALSE(fs::exists(path_ + "/" + kind + "/" + LegacyName(key)));
    ASSERT_TRUE(fs::exists(file)) << kind << " " << key;
    struct stat st;
    ASSERT_EQ(::stat(file.c_str(), &st), 0);
    EXPECT_GE(::time(nullptr) - st.st_mtim.tv_sec, 99) << "the last use carries over";
  }
  EXPECT_EQ(Send(server.get(), "alice", sid, "ping").http_status, 200);
  EXPECT_EQ(Send(server.get(), "alice", guessable, "ping").http_status, 404);
  auto c = store->Get("alice/m:" + sid);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->items, std::vector<std::string>{"likes thrillers"});
  EXPECT_EQ(c->revision, 7u);
  EXPECT_TRUE(store->Get(named).has_value());
}

// A record that is not a regular file, or far past the record limit, is set aside without
// stalling or ballooning the bridge's start: a FIFO blocked it forever, and a 512 MiB file
// was read whole (and copied twice) before the 1 MiB limit was checked.
TEST_F(BridgeStateTest, AFifoOrAHugeFileIsSetAsideWithoutReadingIt) {
  auto dir = Open();
  ASSERT_TRUE(dir->Put("contexts", H("good"), {{"items", {"a"}}}).ok());
  const std::string fifo = File(*dir, "contexts", "fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto loading = std::async(std::launch::async, [&] { return dir->Load("contexts").size(); });
  const bool done = loading.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!done) {  // unblock the reader stuck in open(2), then fail
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  EXPECT_TRUE(done) << "Load blocked on a FIFO in the state directory";
  EXPECT_EQ(loading.get(), 1u);
  fs::remove(fifo);
  fs::remove(fifo + ".bad");

  const std::string huge = File(*dir, "contexts", "huge");
  { std::ofstream(huge) << ""; }
  fs::resize_file(huge, size_t{512} << 20);  // sparse: no disk used
  struct rusage before, after;
  ::getrusage(RUSAGE_SELF, &before);
  EXPECT_EQ(dir->Load("contexts").size(), 1u);
  ::getrusage(RUSAGE_SELF, &after);
  const long grew_mib = (after.ru_maxrss - before.ru_maxrss) / 1024;
  EXPECT_LT(grew_mib, 64) << "loading a 512 MiB record file raised the peak RSS by " << grew_mib
                          << " MiB";
}

}  // namespace
}  // namespace onlineps::bridge
