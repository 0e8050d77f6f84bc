#include "replay/trace_steps.h"

#include <algorithm>
#include <cmath>

#include "replay/rng.h"

namespace onlineps::replay {
namespace {

using nlohmann::json;

StatusOr<int64_t> LabelIndex(const json& l, const std::vector<std::string>& labels,
                             const std::string& where) {
  if (l.is_number_integer() && l.get<int64_t>() >= 0 &&
      static_cast<size_t>(l.get<int64_t>()) < labels.size()) {
    return l.get<int64_t>();
  }
  if (l.is_string()) {
    auto it = std::find(labels.begin(), labels.end(), l.get<std::string>());
    if (it != labels.end()) return static_cast<int64_t>(it - labels.begin());
  }
  std::string names;
  for (const std::string& s : labels) names += (names.empty() ? "" : ", ") + s;
  return InvalidArgument(where + ": label " + l.dump() + " is not one of [" + names + "]");
}

StatusOr<worker::Example> ExampleFromJson(const json& e, const std::vector<std::string>& labels,
                                          const std::string& where) {
  if (!e.is_object()) return InvalidArgument(where + " is not an object");
  worker::Example out;
  if (auto t = e.find("text"); t != e.end()) {
    if (!t->is_string()) return InvalidArgument(where + ".text is not a string");
    out.text = t->get<std::string>();
  }
  if (auto f = e.find("features"); f != e.end()) {
    if (!f->is_array()) return InvalidArgument(where + ".features is not an array");
    for (const json& v : *f) {
      if (!v.is_number()) return InvalidArgument(where + ".features holds a non-number");
      out.features.push_back(v.get<float>());
    }
  }
  if (!e.contains("label")) return InvalidArgument(where + " has no label");
  ONLINEPS_ASSIGN_OR_RETURN(out.label, LabelIndex(e["label"], labels, where));
  return out;
}

// The examples of a learn: {"examples": [...]} or one example at top level.
StatusOr<std::vector<worker::Example>> LearnExamples(const json& args,
                                                     const std::vector<std::string>& labels,
                                                     const std::string& where) {
  std::vector<worker::Example> out;
  if (!args.is_object()) return InvalidArgument(where + ": arguments are not an object");
  if (auto ex = args.find("examples"); ex != args.end()) {
    if (!ex->is_array()) return InvalidArgument(where + ": 'examples' is not an array");
    for (size_t i = 0; i < ex->size(); ++i) {
      ONLINEPS_ASSIGN_OR_RETURN(
          worker::Example e,
          ExampleFromJson((*ex)[i], labels, where + " examples[" + std::to_string(i) + "]"));
      out.push_back(std::move(e));
    }
    return out;
  }
  ONLINEPS_ASSIGN_OR_RETURN(worker::Example e, ExampleFromJson(args, labels, where));
  out.push_back(std::move(e));
  return out;
}

std::vector<std::string> HeaderLabels(const TraceHeader& h) {
  std::vector<std::string> labels;
  if (h.model.is_object() && h.model.contains("labels") && h.model["labels"].is_array()) {
    for (const json& l : h.model["labels"]) {
      if (l.is_string()) labels.push_back(l.get<std::string>());
    }
  }
  return labels;
}

}  // namespace

StatusOr<TraceSteps> LoadTraceSteps(const std::string& path, std::vector<std::string> labels,
                                    uint64_t limit, uint32_t learn_chunk) {
  ONLINEPS_ASSIGN_OR_RETURN(auto reader, TraceReader::Open(path));
  TraceSteps out;
  out.header = reader->header();
  out.labels = HeaderLabels(out.header);
  if (out.labels.empty()) out.labels = std::move(labels);
  std::map<std::string, uint32_t> worker_index;
  learn_chunk = std::max<uint32_t>(learn_chunk, 1);
  TraceRecord r;
  size_t learns_kept = 0;  // learn records taken (each may make several steps)
  while (true) {
    ONLINEPS_ASSIGN_OR_RETURN(bool more, reader->Next(&r));
    if (!more) break;
    ++out.records;
    out.duration_ms = std::max(out.duration_ms, static_cast<double>(r.t_us) / 1000.0);
    const bool learn = (r.kind == RecordKind::kCall && r.tool == "learn" && !r.is_error) ||
                       (r.kind == RecordKind::kLearn && !r.arguments.is_null());
    if (!learn || (limit && learns_kept >= limit)) {
      ++out.skipped;
      continue;
    }
    ++learns_kept;
    const std::string where = path + ":" + std::to_string(reader->line());
    ONLINEPS_ASSIGN_OR_RETURN(auto examples, LearnExamples(r.arguments, out.labels, where));
    auto [it, added] = worker_index.emplace(r.worker, static_cast<uint32_t>(out.workers.size()));
    if (added) out.workers.push_back(r.worker);
    const double start_ms =
        static_cast<double>(r.t_us - std::max<int64_t>(r.latency_us, 0)) / 1000.0;
    // The bridge sends a learn to its worker in chunks (--learn-chunk): one push each.
    for (size_t at = 0; at < examples.size(); at += learn_chunk) {
      TraceStep s;
      s.record_seq = r.seq;
      s.t_ms = start_ms;
      s.worker = it->second;
      s.recorded_tau = r.tau;
      s.recorded_version = r.version;
      const size_t end = std::min(examples.size(), at + learn_chunk);
      s.examples.assign(examples.begin() + static_cast<ptrdiff_t>(at),
                        examples.begin() + static_cast<ptrdiff_t>(end));
      out.steps.push_back(std::move(s));
    }
  }
  out.truncated_tail = reader->truncated_tail();
  const bool versioned = std::all_of(out.steps.begin(), out.steps.end(),
                                     [](const TraceStep& s) { return s.recorded_version >= 0; });
  if (versioned) {
    std::stable_sort(out.steps.begin(), out.steps.end(),
                     [](const TraceStep& a, const TraceStep& b) {
                       return a.recorded_version < b.recorded_version;
                     });
  }
  return out;
}

StatusOr<std::vector<worker::Example>> TraceBatches::Batch(uint64_t batch) {
  if (steps_->steps.empty()) return FailedPrecondition("the trace has no learn records");
  return steps_->steps[batch % steps_->steps.size()].examples;
}

nlohmann::json TraceBatches::Ref(uint64_t batch) const {
  const size_t n = steps_->steps.size();
  const TraceStep& s = steps_->steps[n ? batch % n : 0];
  return {{"trace_seq", n ? s.record_seq : 0}, {"count", n ? s.examples.size() : 0}};
}

std::vector<Event> TraceEvents(const TraceSteps& steps, std::optional<Delay> override,
                               uint64_t seed, uint32_t loops) {
  const uint64_t n = steps.steps.size() * std::max<uint32_t>(loops, 1);
  // pull_at[k]: how many pushes are applied when step k pulls.
  std::vector<uint64_t> pull_at(n);
  Rng rng(seed);
  for (uint64_t k = 0; k < n; ++k) {
    const TraceStep& s = steps.steps[k % steps.steps.size()];
    double tau = override ? override->Sample(rng)
                          : static_cast<double>(std::max<int64_t>(s.recorded_tau, 0));
    const uint64_t t =
        std::min<uint64_t>(k, static_cast<uint64_t>(std::llround(std::max(tau, 0.0))));
    pull_at[k] = k - t;
  }
  std::vector<uint64_t> order(n);
  for (uint64_t k = 0; k < n; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](uint64_t a, uint64_t b) { return pull_at[a] < pull_at[b]; });
  std::vector<Event> events;
  events.reserve(2 * n);
  // Loop l replays the trace's times shifted by l spans, so timed mode keeps pacing
  // every loop (the same times again would run loops after the first unpaced).
  const size_t per_loop = steps.steps.size();
  double span = steps.duration_ms;
  for (const TraceStep& s : steps.steps) span = std::max(span, s.t_ms);
  auto time_of = [&](uint64_t k) {
    return steps.steps[k % per_loop].t_ms + static_cast<double>(k / per_loop) * span;
  };
  size_t next_pull = 0;
  for (uint64_t k = 0; k < n; ++k) {
    while (next_pull < n && pull_at[order[next_pull]] <= k) {
      const uint64_t j = order[next_pull++];
      const TraceStep& s = steps.steps[j % steps.steps.size()];
      Event e;
      e.kind = EventKind::kPull;
      e.worker = s.worker;
      e.batch = j;
      e.version = pull_at[j];
      e.t_ms = time_of(j);
      events.push_back(e);
    }
    const TraceStep& s = steps.steps[k % steps.steps.size()];
    Event e;
    e.kind = EventKind::kPush;
    e.worker = s.worker;
    e.batch = k;
    e.version = pull_at[k];
    e.expected_tau = k - pull_at[k];
    e.t_ms = time_of(k);
    events.push_back(e);
  }
  for (size_t i = 0; i < events.size(); ++i) events[i].seq = i;
  return events;
}

}  // namespace onlineps::replay
