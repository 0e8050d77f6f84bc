// The examples of an infer or learn request: the one rule, shared by the MCP bridge's
// tools (JSON arguments) and the worker's RPC decoding (msgpack bodies), and its JSON
// Schema, which the bridge advertises in tools/list. Torch-free; no state.
//
// The rule (docs/protocol.md, "Worker RPC"; docs/mcp-bridge.md, "Tools"): a request holds
// either "examples", an array of 1..max_batch examples, or the fields of one example at
// top level, never both. An example is an object with exactly one of "text" (a string)
// and "features" (an array of finite numbers; on the worker's msgpack wire also a bin of
// little-endian float32), for learn a "label" (a label name, or a non-negative index:
// the worker checks it against its labels), and no other field. Other top-level fields
// of a request ("session", ...) are the caller's to check.
#ifndef ONLINEPS_WORKER_EXAMPLES_H_
#define ONLINEPS_WORKER_EXAMPLES_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/request_limits.h"

namespace onlineps::worker {

struct ExampleRule {
  bool labelled = false;                   // learn: every example needs a label
  RequestLimits limits;                    // max_batch, max_text_bytes, max_features
  const char* batch_flag = "--max-batch";  // the flag of limits.max_batch in messages
  // How messages name the top-level example ("request" gives "request.text"); "" names
  // its fields bare ("text") and the example "the call".
  std::string top_level = "request";
};

// Checks the examples of `request` (an object) against the rule and the limits, and adds
// the words of their texts (CountWords) to `*words` when set. Reads sizes and scans
// text; copies nothing. Errors: kInvalidArgument naming the field, kTooLarge naming
// the limit's flag.
Status CheckExamples(const nlohmann::json& request, const ExampleRule& rule,
                     size_t* words = nullptr);
// The examples of a request CheckExamples accepted: request["examples"], or the request
// itself as its one example (then only its example fields are the example's).
std::vector<nlohmann::json*> ExamplesIn(nlohmann::json& request);
// The same, as an array of examples that hold only their example fields.
nlohmann::json ExampleArray(const nlohmann::json& request);

// "" when every element of the JSON array `f` is a number finite as the float32 a model
// reads (3.5e38 is a finite double, Inf as float), else "<where>[i] is not a finite
// number (within float32's range)" for the first that is not. Examples' and contexts'
// features alike.
std::string NonFiniteFeature(const nlohmann::json& f, const std::string& where);

// A label given as an index: a non-negative integer, or a float with an integral value
// (JSON Schema counts 1.0 as an integer). nullopt for anything else.
std::optional<int64_t> LabelIndex(const nlohmann::json& v);

// The JSON Schema (2020-12) of one example, and the properties an infer (learn) request
// takes beside "session": text, features, examples (and label). The request's
// "oneOf" (examples, or one example at top level) is RequestSchemaRule.
nlohmann::json ExampleSchema(bool labelled);
nlohmann::json RequestProperties(bool labelled);
nlohmann::json RequestSchemaRule(bool labelled);

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_EXAMPLES_H_
