#include "mcp_bridge/tools.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/await.h"
#include "mcp_bridge/tool_schemas.h"
#include "worker/examples.h"
#include "worker/request_limits.h"

namespace onlineps::bridge {

using nlohmann::json;

namespace {

ToolResult Error(std::string message) {
  ToolResult r;
  r.is_error = true;
  r.error = std::move(message);
  r.summary = "error";
  return r;
}

// Names the first argument the tool's schema does not declare.
std::string CheckKeys(const json& args, const std::set<std::string>& allowed,
                      const std::string& tool) {
  for (const auto& [k, v] : args.items()) {
    if (allowed.count(k)) continue;
    std::string names;
    for (const auto& a : allowed) names += (names.empty() ? "" : ", ") + a;
    return "unknown argument '" + k + "': " + tool + " takes " + (names.empty() ? "none" : names);
  }
  return "";
}

// The limits the bridge checks for its workers, with the worker's own messages.
worker::RequestLimits LimitsOf(const ToolsOptions& o) {
  worker::RequestLimits l;
  l.max_batch = o.max_examples;
  l.max_text_bytes = o.max_text_bytes;
  l.max_tokens = o.max_tokens;
  l.max_features = o.max_features;
  return l;
}

// A context's features (the context store bounds their count).
std::string CheckFeatures(const json& f, const std::string& where) {
  if (!f.is_array()) return where + " must be an array of numbers";
  return worker::NonFiniteFeature(f, where);
}

// The examples of an infer or learn call, by the rule of worker/examples.h.
StatusOr<json> ExamplesOf(const json& args, bool labelled, const worker::RequestLimits& limits) {
  worker::ExampleRule rule;
  rule.labelled = labelled;
  rule.limits = limits;
  rule.batch_flag = "--max-examples";
  rule.top_level = "";
  ONLINEPS_RETURN_IF_ERROR(worker::CheckExamples(args, rule));
  return worker::ExampleArray(args);
}

// The words of text in each worker call the examples are sent in (`chunk` examples a
// call), against --max-tokens, before any call is made: a learn is refused whole rather
// than after some of its chunks were learned.
Status CheckWords(const json& examples, size_t chunk, const worker::RequestLimits& limits) {
  for (size_t begin = 0; begin < examples.size(); begin += chunk) {
    const size_t end = std::min(examples.size(), begin + chunk);
    size_t words = 0;
    for (size_t i = begin; i < end; ++i) {
      const auto text = examples[i].find("text");
      if (text != examples[i].end())
        words += worker::CountWords(text->get_ref<const std::string&>());
    }
    const bool whole = begin == 0 && end == examples.size();
    ONLINEPS_RETURN_IF_ERROR(
        worker::CheckTokens(words, limits,
                            whole ? "request"
                                  : "worker call of examples " + std::to_string(begin) + ".." +
                                        std::to_string(end - 1) + " (--learn-chunk)"));
  }
  return Status::Ok();
}

std::string WorkerError(const Status& s) { return s.ToString(); }

// Fields of a worker reply, read without trusting their types.
double Number(const json& j, const char* key, double fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}
int64_t Integer(const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? static_cast<int64_t>(it->get<double>()) : fallback;
}
std::string Text(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}
const json& Array(const json& j, const char* key) {
  static const json kEmpty = json::array();
  auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : kEmpty;
}

// The worker's per-table versions, keeping only well-formed entries (table -> integers).
json TableVersions(const json& reply) {
  json out = json::object();
  auto it = reply.find("versions");
  if (it == reply.end() || !it->is_object()) return out;
  for (const auto& [table, v] : it->items()) {
    if (!v.is_array()) continue;
    json shards = json::array();
    for (const json& x : v) shards.push_back(x.is_number_unsigned() ? x.get<uint64_t>() : 0);
    out[table] = std::move(shards);
  }
  return out;
}

json ContextJson(const Context& c, bool found) {
  return {{"found", found}, {"items", c.items}, {"features", c.features}};
}

// Builds a result behind the exception barrier of an asynchronous continuation (which
// runs on a worker client's thread, where nothing may escape).
template <typename Make>
ToolResult Guarded(const Make& make) {
  try {
    return make();
  } catch (const std::exception& e) {
    return Error(std::string("internal error: ") + e.what());
  } catch (...) {
    return Error("internal error");
  }
}

ToolResult InferResult(const StatusOr<Routed>& r, WorkerPool* pool) {
  if (!r.ok()) return Error("infer failed: " + WorkerError(r.status()));
  auto labels_ptr = pool->Labels(r->worker);
  static const std::vector<std::string> kNone;
  const std::vector<std::string>& labels = labels_ptr ? *labels_ptr : kNone;
  json predictions = json::array();
  for (const json& p : Array(r->reply, "predictions")) {
    if (!p.is_object()) continue;
    json scores = json::object();
    const json& s = Array(p, "scores");
    for (size_t i = 0; i < s.size(); ++i) {
      scores[i < labels.size() ? labels[i] : std::to_string(i)] = s[i];
    }
    predictions.push_back(
        {{"label", Text(p, "label", "")}, {"index", Integer(p, "index", 0)}, {"scores", scores}});
  }
  if (predictions.empty()) return Error("infer failed: the worker returned no prediction");
  ToolResult out;
  out.worker = r->worker;
  out.version = Integer(r->reply, "version", 0);
  out.structured = {{"label", predictions[0]["label"]},
                    {"scores", predictions[0]["scores"]},
                    {"predictions", predictions},
                    {"model_version", out.version},
                    {"table_versions", TableVersions(r->reply)},
                    {"params_age_ms", Number(r->reply, "params_age_ms", 0.0)},
                    {"worker", r->worker}};
  out.summary = predictions[0]["label"].get<std::string>();
  return out;
}

}  // namespace

std::string CheckSessionName(const std::string& s) {
  if (s.empty()) return "session must not be empty";
  if (s.size() > 128) return "session is longer than 128 characters";
  for (unsigned char ch : s) {
    if (!std::isalnum(ch) && ch != '.' && ch != '_' && ch != ':' && ch != '@' && ch != '-') {
      return "session may hold only letters, digits and . _ : @ -";
    }
  }
  return "";
}

Tools::Tools(ToolsOptions options, Backend* backend, ContextStore* contexts, WorkerPool* pool,
             Router* router)
    : options_(options),
      backend_(backend),
      contexts_(contexts),
      pool_(pool),
      router_(router),
      tau_hist_(1025, 0) {
  // Each tool once: its declaration, its handler, and whether it reaches a worker (and
  // so runs in the session's order) or the bridge answers it alone. The arguments it
  // takes come from its inputSchema.
  // Infer and learn, the calls that carry the traffic, have only an asynchronous form.
  const Entry table[] = {
      {InferTool(), nullptr, &Tools::Infer, {}, true},
      {LearnTool(), nullptr, &Tools::Learn, {}, true},
      {SetContextTool(), &Tools::SetContext, nullptr, {}, true},
      {AppendContextTool(), &Tools::AppendContext, nullptr, {}, true},
      {ClearContextTool(), &Tools::ClearContext, nullptr, {}, true},
      {GetContextTool(), &Tools::GetContext, nullptr, {}, false},
      {ModelInfoTool(), &Tools::ModelInfo, nullptr, {}, false},
  };
  list_ = json::array();
  for (const Entry& t : table) {
    const json& declaration = t.declaration;
    Entry e = t;
    const json properties = declaration["inputSchema"].value("properties", json::object());
    for (const auto& [name, schema] : properties.items()) e.arguments.insert(name);
    entries_.push_back(std::move(e));
    list_.push_back(declaration);
  }
}

const Tools::Entry* Tools::Find(const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.declaration["name"] == name) return &e;
  }
  return nullptr;
}

bool Tools::Has(const std::string& name) const { return Find(name) != nullptr; }

bool Tools::Ordered(const std::string& name) const {
  const Entry* e = Find(name);
  return e == nullptr || e->ordered;
}

bool Tools::SendsProgress(const std::string& name, const json& arguments) const {
  if (name != "learn") return false;
  auto it = arguments.find("examples");
  return it != arguments.end() && it->is_array() && it->size() > 1;
}

bool Tools::Blocks(const std::string& name) const {
  const Entry* e = Find(name);
  return e != nullptr && e->ordered && e->run_async == nullptr;
}

ToolResult Tools::Call(const ToolCall& c) {
  return Await<ToolResult>([&](ToolDone done) { CallAsync(c, std::move(done)); });
}

void Tools::CallAsync(const ToolCall& c, ToolDone done) {
  if (!c.arguments.is_object()) return done(Error("arguments must be an object"));
  const Entry* e = Find(c.name);
  if (!e) return done(Error("unknown tool '" + c.name + "'"));
  if (auto m = CheckKeys(c.arguments, e->arguments, c.name); !m.empty()) return done(Error(m));
  if (e->run_async) return (this->*e->run_async)(c, std::move(done));
  done((this->*e->run)(c));
}

void Tools::Infer(const ToolCall& c, ToolDone done) {
  auto examples = ExamplesOf(c.arguments, false, LimitsOf(options_));
  if (!examples.ok()) return done(Error(examples.status().message()));
  // An infer is one worker call.
  if (Status st = CheckWords(*examples, examples->size(), LimitsOf(options_)); !st.ok()) {
    return done(Error(st.message()));
  }
  backend_->CallAsync(c.session, Op::kInfer, {{"examples", std::move(*examples)}},
                      [this, done = std::move(done)](StatusOr<Routed> r) {
                        done(Guarded([&] { return InferResult(r, pool_); }));
                      });
}

void Tools::NoteLearn(int64_t version, int64_t tau) {
  MutexLock lock(&mu_);
  max_version_ = std::max(max_version_, version);
  if (tau < 0) return;
  const uint64_t t = static_cast<uint64_t>(tau);
  ++tau_hist_[std::min<uint64_t>(t, tau_hist_.size() - 1)];
  ++tau_count_;
  tau_sum_ += t;
  tau_max_ = std::max(tau_max_, t);
}

// One learn call in progress: what its chunks have given so far.
struct Tools::LearnRun {
  json examples;
  size_t total = 0, chunk = 1, done = 0, chunks = 0;
  double loss_sum = 0;
  int64_t version = 0, tau = 0;
  std::set<std::string> outcomes;
  std::string worker, session;
  std::function<void(double, double, const std::string&)> progress;
  const std::atomic<bool>* cancelled = nullptr;
  ToolDone finish;
};

void Tools::Learn(const ToolCall& c, ToolDone done) {
  auto examples = ExamplesOf(c.arguments, true, LimitsOf(options_));
  if (!examples.ok()) return done(Error(examples.status().message()));
  const size_t chunk = std::max<size_t>(1, options_.learn_chunk);
  if (Status st = CheckWords(*examples, chunk, LimitsOf(options_)); !st.ok()) {
    return done(Error(st.message()));
  }
  auto run = std::make_shared<LearnRun>();
  run->total = examples->size();
  run->examples = std::move(*examples);
  run->chunk = chunk;
  run->session = c.session;
  run->progress = c.progress;
  run->cancelled = c.cancelled;
  run->finish = std::move(done);
  LearnNext(std::move(run));
}

// Sends the next chunk, or ends the call; each chunk's reply sends the one after.
void Tools::LearnNext(std::shared_ptr<LearnRun> run) {
  LearnRun& l = *run;
  if (l.done == l.total) {
    ToolResult out;
    out.worker = l.worker;
    out.version = l.version;
    out.tau = l.tau;
    const std::string outcome = l.outcomes.size() == 1 ? *l.outcomes.begin() : "mixed";
    out.structured = {{"examples", l.total},
                      {"applied_examples", outcome == "applied" ? l.total : 0},
                      {"loss", l.loss_sum / static_cast<double>(l.total)},
                      {"outcome", outcome},
                      {"model_version", l.version},
                      {"staleness", l.tau},
                      {"chunks", l.chunks},
                      {"worker", l.worker}};
    out.summary = outcome;
    return l.finish(std::move(out));
  }
  if (l.cancelled && l.cancelled->load()) {
    return l.finish(Error("cancelled after " + std::to_string(l.done) + " of " +
                          std::to_string(l.total) + " examples (those were learned)"));
  }
  const size_t n = std::min(l.chunk, l.total - l.done);
  json part(l.examples.begin() + static_cast<ptrdiff_t>(l.done),
            l.examples.begin() + static_cast<ptrdiff_t>(l.done + n));
  backend_->CallAsync(
      l.session, Op::kLearn, {{"examples", std::move(part)}}, [this, run, n](StatusOr<Routed> r) {
        LearnRun& l = *run;
        ToolResult failed = Guarded([&] {
          if (r.ok()) return ToolResult();
          const bool unknown = r.status().code() == StatusCode::kDeadlineExceeded;
          // The worker answered DEADLINE_EXCEEDED itself when its push to the PS got no
          // answer: the outcome is as unknown, for another reason.
          const bool silent =
              r.status().message().find(worker::kNoWorkerAnswer) != std::string::npos;
          // Some shard applied its part while another push failed: the worker named the
          // tables that took theirs.
          const bool partly =
              r.status().message().find(worker::kPartlyApplied) != std::string::npos;
          std::string m = "learn failed on examples " + std::to_string(l.done) + ".." +
                          std::to_string(l.done + n - 1) + ": " + WorkerError(r.status());
          m += partly     ? ". They were partly applied (to the tables named): sending them "
                            "again would apply that part twice."
               : !unknown ? ". They were not applied."
               : silent   ? ". Their outcome is unknown: the worker did not answer, so they "
                            "may or may not have been applied."
                          : ". Their outcome is unknown: the worker's push to the parameter "
                            "servers got no answer in time, so they may or may not have been "
                            "applied.";
          if (l.done > 0) {
            m += " Examples 0.." + std::to_string(l.done - 1) + " were learned.";
          }
          ToolResult e = Error(m);
          e.worker = l.worker;
          return e;
        });
        if (failed.is_error) return l.finish(std::move(failed));
        l.worker = r->worker;
        l.loss_sum += Number(r->reply, "loss", 0.0) * static_cast<double>(n);
        l.version = std::max(l.version, Integer(r->reply, "version", 0));
        l.tau = std::max(l.tau, Integer(r->reply, "tau", 0));
        l.outcomes.insert(Text(r->reply, "outcome", "applied"));
        NoteLearn(Integer(r->reply, "version", 0), Integer(r->reply, "tau", 0));
        l.done += n;
        ++l.chunks;
        if (l.progress) {
          l.progress(
              static_cast<double>(l.done), static_cast<double>(l.total),
              "learned " + std::to_string(l.done) + "/" + std::to_string(l.total) + " examples");
        }
        LearnNext(run);
      });
}

ToolResult Tools::SetContext(const ToolCall& c) { return StoreContext(c, false); }

ToolResult Tools::AppendContext(const ToolCall& c) { return StoreContext(c, true); }

ToolResult Tools::StoreContext(const ToolCall& c, bool append) {
  const std::string tool = append ? "append_context" : "set_context";
  if (c.session.empty()) {
    return Error(tool + " needs a session: pass 'session', or call it on a stateful MCP session");
  }
  const json& a = c.arguments;
  if (a.contains("text") && !a["text"].is_string()) return Error("'text' must be a string");
  StatusOr<Context> ctx = Internal("unset");
  size_t dropped = 0;
  if (append) {
    if (!a.contains("text")) return Error("append_context needs 'text'");
    ctx = contexts_->Append(c.session, a["text"].get<std::string>(), &dropped);
  } else {
    std::vector<std::string> items;
    if (a.contains("items")) {
      if (!a["items"].is_array()) return Error("'items' must be an array of strings");
      for (size_t i = 0; i < a["items"].size(); ++i) {
        if (!a["items"][i].is_string())
          return Error("items[" + std::to_string(i) + "] is not a string");
        items.push_back(a["items"][i].get<std::string>());
      }
    }
    if (a.contains("text")) items.push_back(a["text"].get<std::string>());
    std::vector<float> features;
    if (a.contains("features")) {
      if (auto m = CheckFeatures(a["features"], "features"); !m.empty()) return Error(m);
      features = a["features"].get<std::vector<float>>();
    }
    ctx = contexts_->Set(c.session, std::move(items), std::move(features));
  }
  if (!ctx.ok()) return Error(tool + " refused: " + ctx.status().message());
  ToolResult out;
  out.structured = ContextJson(*ctx, true);
  if (append) out.structured["dropped_items"] = dropped;
  if (Status s = backend_->SyncContext(c.session); !s.ok()) {
    if (s.code() == StatusCode::kInvalidArgument) {
      // The session's worker cannot hold this context (its limits are below the
      // bridge's): every infer and learn would fail, so the set must not look fine.
      return Error(tool + ": the bridge keeps the context, but " + s.message() +
                   ". Every infer and learn of this session fails until the context fits "
                   "(set_context with less, or clear_context)");
    }
    // Stored in the bridge (authoritative); the worker gets it with the next call.
    out.summary = "stored; worker copy pending: " + s.ToString();
  } else {
    out.summary = "stored";
  }
  return out;
}

ToolResult Tools::ClearContext(const ToolCall& c) {
  if (c.session.empty()) return Error("clear_context needs a session");
  ToolResult out;
  out.structured = {{"cleared", contexts_->Clear(c.session)}};
  (void)backend_->SyncContext(c.session);  // a failure is retried by the next call
  out.summary = out.structured["cleared"] ? "cleared" : "none";
  return out;
}

ToolResult Tools::GetContext(const ToolCall& c) {
  if (c.session.empty()) return Error("get_context needs a session");
  std::optional<Context> ctx = contexts_->Get(c.session);
  ToolResult out;
  out.structured = ctx ? ContextJson(*ctx, true) : ContextJson(Context(), false);
  out.summary = ctx ? "found" : "none";
  return out;
}

ToolResult Tools::ModelInfo(const ToolCall& c) {
  const RouterStats rs = router_->stats();
  json workers = json::array(), labels = json::array(), tables = json::array();
  json model = json::object();
  for (const WorkerInfo& w : pool_->Workers()) {
    auto load = rs.loads.find(w.endpoint);
    json entry = {{"endpoint", w.endpoint},
                  {"healthy", w.healthy},
                  {"sessions", load == rs.loads.end() ? 0 : load->second}};
    if (!w.last_error.empty()) entry["last_error"] = w.last_error;
    if (w.healthy && labels.empty()) {
      labels = w.stats.value("labels", json::array());
      tables = w.stats.value("params", json::array());
      model = w.stats.value("model", json::object());
    }
    if (w.stats.is_object()) {
      entry["max_tau"] = Integer(w.stats, "max_tau", 0);
      entry["learn_examples"] = Integer(w.stats, "learn_examples", 0);
      entry["device"] = Text(w.stats, "device", "");
    }
    workers.push_back(entry);
  }
  json staleness;
  int64_t version;
  {
    MutexLock lock(&mu_);
    auto quantile = [&](double q) REQUIRES(mu_) -> int64_t {
      if (tau_count_ == 0) return 0;
      const uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(tau_count_)));
      uint64_t seen = 0;
      for (size_t i = 0; i < tau_hist_.size(); ++i) {
        seen += tau_hist_[i];
        if (seen >= std::max<uint64_t>(rank, 1)) return static_cast<int64_t>(i);
      }
      return static_cast<int64_t>(tau_max_);
    };
    staleness = {{"learn_calls", tau_count_},
                 {"mean", tau_count_ ? static_cast<double>(tau_sum_) / tau_count_ : 0.0},
                 {"p50", quantile(0.5)},
                 {"p99", quantile(0.99)},
                 {"max", tau_max_}};
    version = max_version_;
  }
  ToolResult out;
  out.structured = {{"labels", labels},       {"tables", tables},   {"model_version", version},
                    {"staleness", staleness}, {"workers", workers}, {"sessions", rs.sessions},
                    {"model", model}};
  out.summary = std::to_string(workers.size()) + " workers";
  return out;
}

}  // namespace onlineps::bridge
