#include "common/status.h"

#include <gtest/gtest.h>

namespace onlineps {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = ShapeMismatch("table 'emb': expected 16 floats per row, got 8");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kShapeMismatch);
  EXPECT_EQ(s.ToString(), "SHAPE_MISMATCH: table 'emb': expected 16 floats per row, got 8");
  EXPECT_EQ(s.WithContext("push").message(),
            "push: table 'emb': expected 16 floats per row, got 8");
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status UseHalf(int x, int* out) {
  ONLINEPS_ASSIGN_OR_RETURN(*out, Half(x));
  return Status::Ok();
}

TEST(StatusOrTest, ValueAndErrorPropagate) {
  int out = 0;
  EXPECT_TRUE(UseHalf(8, &out).ok());
  EXPECT_EQ(out, 4);
  Status s = UseHalf(7, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 7");
}

TEST(StatusOrTest, OkStatusWithoutValueBecomesInternal) {
  StatusOr<int> v(Status::Ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
}

TEST(StatusOrDeathTest, ValueOfErrorAborts) {
  StatusOr<int> v(NotFound("x"));
  EXPECT_DEATH({ (void)v.value(); }, "NOT_FOUND: x");
}

}  // namespace
}  // namespace onlineps
