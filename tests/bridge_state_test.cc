// StateDir and the ContextStore kept in it (--state-dir): what a restarted bridge loads.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "mcp_bridge/context_store.h"
#include "mcp_bridge/state_dir.h"

namespace onlineps::bridge {
namespace {

namespace fs = std::filesystem;

class BridgeStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/bridge_state.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  void TearDown() override { fs::remove_all(path_); }
  std::unique_ptr<StateDir> Open() {
    auto d = StateDir::Open({path_, false}, {"contexts"});
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(*d) : nullptr;
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
};

TEST_F(BridgeStateTest, RecordsRoundTripWhateverTheirKeys) {
  auto dir = Open();
  const std::string long_key = "identity/s:" + std::string(300, 'x');
  const std::string near_key = "identity/s:" + std::string(299, 'x') + "y";
  for (const std::string& key : {std::string("alice/m:0a1b"), long_key, near_key}) {
    ASSERT_TRUE(dir->Put("contexts", key, {{"n", key.size()}}).ok());
  }
  EXPECT_NE(dir->FileOf("contexts", long_key), dir->FileOf("contexts", near_key));
  std::map<std::string, size_t> got;
  for (const auto& r : dir->Load("contexts")) got[r.key] = r.value["n"];
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(got[long_key], long_key.size());
  EXPECT_EQ(got["alice/m:0a1b"], 12u);
  dir->Remove("contexts", long_key);
  EXPECT_EQ(dir->Load("contexts").size(), 2u);
  EXPECT_FALSE(dir->Touch("contexts", long_key));
  EXPECT_TRUE(dir->Touch("contexts", near_key));
}

TEST_F(BridgeStateTest, UnreadableFilesAreSetAsideAndTheRestLoads) {
  auto dir = Open();
  ASSERT_TRUE(dir->Put("contexts", "good", {{"items", {"a"}}}).ok());
  const std::string good = dir->FileOf("contexts", "good");
  const std::string other = dir->FileOf("contexts", "other");
  const std::string renamed = dir->FileOf("contexts", "renamed");
  std::ofstream(dir->FileOf("contexts", "torn")) << "{\"key\": \"torn\", \"items\": [";
  std::ofstream(other) << "[1, 2]";
  std::ofstream(renamed) << "{\"key\": \"good\"}";  // a file whose key is not its name
  std::ofstream(good + ".tmp") << "half a write";
  dir = Open();  // a restart
  EXPECT_FALSE(fs::exists(good + ".tmp"));
  auto records = dir->Load("contexts");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].key, "good");
  EXPECT_TRUE(fs::exists(other + ".bad"));
  EXPECT_TRUE(fs::exists(renamed + ".bad"));
  EXPECT_TRUE(fs::exists(dir->FileOf("contexts", "torn") + ".bad"));
  EXPECT_TRUE(dir->Load("contexts").size() == 1u);  // set aside once, not again
}

TEST_F(BridgeStateTest, OpenNamesAPathItCannotUse) {
  const std::string file = path_ + "/plain-file";
  std::ofstream(file) << "x";
  auto d = StateDir::Open({file, false}, {"contexts"});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(file), std::string::npos) << d.status().ToString();
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
    EXPECT_FALSE(fs::exists(dir->FileOf("contexts", "old")));
    EXPECT_TRUE(fs::exists(dir->FileOf("contexts", "new")));
    ASSERT_TRUE(s->Set("stale", {"c"}, {}).ok());
  }
  Age(dir->FileOf("contexts", "stale"), 120);  // last used two minutes before the restart
  auto s = Store(o);
  EXPECT_EQ(s->Persist(dir.get()), 1u);
  EXPECT_TRUE(s->Get("new").has_value());
  EXPECT_FALSE(s->Get("stale").has_value());
  EXPECT_FALSE(fs::exists(dir->FileOf("contexts", "stale")));
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
  std::ofstream(dir->FileOf("contexts", "nan"))
      << R"({"key": "nan", "items": [], "features": ["NaN"], "revision": 1})";
  ContextStoreOptions o;
  o.max_items = 2;
  auto s = Store(o);
  EXPECT_EQ(s->Persist(dir.get()), 1u);
  EXPECT_TRUE(s->Get("one").has_value());
  EXPECT_FALSE(s->Get("three").has_value());
  EXPECT_FALSE(s->Get("nan").has_value());
  EXPECT_FALSE(fs::exists(dir->FileOf("contexts", "three")));
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

}  // namespace
}  // namespace onlineps::bridge
