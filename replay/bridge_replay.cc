#include "replay/bridge_replay.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <memory>
#include <set>
#include <thread>

#include "common/mcp_client.h"
#include "common/mutex.h"
#include "replay/report.h"

namespace onlineps::replay {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr double kBucketRatio = 1.02;

int64_t IntegerField(const json& result, const char* key) {
  if (!result.contains("structuredContent")) return -1;
  const json& s = result["structuredContent"];
  if (!s.is_object() || !s.contains(key) || !s[key].is_number_integer()) return -1;
  return s[key].get<int64_t>();
}

// The bridge's first text content, or the JSON of the result.
std::string ErrorText(const json& result) {
  if (result.contains("content") && result["content"].is_array()) {
    for (const auto& c : result["content"]) {
      if (c.is_object() && c.value("type", "") == "text") return c.value("text", "");
    }
  }
  return result.dump().substr(0, 300);
}

// Per-call gaps after pacing: offsets_ms[i] is when call i is due after the first.
std::vector<double> PacedOffsets(const BridgeCalls& calls, double speed, double max_gap_ms) {
  std::vector<double> out(calls.calls.size(), 0);
  for (size_t i = 1; i < out.size(); ++i) {
    double gap = std::max(0.0, calls.calls[i].arrival_ms - calls.calls[i - 1].arrival_ms);
    if (max_gap_ms > 0) gap = std::min(gap, max_gap_ms);
    out[i] = out[i - 1] + gap / speed;
  }
  return out;
}

// One recorded session in one loop: its MCP session and the calls due but not sent.
struct Pending {
  const BridgeCall* call;
  uint32_t loop;
  double due_ms;
};
struct SessionRun {
  std::string key;
  std::deque<Pending> pending;
  uint64_t remaining = 0;  // calls of this session in this loop not yet answered
  bool busy = false;       // a connection is working on it
  std::unique_ptr<McpHttpClient> client;
};

struct Outcome {
  const BridgeCall* call;
  uint32_t loop;
  double due_ms, sent_ms, latency_us;
  bool failed, tool_error;
  int64_t tau, version;
  std::string error, mcp_session;
};

class Run {
 public:
  Run(const BridgeCalls& calls, const BridgeReplayOptions& o, McpUrl url)
      : calls_(calls), o_(o), url_(std::move(url)) {}

  StatusOr<BridgeReplayResult> Go() {
    if (!o_.csv_path.empty()) {
      csv_ = std::fopen(o_.csv_path.c_str(), "w");
      if (!csv_) return Unavailable("cannot write " + o_.csv_path);
      std::fprintf(csv_,
                   "loop,seq,session,mcp_session,tool,due_ms,sent_ms,latency_us,"
                   "recorded_latency_us,outcome,recorded_error,tau,recorded_tau,version,error\n");
    }
    // Reach the bridge once before pacing starts, so a wrong URL fails fast and clearly.
    {
      McpHttpClient probe(url_, ClientOptions());
      ONLINEPS_RETURN_IF_ERROR(probe.Initialize().WithContext("bridge"));
      probe.Close();
    }
    const std::vector<double> offsets = PacedOffsets(calls_, o_.speed, o_.max_gap_ms);
    const double loop_ms = offsets.empty() ? 0 : offsets.back();
    total_ = calls_.calls.size() * o_.loop;
    res_.paced_s = loop_ms * o_.loop / 1000;
    start_ = Clock::now();
    std::vector<std::thread> pool;
    const uint32_t n = std::max<uint32_t>(1, o_.connections);
    for (uint32_t i = 0; i < n; ++i) pool.emplace_back([this] { Serve(); });
    Dispatch(offsets, loop_ms);
    {
      MutexLock l(&mu_);
      done_sending_ = true;
      cv_.SignalAll();
    }
    for (auto& t : pool) t.join();
    for (auto& [key, s] : sessions_) {  // sessions cut short by --duration-s or Ctrl-C
      if (s->client) s->client->Close();
    }
    sessions_.clear();
    res_.wall_s = Seconds(Clock::now());
    if (csv_ && std::fclose(csv_) != 0) return Unavailable("cannot write " + o_.csv_path);
    csv_ = nullptr;
    if (o_.progress) o_.progress(total_, total_);
    return std::move(res_);
  }

  ~Run() {
    if (csv_) std::fclose(csv_);
  }

 private:
  McpClientOptions ClientOptions() const {
    McpClientOptions c;
    c.token = o_.token;
    c.timeout_ms = o_.timeout_ms;
    c.client_name = "onlineps_replay";
    return c;
  }
  double Seconds(Clock::time_point t) const {
    return std::chrono::duration<double>(t - start_).count();
  }
  bool Stopped() const {
    if (o_.stop && o_.stop->load()) return true;
    return o_.duration_s > 0 && Seconds(Clock::now()) >= o_.duration_s;
  }

  void Dispatch(const std::vector<double>& offsets, double loop_ms) {
    std::map<std::string, uint64_t> per_session;  // calls per session in one loop
    for (const auto& c : calls_.calls) ++per_session[c.session];
    for (uint32_t loop = 0; loop < o_.loop; ++loop) {
      for (size_t i = 0; i < calls_.calls.size(); ++i) {
        const double due_ms = loop * loop_ms + offsets[i];
        const auto due = PacedAt(start_, due_ms);
        // Sleep in short steps so Ctrl-C and --duration-s act at once.
        while (Clock::now() < due && !Stopped()) {
          std::this_thread::sleep_until(
              std::min(due, Clock::now() + std::chrono::milliseconds(50)));
        }
        MutexLock l(&mu_);
        while (queued_ >= o_.max_queued && !Stopped()) {
          cv_space_.WaitFor(&mu_, std::chrono::milliseconds(50));
        }
        if (Stopped()) {
          res_.not_sent = total_ - dispatched_;
          return;
        }
        const BridgeCall& c = calls_.calls[i];
        const std::string key = std::to_string(loop) + "\x1f" + c.session;
        auto it = sessions_.find(key);
        if (it == sessions_.end()) {
          it = sessions_.emplace(key, std::make_shared<SessionRun>()).first;
          it->second->key = key;
          it->second->remaining = per_session[c.session];
        }
        SessionRun& s = *it->second;
        s.pending.push_back({&c, loop, due_ms});
        ++queued_;
        ++dispatched_;
        if (!s.busy) {
          s.busy = true;
          ready_.push_back(it->second);
          cv_.Signal();
        }
      }
    }
  }

  void Serve() {
    while (true) {
      std::shared_ptr<SessionRun> s;
      Pending p{};
      {
        MutexLock l(&mu_);
        cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return !ready_.empty() || done_sending_; });
        if (ready_.empty()) return;
        s = ready_.front();
        ready_.pop_front();
        p = s->pending.front();
      }
      Outcome out = Send(s.get(), *p.call, p.loop, p.due_ms);
      MutexLock l(&mu_);
      Note(out);
      s->pending.pop_front();
      --queued_;
      cv_space_.Signal();
      if (--s->remaining == 0) {
        if (s->client) s->client->Close();
        sessions_.erase(s->key);
      } else if (!s->pending.empty()) {
        ready_.push_back(s);
        cv_.Signal();
      } else {
        s->busy = false;
      }
    }
  }

  // Outside the lock: only this thread touches `s` while it is busy.
  Outcome Send(SessionRun* s, const BridgeCall& c, uint32_t loop, double due_ms) {
    Outcome o{&c, loop, due_ms, 0, 0, false, false, -1, -1, "", ""};
    StatusOr<McpCallReply> r = Unavailable("not sent");
    Status opened;
    if (!s->client || s->client->session_id().empty()) {
      // Opening the session is not part of the call's latency.
      if (!s->client) s->client = std::make_unique<McpHttpClient>(url_, ClientOptions());
      opened = s->client->Initialize();
      if (opened.ok()) opened_.fetch_add(1);
    }
    const auto t0 = Clock::now();
    o.sent_ms = Seconds(t0) * 1000;
    if (!opened.ok()) {
      r = opened;
    } else {
      r = s->client->CallTool(c.tool, c.arguments);
      if (!r.ok() && r.status().code() == StatusCode::kNotFound) {
        // The bridge dropped the session (restart, TTL): count it, open a new one, retry.
        reinit_.fetch_add(1);
        Status st = s->client->Initialize();
        if (st.ok()) opened_.fetch_add(1);
        r = st.ok() ? s->client->CallTool(c.tool, c.arguments) : StatusOr<McpCallReply>(st);
      }
    }
    o.latency_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    o.mcp_session = s->client->session_id();
    if (!r.ok()) {
      o.failed = true;
      o.error = r.status().ToString();
    } else {
      o.tool_error = r->is_error;
      if (o.tool_error) o.error = ErrorText(r->result);
      o.tau = IntegerField(r->result, "staleness");
      o.version = IntegerField(r->result, "model_version");
    }
    return o;
  }

  void Note(const Outcome& o) {
    const BridgeCall& c = *o.call;
    ToolStats& t = res_.tools[c.tool];
    for (ToolStats* s : {&t, &res_.all}) {
      ++s->calls;
      if (o.failed) {
        ++s->failures;
      } else if (o.tool_error) {
        ++s->tool_errors;
      } else {
        ++s->ok;
      }
      if ((o.failed || o.tool_error) && !c.recorded_error) ++s->new_errors;
      if (c.recorded_error) ++s->recorded_errors;
      s->latency.Add(o.latency_us);
      if (c.recorded_latency_us >= 0) {
        s->recorded_latency.Add(static_cast<double>(c.recorded_latency_us));
      }
    }
    if (c.tool == "learn" && !o.failed && !o.tool_error && o.tau >= 0) {
      res_.tau.Add(static_cast<uint64_t>(o.tau));
    }
    if (c.tool == "learn" && c.recorded_tau >= 0) {
      res_.recorded_tau.Add(static_cast<uint64_t>(c.recorded_tau));
    }
    res_.lag.Add(std::max(0.0, o.sent_ms - o.due_ms) * 1000);
    ++res_.sent;
    if (!o.error.empty() && res_.first_errors.size() < 5 &&
        std::find(res_.first_errors.begin(), res_.first_errors.end(), o.error) ==
            res_.first_errors.end() &&
        !c.recorded_error) {
      res_.first_errors.push_back(o.error);
    }
    res_.sessions_opened = opened_.load();
    res_.reinitialized = reinit_.load();
    if (csv_) {
      std::fprintf(csv_, "%u,%llu,%s,%s,%s,%.3f,%.3f,%.0f,%lld,%s,%d,%lld,%lld,%lld,%s\n", o.loop,
                   static_cast<unsigned long long>(c.seq), CsvField(c.session).c_str(),
                   CsvField(o.mcp_session).c_str(), CsvField(c.tool).c_str(), o.due_ms, o.sent_ms,
                   o.latency_us, static_cast<long long>(c.recorded_latency_us),
                   o.failed       ? "failed"
                   : o.tool_error ? "tool_error"
                                  : "ok",
                   c.recorded_error ? 1 : 0, static_cast<long long>(o.tau),
                   static_cast<long long>(c.recorded_tau), static_cast<long long>(o.version),
                   CsvField(o.error).c_str());
    }
    if (o_.progress) o_.progress(res_.sent, total_);
  }

  const BridgeCalls& calls_;
  const BridgeReplayOptions& o_;
  const McpUrl url_;
  Clock::time_point start_;
  std::FILE* csv_ = nullptr;
  uint64_t total_ = 0;

  // mu_ guards everything below, and res_ and csv_. Not GUARDED_BY yet: the setup and
  // the summary touch them unlocked, outside the threads.
  Mutex mu_;
  CondVar cv_, cv_space_;
  std::map<std::string, std::shared_ptr<SessionRun>> sessions_;
  std::deque<std::shared_ptr<SessionRun>> ready_;
  uint64_t queued_ = 0, dispatched_ = 0;
  bool done_sending_ = false;
  BridgeReplayResult res_;
  std::atomic<uint64_t> opened_{0}, reinit_{0};
};

}  // namespace

void LatencyStats::Add(double us) {
  const double v = std::max(1.0, us);
  const size_t b = static_cast<size_t>(std::log(v) / std::log(kBucketRatio));
  if (hist_.size() <= b) hist_.resize(std::min<size_t>(b + 1, 2000), 0);
  ++hist_[std::min(b, hist_.size() - 1)];
  ++count_;
  sum_ += us;
  max_ = std::max(max_, us);
}

double LatencyStats::Quantile(double q) const {
  if (count_ == 0) return 0;
  const uint64_t rank =
      std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_))));
  uint64_t seen = 0;
  for (size_t b = 0; b < hist_.size(); ++b) {
    seen += hist_[b];
    if (seen >= rank) return std::min(max_, std::pow(kBucketRatio, static_cast<double>(b + 1)));
  }
  return max_;
}

json LatencyStats::ToJson() const {
  return {{"count", count_},         {"mean_us", Mean()},        {"p50_us", Quantile(0.5)},
          {"p90_us", Quantile(0.9)}, {"p99_us", Quantile(0.99)}, {"max_us", max_}};
}

namespace {
json ToolJson(const ToolStats& t) {
  json j = {{"calls", t.calls},
            {"ok", t.ok},
            {"tool_errors", t.tool_errors},
            {"failures", t.failures},
            {"new_errors", t.new_errors},
            {"recorded_errors", t.recorded_errors},
            {"latency", t.latency.ToJson()}};
  if (t.recorded_latency.count()) j["recorded_latency"] = t.recorded_latency.ToJson();
  return j;
}
}  // namespace

json BridgeReplayResult::ToJson() const {
  json tools_json = json::object();
  for (const auto& [name, t] : tools) tools_json[name] = ToolJson(t);
  return {{"all", ToolJson(all)},
          {"tools", tools_json},
          {"staleness", tau.ToJson()},
          {"recorded_staleness", recorded_tau.ToJson()},
          {"schedule_lag", lag.ToJson()},
          {"sent", sent},
          {"not_sent", not_sent},
          {"sessions_opened", sessions_opened},
          {"sessions_reinitialized", reinitialized},
          {"wall_s", wall_s},
          {"paced_s", paced_s},
          {"calls_per_s", wall_s > 0 ? static_cast<double>(sent) / wall_s : 0.0},
          {"first_errors", first_errors}};
}

StatusOr<BridgeCalls> LoadBridgeCalls(const std::string& path, uint64_t limit) {
  ONLINEPS_ASSIGN_OR_RETURN(auto reader, TraceReader::Open(path));
  BridgeCalls out;
  out.header = reader->header();
  std::set<std::string> sessions;
  TraceRecord r;
  while (true) {
    ONLINEPS_ASSIGN_OR_RETURN(bool more, reader->Next(&r));
    if (!more) break;
    ++out.records;
    BridgeCall c;
    if (r.kind == RecordKind::kCall) {
      if (r.tool.empty()) {
        return InvalidArgument(path + ":" + std::to_string(reader->line()) +
                               ": a call record without 'tool'");
      }
      c.tool = r.tool;
      c.recorded_error = r.is_error;
      c.recorded_latency_us = r.latency_us;
      c.arrival_ms = static_cast<double>(r.t_us - std::max<int64_t>(0, r.latency_us)) / 1000;
    } else if (r.kind == RecordKind::kLearn || r.kind == RecordKind::kInfer) {
      if (!r.arguments.is_object()) {
        ++out.skipped_by_ref;
        continue;
      }
      c.tool = RecordKindName(r.kind);
      c.arrival_ms = static_cast<double>(r.t_us) / 1000;
    } else {
      continue;
    }
    c.seq = r.seq;
    c.session = r.session;
    c.arguments = r.arguments.is_object() ? r.arguments : json::object();
    c.recorded_tau = r.tau;
    sessions.insert(c.session);
    out.calls.push_back(std::move(c));
    if (limit > 0 && out.calls.size() >= limit) break;
  }
  out.truncated_tail = reader->truncated_tail();
  std::stable_sort(
      out.calls.begin(), out.calls.end(), [](const BridgeCall& a, const BridgeCall& b) {
        return a.arrival_ms < b.arrival_ms || (a.arrival_ms == b.arrival_ms && a.seq < b.seq);
      });
  out.sessions = sessions.size();
  if (!out.calls.empty()) out.span_ms = out.calls.back().arrival_ms - out.calls.front().arrival_ms;
  return out;
}

double PacedDurationMs(const BridgeCalls& calls, double speed, double max_gap_ms, uint32_t loop) {
  const auto off = PacedOffsets(calls, speed, max_gap_ms);
  return off.empty() ? 0 : off.back() * std::max<uint32_t>(1, loop);
}

StatusOr<BridgeReplayResult> ReplayOnBridge(const BridgeCalls& calls,
                                            const BridgeReplayOptions& options) {
  ONLINEPS_ASSIGN_OR_RETURN(McpUrl url, ParseMcpUrl(options.url));
  if (calls.calls.empty()) return FailedPrecondition("the trace has no tool calls to send");
  Run run(calls, options, url);
  return run.Go();
}

}  // namespace onlineps::replay
