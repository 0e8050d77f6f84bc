// Worker RPC bodies: the msgpack map in frame 1 of every worker request and reply,
// converted to and from the service's types. The schema (docs/protocol.md, "Worker
// RPC") is plain msgpack so the bridge can forward JSON tool arguments with
// nlohmann::json::to_msgpack. Every decode validates field by field and names the bad
// field; nothing here throws.
#ifndef ONLINEPS_WORKER_WORKER_RPC_H_
#define ONLINEPS_WORKER_WORKER_RPC_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/wire.h"
#include "worker/model.h"
#include "worker/request_limits.h"
#include "worker/worker_service.h"

namespace onlineps::worker {

// Checks a msgpack body without decoding it: nesting (kMalformed past 64 levels), and
// strings and value counts against `limits` (ScanBody; kTooLarge). Sets `*session` to
// its top-level "session" string if it has one (a view into `data`), for routing.
Status CheckBody(const void* data, size_t size, const RequestLimits& limits,
                 std::string_view* session = nullptr);
// CheckBody, then parses the body; an empty frame is an empty map. Errors: CheckBody's;
// kMalformed.
StatusOr<nlohmann::json> DecodeBody(const void* data, size_t size,
                                    const RequestLimits& limits = RequestLimits());
std::string EncodeBody(const nlohmann::json& body);
// An upper bound on the encoded body of any reply `service` may send under its limits:
// an infer of max_batch examples, a context_get of the largest context, model_info.
size_t MaxReplyBytes(WorkerService& service);

// "session": optional string (default ""), at most `max_bytes`.
StatusOr<std::string> SessionOf(const nlohmann::json& body, size_t max_bytes);
// The examples of an infer (learn: `need_labels`) body, by the rule of worker/examples.h
// (CheckExamples, then --max-tokens), with labels resolved against `labels`. Everything
// is checked before anything is copied; texts are moved out of `body`. Errors:
// kInvalidArgument naming the field, kTooLarge naming the limit.
StatusOr<std::vector<Example>> ExamplesOf(nlohmann::json& body,
                                          const std::vector<std::string>& labels, bool need_labels,
                                          const RequestLimits& limits);

nlohmann::json ToJson(const InferReply& r);
nlohmann::json ToJson(const LearnReply& r);
nlohmann::json ToJson(const WorkerStats& s);
// The model_info reply (docs/protocol.md): base, every parameter with shape and whether
// it learns, the floats of each part, and the bytes a learn's dense push carries.
nlohmann::json ModelInfoJson(const Model& model);

// Runs one worker op on `service`: decodes `body` (taking its texts), calls it, encodes
// the reply body. Errors are the service's, kInvalidArgument naming the bad field, or
// kTooLarge naming the limit of service->limits().
StatusOr<nlohmann::json> HandleWorkerOp(WorkerService* service, Op op, nlohmann::json& body);

// A learn body, checked and parsed as HandleWorkerOp does (texts are moved out of it).
struct LearnRequest {
  std::string session;
  std::optional<uint64_t> context_revision;  // the body's "context_revision", if any
  std::vector<Example> batch;
};
StatusOr<LearnRequest> LearnRequestOf(WorkerService* service, nlohmann::json& body);

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_WORKER_RPC_H_
