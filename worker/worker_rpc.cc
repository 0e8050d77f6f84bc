#include "worker/worker_rpc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/json_depth.h"
#include "worker/body_scan.h"
#include "worker/examples.h"
#include "worker/msgpack_json.h"

namespace onlineps::worker {
namespace {

using nlohmann::json;

// Features as msgpack bin of little-endian float32: a memcpy instead of one DOM node
// per value (decoding 25,000 numbers as an array costs more than a model's forward).
StatusOr<std::vector<float>> FloatsOfBinary(const json& v, const std::string& where, size_t max) {
  const auto& bytes = v.get_binary();
  if (bytes.size() % sizeof(float) != 0) {
    return InvalidArgument(where + " binary is " + std::to_string(bytes.size()) +
                           " bytes, not a whole number of float32 values");
  }
  if (bytes.size() / sizeof(float) > max) {
    return InvalidArgument(where + " has " + std::to_string(bytes.size() / sizeof(float)) +
                           " values; at most " + std::to_string(max));
  }
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]))
      return InvalidArgument(where + "[" + std::to_string(i) + "] is NaN or Inf");
  }
  return out;
}

StatusOr<std::vector<float>> FloatsOf(const json& v, const std::string& where, size_t max) {
  if (v.is_binary()) return FloatsOfBinary(v, where, max);
  if (!v.is_array())
    return InvalidArgument(where + " must be an array of numbers or float32 binary");
  if (v.size() > max) {
    return InvalidArgument(where + " has " + std::to_string(v.size()) + " values; at most " +
                           std::to_string(max));
  }
  std::vector<float> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number())
      return InvalidArgument(where + "[" + std::to_string(i) + "] is not a number");
    // Checked as the float the model reads: 3.5e38 is a finite double but Inf as float32.
    const float f = static_cast<float>(v[i].get<double>());
    if (!std::isfinite(f)) {
      return InvalidArgument(where + "[" + std::to_string(i) +
                             "] is NaN or Inf (or beyond float32's range)");
    }
    out.push_back(f);
  }
  return out;
}

StatusOr<int64_t> LabelOf(const json& v, const std::string& where,
                          const std::vector<std::string>& labels) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    for (size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] == s) return static_cast<int64_t>(i);
    }
    std::string known;
    for (const auto& l : labels) known += (known.empty() ? "" : ", ") + l;
    return InvalidArgument(where + " '" + s + "' is not a label of this model (" + known + ")");
  }
  if (const std::optional<int64_t> i = LabelIndex(v);
      i && *i < static_cast<int64_t>(labels.size())) {
    return *i;
  }
  return InvalidArgument(where + " must be a label name or an index below " +
                         std::to_string(labels.size()));
}

// Feature values of a context (the context store keeps at most its own max_features; the
// body's number count bounds what decoding may allocate before that).
constexpr size_t kMaxContextFeatures = 1 << 20;
// Deepest request body: the worker's bodies nest 4 levels; this leaves room and keeps
// the recursive msgpack parser far from the end of the stack.
constexpr size_t kMaxBodyDepth = 64;

// One example CheckExamples accepted, decoded: its text moved out of `e`, its features
// as floats, its label resolved against `labels`.
StatusOr<Example> ExampleOf(json& e, const std::string& where,
                            const std::vector<std::string>& labels, bool need_labels) {
  Example ex;
  if (const auto text = e.find("text"); text != e.end()) {
    ex.text = std::move(text->get_ref<std::string&>());
  }
  if (const auto features = e.find("features"); features != e.end()) {
    // CheckExamples has bounded the count.
    ONLINEPS_ASSIGN_OR_RETURN(ex.features, FloatsOf(*features, where + ".features", SIZE_MAX));
  }
  if (need_labels) {
    ONLINEPS_ASSIGN_OR_RETURN(ex.label, LabelOf(e["label"], where + ".label", labels));
  }
  return ex;
}

StatusOr<std::string> RequiredSession(const json& body, size_t max_bytes) {
  ONLINEPS_ASSIGN_OR_RETURN(std::string s, SessionOf(body, max_bytes));
  if (s.empty()) return InvalidArgument("\"session\" is required for context ops");
  return s;
}

json ContextJson(const std::optional<SessionContext>& c) {
  json out = {{"found", c.has_value()}};
  out["items"] = json::array();
  out["features"] = json::array();
  if (c) {
    for (const auto& item : c->items) out["items"].push_back(item);
    out["features"] = c->features;
  }
  return out;
}

StatusOr<json> ContextOp(WorkerService* service, Op op, const json& body) {
  const size_t max_id = 256;
  ONLINEPS_ASSIGN_OR_RETURN(std::string session, RequiredSession(body, max_id));
  ContextStore& store = service->context();
  switch (op) {
    case Op::kContextSet: {
      std::vector<std::string> items;
      const auto it = body.find("items");
      if (it != body.end()) {
        if (!it->is_array()) return InvalidArgument("\"items\" must be an array of strings");
        for (const auto& s : *it) {
          if (!s.is_string()) return InvalidArgument("\"items\" must be an array of strings");
          items.push_back(s.get<std::string>());
        }
      }
      if (body.contains("text")) {
        if (!body["text"].is_string()) return InvalidArgument("\"text\" must be a string");
        items.push_back(body["text"].get<std::string>());
      }
      std::vector<float> features;
      if (body.contains("features")) {
        ONLINEPS_ASSIGN_OR_RETURN(features,
                                  FloatsOf(body["features"], "features", kMaxContextFeatures));
      }
      uint64_t revision = 0;
      if (const auto r = body.find("revision"); r != body.end() && !r->is_null()) {
        if (!r->is_number_unsigned()) {
          return InvalidArgument("\"revision\" must be a non-negative integer");
        }
        revision = r->get<uint64_t>();
      }
      ONLINEPS_RETURN_IF_ERROR(store.Set(session, std::move(items), std::move(features), revision));
      return ContextJson(store.Get(session));
    }
    case Op::kContextAppend: {
      const auto it = body.find("text");
      if (it == body.end() || !it->is_string())
        return InvalidArgument("\"text\" (a string) is required");
      ONLINEPS_RETURN_IF_ERROR(store.Append(session, it->get<std::string>()));
      return ContextJson(store.Get(session));
    }
    case Op::kContextClear:
      return json{{"cleared", store.Clear(session)}};
    default:
      return ContextJson(store.Get(session));
  }
}

}  // namespace

Status CheckBody(const void* data, size_t size, const RequestLimits& limits,
                 std::string_view* session) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (MsgpackNestsDeeperThan(p, size, kMaxBodyDepth)) {
    return Malformed("body nests deeper than " + std::to_string(kMaxBodyDepth) + " levels");
  }
  return ScanBody(p, size, limits, session);
}

StatusOr<json> DecodeBody(const void* data, size_t size, const RequestLimits& limits) {
  if (size == 0) return json::object();
  ONLINEPS_RETURN_IF_ERROR(CheckBody(data, size, limits));
  auto body = MsgpackToJson(static_cast<const uint8_t*>(data), size, kMaxBodyDepth);
  if (!body.ok()) return Malformed("body is not valid msgpack: " + body.status().message());
  if (!body->is_object()) return Malformed("body must be a msgpack map");
  return body;
}

size_t MaxReplyBytes(WorkerService& service) {
  constexpr size_t kNumber = 9;  // msgpack: a float64 or uint64 with its tag
  const RequestLimits& l = service.limits();
  const ContextStoreOptions& c = service.context().options();
  const auto& labels = service.model().labels();
  size_t longest = 0;
  for (const std::string& label : labels) longest = std::max(longest, label.size());
  // Per prediction its scores, label and index; the versions map and the rest are below
  // 64 KiB (model_info and worker_stats too, for the built-in models).
  const size_t infer = l.max_batch * (labels.size() * kNumber + longest + 64);
  const size_t context = c.max_features * kNumber + c.max_bytes + c.max_items * 8;
  return std::max(infer, context) + (size_t{64} << 10);
}

std::string EncodeBody(const json& body) {
  std::vector<uint8_t> bytes = json::to_msgpack(body);
  return std::string(bytes.begin(), bytes.end());
}

StatusOr<std::string> SessionOf(const json& body, size_t max_bytes) {
  const auto it = body.find("session");
  if (it == body.end() || it->is_null()) return std::string();
  if (!it->is_string()) return InvalidArgument("\"session\" must be a string");
  std::string s = it->get<std::string>();
  if (s.size() > max_bytes) {
    return InvalidArgument("\"session\" is " + std::to_string(s.size()) + " bytes; at most " +
                           std::to_string(max_bytes));
  }
  return s;
}

StatusOr<std::vector<Example>> ExamplesOf(json& body, const std::vector<std::string>& labels,
                                          bool need_labels, const RequestLimits& limits) {
  ExampleRule rule;
  rule.labelled = need_labels;
  rule.limits = limits;
  size_t words = 0;
  ONLINEPS_RETURN_IF_ERROR(CheckExamples(body, rule, &words));
  ONLINEPS_RETURN_IF_ERROR(CheckTokens(words, limits));
  const bool batch = body.contains("examples");
  std::vector<json*> examples = ExamplesIn(body);
  std::vector<Example> out;
  out.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const std::string where = batch ? "examples[" + std::to_string(i) + "]" : rule.top_level;
    ONLINEPS_ASSIGN_OR_RETURN(Example e, ExampleOf(*examples[i], where, labels, need_labels));
    out.push_back(std::move(e));
  }
  return out;
}

json ToJson(const InferReply& r) {
  json preds = json::array();
  for (const Prediction& p : r.predictions) {
    preds.push_back({{"label", p.label}, {"index", p.index}, {"scores", p.scores}});
  }
  return {{"predictions", preds},
          {"version", r.version},
          {"versions", r.versions},
          {"params_age_ms", r.params_age_ms}};
}

json ToJson(const LearnReply& r) {
  return {{"loss", r.loss},
          {"examples", r.examples},
          {"outcome", std::string(LearnOutcomeName(r.outcome))},
          {"version", r.version},
          {"versions", r.versions},
          {"tau", r.tau},
          {"sparse_rows_pushed", r.sparse_rows_pushed},
          {"dense_pushed", r.dense_pushed}};
}

json ToJson(const WorkerStats& s) {
  return {{"infer_requests", s.infer_requests},
          {"infer_examples", s.infer_examples},
          {"infer_passes", s.infer_passes},
          {"learn_requests", s.learn_requests},
          {"learn_examples", s.learn_examples},
          {"pushes", s.pushes},
          {"push_bytes", s.push_bytes},
          {"push_errors", s.push_errors},
          {"rejected_nonfinite", s.rejected_nonfinite},
          {"max_tau", s.max_tau},
          {"inflight_pushes", s.inflight_pushes},
          {"held",
           {{"pushes", s.held.pushes},
            {"bytes", s.held.bytes},
            {"learns", s.held.calls},
            {"retries", s.held.retries},
            {"resolved", s.held.resolved},
            {"lost_learns", s.held.dropped_calls}}},
          {"group_rounds", s.group_rounds},
          {"group_active", s.group_active},
          {"cache",
           {{"dense_hits", s.cache.dense_hits},
            {"dense_pulls", s.cache.dense_pulls},
            {"refresher_pulls", s.cache.refresher_pulls},
            {"sparse_hits", s.cache.sparse_hits},
            {"sparse_misses", s.cache.sparse_misses},
            {"sparse_pulls", s.cache.sparse_pulls},
            {"sparse_evictions", s.cache.sparse_evictions},
            {"sparse_rows", s.cache.sparse_rows},
            {"notices", s.cache.notices},
            {"watch_errors", s.cache.watch_errors},
            {"rows_noticed", s.cache.rows_noticed},
            {"shards_noticing", s.cache.shards_noticing}}},
          {"context",
           {{"sessions", s.context.sessions},
            {"evicted_lru", s.context.evicted_lru},
            {"expired", s.context.expired},
            {"items_dropped", s.context.items_dropped}}}};
}

// Random per process: lets the bridge tell a restarted worker (whose session contexts
// are gone) from one that kept running at the same address.
static const std::string& InstanceId() {
  static const std::string id = [] {
    std::random_device rd;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
    return std::string(buf);
  }();
  return id;
}

json ModelInfoJson(const Model& model) {
  json params = json::array();
  uint64_t trainable_floats = 0, frozen_floats = 0, dense_push_bytes = 0;
  for (const ParamInfo& p : model.params()) {
    const bool dense = p.kind == ParamKind::kDense;
    json entry = {{"name", p.name},  // the PS table
                  {"table", p.name},
                  {"trainable", true},
                  {"kind", dense ? "dense" : "sparse"},
                  {"shape", p.shape}};
    if (dense) {
      entry["push_bytes"] = p.size() * sizeof(float);
      dense_push_bytes += p.size() * sizeof(float);
      trainable_floats += p.size();
    } else {
      entry["push_bytes_per_row"] = sizeof(uint64_t) + p.size() * sizeof(float);
    }
    params.push_back(std::move(entry));
  }
  for (const FrozenParam& p : model.frozen()) {
    params.push_back(
        {{"name", p.name}, {"trainable", false}, {"kind", "frozen"}, {"shape", p.shape}});
    frozen_floats += p.size();
  }
  return {{"base", model.base()},
          {"params", std::move(params)},
          {"trainable_floats", trainable_floats},
          {"frozen_floats", frozen_floats},
          {"dense_push_bytes", dense_push_bytes}};
}

namespace {
constexpr size_t kMaxSession = 256;

// The bridge names the revision of the session's context it last sent this worker.
StatusOr<std::optional<uint64_t>> ContextRevisionOf(const json& body, const std::string& session) {
  const auto it = body.find("context_revision");
  if (it == body.end() || it->is_null()) return std::optional<uint64_t>();
  if (!it->is_number_unsigned() || it->get<uint64_t>() == 0) {
    return InvalidArgument("\"context_revision\" must be a positive integer");
  }
  if (session.empty()) return InvalidArgument("\"context_revision\" needs a \"session\"");
  return std::optional<uint64_t>(it->get<uint64_t>());
}
}  // namespace

StatusOr<LearnRequest> LearnRequestOf(WorkerService* service, json& body) {
  LearnRequest req;
  ONLINEPS_ASSIGN_OR_RETURN(req.session, SessionOf(body, kMaxSession));
  ONLINEPS_ASSIGN_OR_RETURN(req.context_revision, ContextRevisionOf(body, req.session));
  ONLINEPS_ASSIGN_OR_RETURN(req.batch, ExamplesOf(body, service->model().labels(),
                                                  /*need_labels=*/true, service->limits()));
  return req;
}

StatusOr<json> HandleWorkerOp(WorkerService* service, Op op, json& body) {
  const Model& model = service->model();
  switch (op) {
    case Op::kLearn: {
      ONLINEPS_ASSIGN_OR_RETURN(LearnRequest req, LearnRequestOf(service, body));
      ONLINEPS_ASSIGN_OR_RETURN(LearnReply r,
                                service->Learn(req.session, req.batch, req.context_revision));
      return ToJson(r);
    }
    case Op::kInfer: {
      ONLINEPS_ASSIGN_OR_RETURN(std::string session, SessionOf(body, kMaxSession));
      ONLINEPS_ASSIGN_OR_RETURN(std::optional<uint64_t> revision, ContextRevisionOf(body, session));
      ONLINEPS_ASSIGN_OR_RETURN(
          auto batch, ExamplesOf(body, model.labels(), /*need_labels=*/false, service->limits()));
      ONLINEPS_ASSIGN_OR_RETURN(InferReply r, service->Infer(session, batch, revision));
      return ToJson(r);
    }
    case Op::kContextSet:
    case Op::kContextAppend:
    case Op::kContextClear:
    case Op::kContextGet:
      return ContextOp(service, op, body);
    case Op::kWorkerStats: {
      json s = ToJson(service->stats());
      s["instance"] = InstanceId();
      s["labels"] = model.labels();
      s["device"] = model.device();
      json params = json::array();
      for (const ParamInfo& p : model.params()) {
        params.push_back({{"table", p.name},
                          {"kind", p.kind == ParamKind::kDense ? "dense" : "sparse"},
                          {"shape", p.shape}});
      }
      s["params"] = params;
      s["model"] = ModelInfoJson(model);
      return s;
    }
    case Op::kModelInfo: {
      json info = ModelInfoJson(model);
      info["labels"] = model.labels();
      info["device"] = model.device();
      const auto verify = body.find("verify");
      if (verify != body.end() && !verify->is_boolean()) {
        return InvalidArgument("verify must be true or false");
      }
      if (verify != body.end() && verify->get<bool>()) {
        ONLINEPS_ASSIGN_OR_RETURN(std::string now, model.BaseNow());
        info["base_now"] = now;
        info["frozen_intact"] = now == model.base();
      }
      return info;
    }
    default:
      return UnknownOp(std::string(OpName(op)) + " is not a worker op (is this a PS endpoint?)");
  }
}

}  // namespace onlineps::worker
