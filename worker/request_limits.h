// RequestLimits: how much one worker request may carry, so that the memory one request
// can make a worker allocate is bounded (docs/reliability.md, "Worker memory per
// request"). Each field is a flag of onlineps_worker; the MCP bridge checks the same
// limits with the same functions first, so what the bridge accepts the worker accepts.
// Every check runs before anything proportional to the request is allocated: on the
// size of a field, or on a scan that builds nothing. Torch-free; no state.
#ifndef ONLINEPS_WORKER_REQUEST_LIMITS_H_
#define ONLINEPS_WORKER_REQUEST_LIMITS_H_

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace onlineps::worker {

struct RequestLimits {
  size_t max_request_bytes = 16 << 20;  // --max-request-bytes: all frames of one request
  size_t max_batch = 256;               // --max-batch: examples of one infer or learn
  size_t max_text_bytes = 64 << 10;     // --max-text-bytes: the text of one example
  // --max-tokens: words in all texts of one request (a text's feature keys are its
  // words plus, with bigrams, one per adjacent pair: fewer than twice its words).
  size_t max_tokens = 32 << 10;
  size_t max_features = 4096;  // --max-features: feature values of one example

  // What a decoded request body (a JSON DOM) may hold, derived from the fields above:
  // numbers, (max_batch + 1) x (max_features + 1) (every example's features and label,
  // plus one row for a context's features); any other value or map key, 16 per example
  // plus 256.
  uint64_t MaxBodyNumbers() const;
  uint64_t MaxBodyOtherValues() const;
};

// Whether byte `c` belongs to a word: the models' words (TextFeatureKeys) are runs of
// ASCII letters and digits; every other byte, UTF-8 included, separates them.
inline bool IsWordByte(unsigned char c) { return c < 0x80 && std::isalnum(c) != 0; }

// Words of `text` as the models tokenize it. A scan that allocates nothing.
size_t CountWords(std::string_view text);

// Each returns kTooLarge naming the limit and its flag, or OK. `where` names the field
// ("examples[3].text"); `batch_flag` names the flag of max_batch (the bridge's is
// --max-examples).
Status CheckRequestBytes(size_t bytes, const RequestLimits& limits);
Status CheckBatchSize(size_t examples, const RequestLimits& limits,
                      const char* batch_flag = "--max-batch");
Status CheckTextBytes(size_t bytes, const std::string& where, const RequestLimits& limits);
Status CheckFeatureCount(size_t values, const std::string& where, const RequestLimits& limits);
// `tokens`: CountWords summed over every text of the request. `what`: "request" or,
// for a part of one, which part ("examples 64..127").
Status CheckTokens(size_t tokens, const RequestLimits& limits, const std::string& what = "request");

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_REQUEST_LIMITS_H_
