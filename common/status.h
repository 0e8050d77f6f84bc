// Status and StatusOr<T>: the result of every fallible call in onlineps.
// The code values are also the error codes of the wire protocol (docs/protocol.md),
// so a reply's error maps 1:1 onto a Status. Thread-compatible value types.
#ifndef ONLINEPS_COMMON_STATUS_H_
#define ONLINEPS_COMMON_STATUS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace onlineps {

// Stable numeric values: they travel on the wire. Append only.
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,      // a field, flag or option has a bad value
  kMalformed = 2,            // undecodable msgpack, missing field, bad frame count or size
  kUnsupportedVersion = 3,   // protocol version not spoken by this peer
  kUnknownOp = 4,            // op code not known
  kNotFound = 5,             // unknown table (or file)
  kAlreadyExists = 6,        // table exists with a different spec
  kShapeMismatch = 7,        // value or key frame does not match the table
  kNonFinite = 8,            // NaN or Inf in a gradient or delta
  kTooLarge = 9,             // message above the configured limit
  kStale = 10,               // bounded staleness: tau > s (reject mode)
  kUnavailable = 11,         // draining, not ready, or peer unreachable
  kDeadlineExceeded = 12,    // per-call timeout expired
  kResourceExhausted = 13,   // a bounded queue or cache is full
  kDataLoss = 14,            // corrupt checkpoint (bad checksum, truncated)
  kFailedPrecondition = 15,  // e.g. checkpoint of another shard layout
  kInternal = 16,            // broken invariant; a bug
  kCancelled = 17,           // the caller or a shutdown cancelled the call
  kNotPrimary = 18,          // a shard replica that is not its group's primary (msg names it)
};

// Human-readable name of a code ("kShapeMismatch" -> "SHAPE_MISMATCH").
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "SHAPE_MISMATCH: table 'emb': expected 16 floats per row, got 8".
  std::string ToString() const;

  // Returns a copy whose message is "context: message" (no-op for OK).
  Status WithContext(std::string_view context) const;

  bool operator==(const Status& o) const { return code_ == o.code_ && message_ == o.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// One constructor per error code, e.g. ShapeMismatch("table 'emb': 8 floats, want 16").
// Build messages with std::string / fmt at the call site.
inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status Malformed(std::string m) { return {StatusCode::kMalformed, std::move(m)}; }
inline Status UnsupportedVersion(std::string m) {
  return {StatusCode::kUnsupportedVersion, std::move(m)};
}
inline Status UnknownOp(std::string m) { return {StatusCode::kUnknownOp, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status ShapeMismatch(std::string m) { return {StatusCode::kShapeMismatch, std::move(m)}; }
inline Status NonFinite(std::string m) { return {StatusCode::kNonFinite, std::move(m)}; }
inline Status TooLarge(std::string m) { return {StatusCode::kTooLarge, std::move(m)}; }
inline Status Stale(std::string m) { return {StatusCode::kStale, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status NotPrimary(std::string m) { return {StatusCode::kNotPrimary, std::move(m)}; }

// Either a value or a non-OK Status. Accessing value() of an error aborts (a bug).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Internal("StatusOr constructed from OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & {
    CheckOk();
    return *value_;
  }
  const T& value() const& {
    CheckOk();
    return *value_;
  }
  T&& value() && {
    CheckOk();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckOk() const;
  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void AbortOnBadStatusOrAccess(const Status& s);

template <typename T>
void StatusOr<T>::CheckOk() const {
  if (!status_.ok()) AbortOnBadStatusOrAccess(status_);
}

}  // namespace onlineps

// Propagates a non-OK Status from the current function.
#define ONLINEPS_RETURN_IF_ERROR(expr) \
  do {                                 \
    ::onlineps::Status _st = (expr);   \
    if (!_st.ok()) return _st;         \
  } while (0)

#define ONLINEPS_CONCAT_INNER(a, b) a##b
#define ONLINEPS_CONCAT(a, b) ONLINEPS_CONCAT_INNER(a, b)
// ONLINEPS_ASSIGN_OR_RETURN(auto x, Foo()); declares x or returns Foo()'s error.
#define ONLINEPS_ASSIGN_OR_RETURN(lhs, expr)                                                  \
  auto ONLINEPS_CONCAT(_so_, __LINE__) = (expr);                                              \
  if (!ONLINEPS_CONCAT(_so_, __LINE__).ok()) return ONLINEPS_CONCAT(_so_, __LINE__).status(); \
  lhs = std::move(ONLINEPS_CONCAT(_so_, __LINE__)).value()

#endif  // ONLINEPS_COMMON_STATUS_H_
