// ContextStore (worker/context_store.h): LRU and TTL bounds (TTL on an injected clock),
// item and byte trimming, id and feature validation, and what Input hands a forward pass.
#include "worker/context_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "worker/worker_client.h"

namespace onlineps::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ContextStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<ContextStore> Make(ContextStoreOptions o) {
    return std::make_unique<ContextStore>(o, [this] { return now_; });
  }
  int64_t now_ = 1000;
};

TEST_F(ContextStoreTest, SetThenGetAndInputJoinsItemsWithSpaces) {
  auto store = Make({});
  ASSERT_TRUE(store->Set("s1", {"hello", "big", "world"}, {0.5f, 1.5f}).ok());
  auto c = store->Get("s1");
  ASSERT_TRUE(c.has_value());
  EXPECT_THAT(c->items, ElementsAre("hello", "big", "world"));
  EXPECT_EQ(c->features, (std::vector<float>{0.5f, 1.5f}));
  EXPECT_EQ(c->updated_ms, 1000);
  ContextInput in = store->Input("s1");
  EXPECT_EQ(in.text, "hello big world");
  EXPECT_EQ(in.features, (std::vector<float>{0.5f, 1.5f}));
}

// InputAt serves a context only at the revision the bridge set it with: a missing one
// (never set, evicted, or a restarted worker), another revision, or one changed by an
// append since is refused naming what is held, so the caller sends the context again.
TEST_F(ContextStoreTest, InputAtServesOnlyTheRevisionTheContextWasSetWith) {
  auto store = Make({});
  auto missing = store->InputAt("s1", 3);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr(kContextNotHeld));
  EXPECT_THAT(missing.status().message(), HasSubstr("holds none"));
  ASSERT_TRUE(store->Set("s1", {"hello"}, {}, 3).ok());
  auto held = store->InputAt("s1", 3);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->text, "hello");
  auto other = store->InputAt("s1", 4);
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(), HasSubstr("holds revision 3"));
  ASSERT_TRUE(store->Append("s1", "world").ok());  // no longer what the bridge sent
  EXPECT_FALSE(store->InputAt("s1", 3).ok());
  EXPECT_EQ(store->Input("s1").text, "hello world");  // without a revision: as it is
}

TEST_F(ContextStoreTest, UnknownSessionHasNoContextAndEmptyInput) {
  auto store = Make({});
  EXPECT_FALSE(store->Get("nobody").has_value());
  EXPECT_TRUE(store->Input("nobody").empty());
}

TEST_F(ContextStoreTest, SetReplacesItemsAndFeatures) {
  auto store = Make({});
  ASSERT_TRUE(store->Set("s", {"a", "b"}, {1}).ok());
  ASSERT_TRUE(store->Set("s", {"c"}, {2, 3}).ok());
  auto c = store->Get("s");
  ASSERT_TRUE(c.has_value());
  EXPECT_THAT(c->items, ElementsAre("c"));
  EXPECT_EQ(c->features, (std::vector<float>{2, 3}));
}

TEST_F(ContextStoreTest, AppendCreatesThenExtendsKeepingFeatures) {
  auto store = Make({});
  ASSERT_TRUE(store->Append("s", "first").ok());
  ASSERT_TRUE(store->Set("s", {"x"}, {7}).ok());
  ASSERT_TRUE(store->Append("s", "y").ok());
  ContextInput in = store->Input("s");
  EXPECT_EQ(in.text, "x y");
  EXPECT_EQ(in.features, std::vector<float>{7});
}

TEST_F(ContextStoreTest, SessionsAreIsolated) {
  auto store = Make({});
  ASSERT_TRUE(store->Set("a", {"alpha"}, {1}).ok());
  ASSERT_TRUE(store->Set("b", {"beta"}, {2}).ok());
  ASSERT_TRUE(store->Append("a", "more").ok());
  EXPECT_EQ(store->Input("a").text, "alpha more");
  EXPECT_EQ(store->Input("b").text, "beta");
  EXPECT_TRUE(store->Clear("a"));
  EXPECT_EQ(store->Input("b").features, std::vector<float>{2});
}

TEST_F(ContextStoreTest, ClearReturnsWhetherPresent) {
  auto store = Make({});
  EXPECT_FALSE(store->Clear("s"));
  ASSERT_TRUE(store->Set("s", {"x"}, {}).ok());
  EXPECT_TRUE(store->Clear("s"));
  EXPECT_FALSE(store->Clear("s"));
  EXPECT_FALSE(store->Get("s").has_value());
  EXPECT_EQ(store->stats().sessions, 0u);
}

TEST_F(ContextStoreTest, LeastRecentlyUsedSessionIsEvictedAtCapacity) {
  ContextStoreOptions o;
  o.max_sessions = 2;
  auto store = Make(o);
  ASSERT_TRUE(store->Set("a", {"1"}, {}).ok());
  ASSERT_TRUE(store->Set("b", {"2"}, {}).ok());
  ASSERT_TRUE(store->Get("a").has_value());  // a is now more recent than b
  ASSERT_TRUE(store->Set("c", {"3"}, {}).ok());
  EXPECT_FALSE(store->Get("b").has_value());
  EXPECT_TRUE(store->Get("a").has_value());
  EXPECT_TRUE(store->Get("c").has_value());
  auto s = store->stats();
  EXPECT_EQ(s.sessions, 2u);
  EXPECT_EQ(s.evicted_lru, 1u);
  EXPECT_EQ(s.expired, 0u);
}

TEST_F(ContextStoreTest, IdleSessionExpiresAfterTtlAndUseRefreshesIt) {
  ContextStoreOptions o;
  o.ttl_ms = 100;
  auto store = Make(o);
  ASSERT_TRUE(store->Set("s", {"x"}, {}).ok());
  now_ += 100;  // idle exactly the TTL: still live
  EXPECT_EQ(store->Input("s").text, "x");
  now_ += 100;  // the read above refreshed it
  ASSERT_TRUE(store->Get("s").has_value());
  now_ += 101;
  EXPECT_FALSE(store->Get("s").has_value());
  auto s = store->stats();
  EXPECT_EQ(s.expired, 1u);
  EXPECT_EQ(s.sessions, 0u);
  EXPECT_FALSE(store->Clear("s"));
}

TEST_F(ContextStoreTest, ExpiredSessionIsAbsentForAppendWhichStartsAfresh) {
  ContextStoreOptions o;
  o.ttl_ms = 100;
  auto store = Make(o);
  ASSERT_TRUE(store->Set("s", {"old"}, {1, 2}).ok());
  now_ += 500;
  ASSERT_TRUE(store->Append("s", "new").ok());
  auto c = store->Get("s");
  ASSERT_TRUE(c.has_value());
  EXPECT_THAT(c->items, ElementsAre("new"));
  EXPECT_TRUE(c->features.empty());
  EXPECT_EQ(store->stats().expired, 1u);
}

TEST_F(ContextStoreTest, ExpireSweepsOnlyIdleSessions) {
  ContextStoreOptions o;
  o.ttl_ms = 100;
  auto store = Make(o);
  ASSERT_TRUE(store->Set("a", {"1"}, {}).ok());
  now_ += 50;
  ASSERT_TRUE(store->Set("b", {"2"}, {}).ok());
  ASSERT_TRUE(store->Set("c", {"3"}, {}).ok());
  now_ += 70;  // a idle 120 ms, b and c 70 ms
  store->Expire();
  auto s = store->stats();
  EXPECT_EQ(s.sessions, 2u);
  EXPECT_EQ(s.expired, 1u);
  now_ += 40;  // b and c idle 110 ms
  store->Expire();
  s = store->stats();
  EXPECT_EQ(s.sessions, 0u);
  EXPECT_EQ(s.expired, 3u);
}

TEST_F(ContextStoreTest, OldestItemsDroppedPastMaxItems) {
  ContextStoreOptions o;
  o.max_items = 3;
  auto store = Make(o);
  for (const char* w : {"a", "b", "c", "d", "e"}) ASSERT_TRUE(store->Append("s", w).ok());
  EXPECT_EQ(store->Input("s").text, "c d e");
  ASSERT_TRUE(store->Set("t", {"1", "2", "3", "4"}, {}).ok());
  EXPECT_EQ(store->Input("t").text, "2 3 4");
  EXPECT_EQ(store->stats().items_dropped, 3u);
}

TEST_F(ContextStoreTest, OldestItemsDroppedPastMaxBytes) {
  ContextStoreOptions o;
  o.max_bytes = 10;
  auto store = Make(o);
  ASSERT_TRUE(store->Set("s", {"aaaa", "bbbb", "cccc"}, {}).ok());  // 12 bytes
  EXPECT_EQ(store->Input("s").text, "bbbb cccc");
  ASSERT_TRUE(store->Append("s", "dd").ok());  // exactly 10 bytes: kept
  EXPECT_EQ(store->Input("s").text, "bbbb cccc dd");
  ASSERT_TRUE(store->Append("s", "e").ok());
  EXPECT_EQ(store->Input("s").text, "cccc dd e");
  EXPECT_EQ(store->stats().items_dropped, 2u);
}

TEST_F(ContextStoreTest, OversizedItemKeepsItsNewestBytes) {
  ContextStoreOptions o;
  o.max_bytes = 5;
  auto store = Make(o);
  ASSERT_TRUE(store->Set("s", {"ab"}, {}).ok());
  ASSERT_TRUE(store->Append("s", "0123456789").ok());
  auto c = store->Get("s");
  ASSERT_TRUE(c.has_value());
  EXPECT_THAT(c->items, ElementsAre("56789"));
  EXPECT_EQ(store->stats().items_dropped, 1u);
}

TEST_F(ContextStoreTest, OversizedItemIsNotCutInsideAUtf8Character) {
  ContextStoreOptions o;
  o.max_bytes = 5;
  auto store = Make(o);
  // "\xC3\xA9" is one two-byte character; the last 5 bytes would start inside it.
  ASSERT_TRUE(store
                  ->Set("s",
                        {"\xC3\xA9"
                         "abcd"},
                        {})
                  .ok());
  EXPECT_EQ(store->Input("s").text, "abcd");
}

TEST_F(ContextStoreTest, SessionIdMustBeNonEmptyAndWithinLimit) {
  auto store = Make({});
  Status st = store->Set("", {"x"}, {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Append("", "x").code(), StatusCode::kInvalidArgument);
  st = store->Set(std::string(257, 'x'), {"x"}, {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("256"));
  EXPECT_EQ(store->Append(std::string(257, 'x'), "x").code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->Set(std::string(256, 'x'), {"x"}, {}).ok());
  EXPECT_EQ(store->stats().sessions, 1u);
}

TEST_F(ContextStoreTest, TooManyFeaturesAreRefusedAndNothingStored) {
  ContextStoreOptions o;
  o.max_features = 3;
  auto store = Make(o);
  Status st = store->Set("s", {"x"}, {1, 2, 3, 4});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("max_features = 3"));
  EXPECT_FALSE(store->Get("s").has_value());
  EXPECT_TRUE(store->Set("s", {"x"}, {1, 2, 3}).ok());
}

TEST(ContextStoreRealClockTest, DefaultConstructorUsesMonotonicClock) {
  ContextStore store({});
  ASSERT_TRUE(store.Set("s", {"x"}, {}).ok());
  auto c = store.Get("s");
  ASSERT_TRUE(c.has_value());
  EXPECT_GT(c->updated_ms, 0);
}

}  // namespace
}  // namespace onlineps::worker
