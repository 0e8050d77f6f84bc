#include "common/status.h"

#include <gtest/gtest.h>

#include <iterator>
#include <utility>

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

TEST(StatusTest, EveryErrorCodeHasItsConstructor) {
  using Make = Status (*)(std::string);
  const std::pair<Make, StatusCode> all[] = {
      {InvalidArgument, StatusCode::kInvalidArgument},
      {Malformed, StatusCode::kMalformed},
      {UnsupportedVersion, StatusCode::kUnsupportedVersion},
      {UnknownOp, StatusCode::kUnknownOp},
      {NotFound, StatusCode::kNotFound},
      {AlreadyExists, StatusCode::kAlreadyExists},
      {ShapeMismatch, StatusCode::kShapeMismatch},
      {NonFinite, StatusCode::kNonFinite},
      {TooLarge, StatusCode::kTooLarge},
      {Stale, StatusCode::kStale},
      {Unavailable, StatusCode::kUnavailable},
      {DeadlineExceeded, StatusCode::kDeadlineExceeded},
      {ResourceExhausted, StatusCode::kResourceExhausted},
      {DataLoss, StatusCode::kDataLoss},
      {FailedPrecondition, StatusCode::kFailedPrecondition},
      {Internal, StatusCode::kInternal},
      {Cancelled, StatusCode::kCancelled},
      {NotPrimary, StatusCode::kNotPrimary},
  };
  // Every code but kOk, each once: a code appended to the enum needs its constructor here.
  ASSERT_EQ(std::size(all), static_cast<size_t>(StatusCode::kNotPrimary));
  for (const auto& [make, code] : all) {
    Status s = make("why");
    EXPECT_EQ(s.code(), code);
    EXPECT_EQ(s.message(), "why");
  }
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
