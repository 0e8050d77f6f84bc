#include "worker/request_limits.h"

namespace onlineps::worker {
namespace {

// "<what>; at most <most> <unit> (<flag>)"
Status TooLarge(const std::string& what, size_t most, const char* unit, const char* flag) {
  return onlineps::TooLarge(what + "; at most " + std::to_string(most) + " " + unit + " (" + flag +
                            ")");
}

}  // namespace

uint64_t RequestLimits::MaxBodyNumbers() const {
  return (uint64_t{max_batch} + 1) * (uint64_t{max_features} + 1);
}

uint64_t RequestLimits::MaxBodyOtherValues() const { return 16 * uint64_t{max_batch} + 256; }

size_t CountWords(std::string_view text) {
  size_t words = 0;
  bool in_word = false;
  for (const char c : text) {
    const bool w = IsWordByte(static_cast<unsigned char>(c));
    words += w && !in_word;
    in_word = w;
  }
  return words;
}

Status CheckRequestBytes(size_t bytes, const RequestLimits& limits) {
  if (bytes <= limits.max_request_bytes) return Status::Ok();
  return TooLarge("request is " + std::to_string(bytes) + " bytes", limits.max_request_bytes,
                  "bytes", "--max-request-bytes");
}

Status CheckBatchSize(size_t examples, const RequestLimits& limits, const char* batch_flag) {
  if (examples <= limits.max_batch) return Status::Ok();
  return TooLarge(std::to_string(examples) + " examples", limits.max_batch, "per request",
                  batch_flag);
}

Status CheckTextBytes(size_t bytes, const std::string& where, const RequestLimits& limits) {
  if (bytes <= limits.max_text_bytes) return Status::Ok();
  return TooLarge(where + " is " + std::to_string(bytes) + " bytes", limits.max_text_bytes, "bytes",
                  "--max-text-bytes");
}

Status CheckFeatureCount(size_t values, const std::string& where, const RequestLimits& limits) {
  if (values <= limits.max_features) return Status::Ok();
  return TooLarge(where + " has " + std::to_string(values) + " values", limits.max_features,
                  "per example", "--max-features");
}

Status CheckTokens(size_t tokens, const RequestLimits& limits, const std::string& what) {
  if (tokens <= limits.max_tokens) return Status::Ok();
  return TooLarge("the texts of the " + what + " have " + std::to_string(tokens) + " words",
                  limits.max_tokens, "per request", "--max-tokens");
}

}  // namespace onlineps::worker
