#include "common/status.h"

#include <cstdio>
#include <cstdlib>

namespace onlineps {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kMalformed:
      return "MALFORMED";
    case StatusCode::kUnsupportedVersion:
      return "UNSUPPORTED_VERSION";
    case StatusCode::kUnknownOp:
      return "UNKNOWN_OP";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kShapeMismatch:
      return "SHAPE_MISMATCH";
    case StatusCode::kNonFinite:
      return "NON_FINITE";
    case StatusCode::kTooLarge:
      return "TOO_LARGE";
    case StatusCode::kStale:
      return "STALE";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kCancelled:
      return "CANCELLED";
    case StatusCode::kNotPrimary:
      return "NOT_PRIMARY";
  }
  return "UNKNOWN_CODE";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

void AbortOnBadStatusOrAccess(const Status& s) {
  std::fprintf(stderr, "onlineps: value() of an error StatusOr: %s\n", s.ToString().c_str());
  std::abort();
}

}  // namespace onlineps
