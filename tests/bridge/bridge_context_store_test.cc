#include <gtest/gtest.h>

#include <limits>

#include "mcp_bridge/context_store.h"

namespace onlineps::bridge {
namespace {

class BridgeContextStoreTest : public ::testing::Test {
 protected:
  ContextStore Make(ContextStoreOptions o) {
    return ContextStore(o, [this] { return now_; });
  }
  int64_t now_ = 1000;
};

TEST_F(BridgeContextStoreTest, SetThenGetReturnsTheContext) {
  ContextStore s = Make({});
  auto c = s.Set("a", {"likes thrillers"}, {1.5f, 2.0f});
  ASSERT_TRUE(c.ok());
  auto got = s.Get("a");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->items, std::vector<std::string>{"likes thrillers"});
  EXPECT_EQ(got->features, (std::vector<float>{1.5f, 2.0f}));
  EXPECT_FALSE(s.Get("b").has_value());
}

TEST_F(BridgeContextStoreTest, EveryChangeBumpsTheRevision) {
  ContextStore s = Make({});
  const uint64_t r1 = s.Set("a", {"x"}, {}).value().revision;
  size_t dropped = 0;
  const uint64_t r2 = s.Append("a", "y", &dropped).value().revision;
  const uint64_t r3 = s.Set("b", {"x"}, {}).value().revision;
  EXPECT_LT(r1, r2);
  EXPECT_LT(r2, r3);
  EXPECT_EQ(s.Get("a")->revision, r2);  // a read is not a change
}

TEST_F(BridgeContextStoreTest, SetPastALimitIsRefusedAndChangesNothing) {
  ContextStoreOptions o;
  o.max_items = 2;
  o.max_bytes = 10;
  o.max_features = 3;
  ContextStore s = Make(o);
  ASSERT_TRUE(s.Set("a", {"ok"}, {}).ok());
  auto too_many = s.Set("a", {"1", "2", "3"}, {});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("--context-max-items"), std::string::npos);
  auto too_long = s.Set("a", {"0123456789x"}, {});
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("--context-max-bytes"), std::string::npos);
  auto features = s.Set("a", {}, {1, 2, 3, 4});
  ASSERT_FALSE(features.ok());
  EXPECT_NE(features.status().message().find("--context-max-features"), std::string::npos);
  EXPECT_EQ(s.Get("a")->items, std::vector<std::string>{"ok"});
}

TEST_F(BridgeContextStoreTest, NonFiniteFeaturesAreRefused) {
  ContextStore s = Make({});
  auto c = s.Set("a", {}, {1.0f, std::numeric_limits<float>::infinity()});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("features[1]"), std::string::npos);
}

TEST_F(BridgeContextStoreTest, AppendKeepsARollingWindowAndSaysWhatItDropped) {
  ContextStoreOptions o;
  o.max_items = 3;
  ContextStore s = Make(o);
  size_t dropped = 0;
  for (const char* t : {"a", "b", "c"}) ASSERT_TRUE(s.Append("x", t, &dropped).ok());
  EXPECT_EQ(dropped, 0u);
  auto c = s.Append("x", "d", &dropped);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(dropped, 1u);
  EXPECT_EQ(c->items, (std::vector<std::string>{"b", "c", "d"}));
  EXPECT_EQ(s.stats().items_dropped, 1u);
  auto huge = s.Append("x", std::string(o.max_bytes + 1, 'z'), &dropped);
  EXPECT_FALSE(huge.ok());
}

TEST_F(BridgeContextStoreTest, IdleContextsExpire) {
  ContextStoreOptions o;
  o.ttl_ms = 100;
  ContextStore s = Make(o);
  ASSERT_TRUE(s.Set("a", {"x"}, {}).ok());
  now_ += 50;
  EXPECT_TRUE(s.Get("a").has_value());  // a read keeps it alive
  now_ += 90;
  EXPECT_TRUE(s.Get("a").has_value());
  now_ += 101;
  EXPECT_FALSE(s.Get("a").has_value());
  EXPECT_EQ(s.stats().expired, 1u);
}

TEST_F(BridgeContextStoreTest, AFullStoreRefusesNewSessionsUntilOneExpires) {
  ContextStoreOptions o;
  o.max_sessions = 2;
  o.ttl_ms = 100;
  ContextStore s = Make(o);
  ASSERT_TRUE(s.Set("a", {"x"}, {}).ok());
  ASSERT_TRUE(s.Set("b", {"x"}, {}).ok());
  auto c = s.Set("c", {"x"}, {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(s.Set("a", {"y"}, {}).ok());  // existing sessions still change
  now_ += 200;
  EXPECT_TRUE(s.Set("c", {"x"}, {}).ok());
  EXPECT_EQ(s.stats().refused, 1u);
}

// One identity cannot take every context (named handles cost it nothing to mint): past
// max_per_identity a new one of that identity is refused; other identities, and keys of
// no identity, are not; clearing or expiry frees a place.
TEST_F(BridgeContextStoreTest, OneIdentityCannotTakeEveryContext) {
  ContextStoreOptions o;
  o.max_sessions = 100;
  o.max_per_identity = 2;
  o.ttl_ms = 1000;
  ContextStore s = Make(o);
  ASSERT_TRUE(s.Set("alice/s:a", {"x"}, {}).ok());
  ASSERT_TRUE(s.Set("alice/m:b", {"x"}, {}).ok());
  auto third = s.Set("alice/s:c", {"x"}, {});
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--max-sessions-per-client"), std::string::npos)
      << third.status().ToString();
  EXPECT_TRUE(s.Set("alice/s:a", {"y"}, {}).ok()) << "its existing contexts still change";
  EXPECT_TRUE(s.Set("bob/s:c", {"x"}, {}).ok());
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(s.Set("s:anon" + std::to_string(i), {"x"}, {}).ok());
  EXPECT_TRUE(s.Clear("alice/m:b"));
  EXPECT_TRUE(s.Set("alice/s:c", {"x"}, {}).ok()) << "a cleared context frees its place";
  EXPECT_FALSE(s.Set("alice/s:d", {"x"}, {}).ok());
  now_ += 2000;  // alice's contexts expire
  EXPECT_TRUE(s.Set("alice/s:d", {"x"}, {}).ok());
}

TEST_F(BridgeContextStoreTest, ClearRemoves) {
  ContextStore s = Make({});
  ASSERT_TRUE(s.Set("a", {"x"}, {}).ok());
  EXPECT_TRUE(s.Clear("a"));
  EXPECT_FALSE(s.Clear("a"));
  EXPECT_FALSE(s.Get("a").has_value());
}

}  // namespace
}  // namespace onlineps::bridge
