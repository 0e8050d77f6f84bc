#include "common/hash.h"

#include <gtest/gtest.h>

namespace onlineps {
namespace {

// Published FNV-1a 64 test vectors: the one helper every copy now shares is the real thing.
TEST(HashTest, Fnv1a64MatchesPublishedVectors) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(HashTest, Fnv1a64ContinuesFromAGivenState) {
  EXPECT_EQ(Fnv1a64("bar", Fnv1a64("foo")), Fnv1a64("foobar"));
  uint64_t h = kFnv64Offset;
  for (char c : std::string_view("foobar")) h = Fnv1a64Step(h, static_cast<unsigned char>(c));
  EXPECT_EQ(h, Fnv1a64("foobar"));
}

// Sparse keys of text models and row initializers derive from HashString: its values
// are part of every stored model and must never change.
TEST(HashTest, HashStringIsStable) {
  EXPECT_EQ(HashString("w:hello"), 0x7c683f69ffa07b06ULL);
  EXPECT_EQ(HashString("w:hello"), Mix64(Fnv1a64("w:hello")));
  static_assert(HashString("x") == Mix64(Fnv1a64("x")), "usable at compile time");
}

}  // namespace
}  // namespace onlineps
