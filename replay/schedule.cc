#include "replay/schedule.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <utility>

namespace onlineps::replay {
namespace {

constexpr uint64_t kMaxBuildUpdates = 100000000;
constexpr double kInf = std::numeric_limits<double>::infinity();

bool StalenessSet(const ScheduleOptions& o) {
  return o.staleness.has_value() && o.staleness->ToString() != "none";
}

Status Bad(const std::string& field, const std::string& problem) {
  return InvalidArgument("ScheduleOptions." + field + " " + problem);
}
std::string At(const char* list, size_t i, const char* member) {
  return std::string(list) + "[" + std::to_string(i) + "]." + member;
}
bool Positive(double x) { return x > 0 && std::isfinite(x); }

Status ValidateSpeedAndStragglers(const ScheduleOptions& o) {
  if (!o.speed.empty() && o.speed.size() != o.workers) {
    return Bad("speed", "has " + std::to_string(o.speed.size()) +
                            " entries, want 0 or workers = " + std::to_string(o.workers));
  }
  for (size_t i = 0; i < o.speed.size(); ++i) {
    if (!Positive(o.speed[i])) return Bad("speed[" + std::to_string(i) + "]", "must be > 0");
  }
  for (size_t i = 0; i < o.stragglers.size(); ++i) {
    const Straggler& s = o.stragglers[i];
    if (s.worker >= o.workers) {
      return Bad(At("stragglers", i, "worker"), std::to_string(s.worker) + " >= workers");
    }
    if (!Positive(s.factor)) return Bad(At("stragglers", i, "factor"), "must be > 0");
    if (!(s.to_ms > s.from_ms)) return Bad(At("stragglers", i, "to_ms"), "must be > from_ms");
  }
  return Status::Ok();
}

Status ValidateChurn(const ScheduleOptions& o) {
  for (size_t i = 0; i < o.churn.size(); ++i) {
    const Churn& c = o.churn[i];
    if (c.worker >= o.workers) {
      return Bad(At("churn", i, "worker"), std::to_string(c.worker) + " >= workers");
    }
    if (!(c.join_ms >= 0) || !std::isfinite(c.join_ms)) {
      return Bad(At("churn", i, "join_ms"), "must be finite and >= 0");
    }
    if (!(c.leave_ms > c.join_ms)) return Bad(At("churn", i, "leave_ms"), "must be > join_ms");
    for (size_t j = 0; j < i; ++j) {
      const Churn& d = o.churn[j];
      if (d.worker == c.worker && c.join_ms < d.leave_ms && d.join_ms < c.leave_ms) {
        return Bad(At("churn", i, "join_ms"), "overlaps churn[" + std::to_string(j) + "]");
      }
    }
  }
  return Status::Ok();
}

Status Validate(const ScheduleOptions& o) {
  if (o.workers < 1) return Bad("workers", "must be >= 1");
  ONLINEPS_RETURN_IF_ERROR(ValidateSpeedAndStragglers(o));
  ONLINEPS_RETURN_IF_ERROR(ValidateChurn(o));
  if (StalenessSet(o) && o.mode != SyncMode::kAsync) {
    return Bad("staleness", "needs mode kAsync (sync rounds have tau 0)");
  }
  if (StalenessSet(o) && (!o.stragglers.empty() || !o.churn.empty())) {
    return Bad("staleness", "ignores timing: stragglers and churn must be empty");
  }
  return Status::Ok();
}

// Per-worker timing shared by the timed simulators: speed, stragglers, active windows.
class WorkerModel {
 public:
  explicit WorkerModel(const ScheduleOptions& o)
      : o_(o), windows_(o.workers), has_churn_(o.workers, false) {
    for (const Churn& c : o.churn) {
      windows_[c.worker].push_back({c.join_ms, c.leave_ms});
      has_churn_[c.worker] = true;
    }
    for (auto& w : windows_) {
      std::sort(w.begin(), w.end());
      if (w.empty()) w.push_back({0, kInf});
    }
  }

  double ComputeMs(uint32_t w, double start_ms, Rng& rng) {
    double ms = o_.compute.Sample(rng);
    if (!o_.speed.empty()) ms *= o_.speed[w];
    for (const Straggler& s : o_.stragglers) {
      if (s.worker == w && start_ms >= s.from_ms && start_ms < s.to_ms) ms *= s.factor;
    }
    return ms;
  }
  double MessageMs(Rng& rng) { return o_.message.Sample(rng); }

  bool HasChurn(uint32_t w) const { return has_churn_[w]; }
  const std::vector<std::pair<double, double>>& Windows(uint32_t w) const { return windows_[w]; }
  // The leave time of the window active at t, or -inf when w is not active at t.
  double LeaveIfActive(uint32_t w, double t) const {
    for (const auto& [join, leave] : windows_[w]) {
      if (join <= t && t < leave) return leave;
    }
    return -kInf;
  }

 private:
  ScheduleOptions o_;  // a copy: the list delays advance their own cursors
  std::vector<std::vector<std::pair<double, double>>> windows_;  // sorted [join, leave)
  std::vector<bool> has_churn_;
};

Event MakeEvent(double t, EventKind kind, uint32_t worker, uint64_t step = 0, uint64_t batch = 0,
                uint64_t version = 0, uint64_t tau = 0) {
  Event e;
  e.t_ms = t;
  e.kind = kind;
  e.worker = worker;
  e.step = step;
  e.batch = batch;
  e.version = version;
  e.expected_tau = tau;
  return e;
}

// Async, timed: a discrete-event simulation over one priority queue.
class AsyncSim final : public Scheduler {
 public:
  explicit AsyncSim(const ScheduleOptions& o)
      : updates_(o.updates), rng_(o.seed), model_(o), workers_(o.workers) {
    done_ = updates_ == 0;
    for (uint32_t w = 0; w < o.workers; ++w) {
      const auto& windows = model_.Windows(w);
      if (!model_.HasChurn(w)) {
        workers_[w].active = true;
        TryStartPull(w, 0);
        continue;
      }
      for (uint32_t i = 0; i < windows.size(); ++i) {
        Enqueue(windows[i].first, w, Kind::kJoin, i);
        if (std::isfinite(windows[i].second)) Enqueue(windows[i].second, w, Kind::kLeave, i);
      }
    }
  }

  bool Next(Event* out) override {
    while (!done_ && !queue_.empty()) {
      const Pending p = queue_.top();
      queue_.pop();
      if (Handle(p, out)) {
        out->seq = seq_++;
        return true;
      }
    }
    return false;
  }

 private:
  enum class Kind { kJoin, kLeave, kPullReply, kPushArrive };
  struct Pending {
    double t;
    uint32_t worker;
    uint64_t order;  // scheduling order: the last tie-break
    Kind kind;
    uint32_t window;
    bool operator>(const Pending& b) const {
      return std::tie(t, worker, order) > std::tie(b.t, b.worker, b.order);
    }
  };
  struct WorkerState {
    bool active = false, busy = false;
    uint32_t window = 0;
    uint64_t next_step = 0, step = 0, batch = 0, base = 0;
  };

  void Enqueue(double t, uint32_t w, Kind kind, uint32_t window) {
    queue_.push({t, w, order_++, kind, window});
  }

  void TryStartPull(uint32_t w, double t) {
    if (pushes_ + in_flight_ >= updates_) {
      idle_.insert(w);
      return;
    }
    workers_[w].busy = true;
    ++in_flight_;
    Enqueue(t + model_.MessageMs(rng_), w, Kind::kPullReply, workers_[w].window);
  }

  bool Handle(const Pending& p, Event* out) {
    WorkerState& ws = workers_[p.worker];
    switch (p.kind) {
      case Kind::kJoin:
        ws.active = true;
        ws.window = p.window;
        *out = MakeEvent(p.t, EventKind::kJoin, p.worker);
        TryStartPull(p.worker, p.t);
        return true;
      case Kind::kLeave:
        Leave(p.worker, p.t);
        *out = MakeEvent(p.t, EventKind::kLeave, p.worker);
        return true;
      case Kind::kPullReply:
        if (!ws.active || ws.window != p.window) return false;  // abandoned
        PullReply(p, out);
        return true;
      case Kind::kPushArrive:
        if (!ws.active || ws.window != p.window) return false;  // abandoned
        PushArrive(p, out);
        return true;
    }
    return false;
  }

  void Leave(uint32_t w, double t) {
    WorkerState& ws = workers_[w];
    ws.active = false;
    idle_.erase(w);
    if (!ws.busy) return;
    ws.busy = false;
    --in_flight_;
    // The abandoned step's push is still needed: hand the slot to a waiting worker.
    while (!idle_.empty() && pushes_ + in_flight_ < updates_) {
      const uint32_t next = *idle_.begin();
      idle_.erase(idle_.begin());
      TryStartPull(next, t);
    }
  }

  void PullReply(const Pending& p, Event* out) {
    WorkerState& ws = workers_[p.worker];
    ws.step = ws.next_step++;
    ws.batch = batches_++;
    ws.base = version_;
    *out = MakeEvent(p.t, EventKind::kPull, p.worker, ws.step, ws.batch, version_);
    const double compute = model_.ComputeMs(p.worker, p.t, rng_);
    Enqueue(p.t + compute + model_.MessageMs(rng_), p.worker, Kind::kPushArrive, p.window);
  }

  void PushArrive(const Pending& p, Event* out) {
    WorkerState& ws = workers_[p.worker];
    *out =
        MakeEvent(p.t, EventKind::kPush, p.worker, ws.step, ws.batch, ws.base, version_ - ws.base);
    ++version_;
    ++pushes_;
    --in_flight_;
    ws.busy = false;
    if (pushes_ >= updates_) {
      done_ = true;
    } else {
      TryStartPull(p.worker, p.t);
    }
  }

  const uint64_t updates_;
  Rng rng_;
  WorkerModel model_;
  std::vector<WorkerState> workers_;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> queue_;
  std::set<uint32_t> idle_;  // active, not busy, refused a pull (no push needed then)
  uint64_t order_ = 0, seq_ = 0, version_ = 0, pushes_ = 0, in_flight_ = 0, batches_ = 0;
  bool done_ = false;
};

// Sync, timed: one round at a time, buffered and sorted by (t, worker, kind).
class SyncSim final : public Scheduler {
 public:
  explicit SyncSim(const ScheduleOptions& o)
      : updates_(o.updates), rng_(o.seed), model_(o), next_step_(o.workers), batch_(o.workers) {
    for (uint32_t w = 0; w < o.workers; ++w) {
      if (!model_.HasChurn(w)) continue;
      for (const auto& [join, leave] : model_.Windows(w)) {
        membership_.push_back(MakeEvent(join, EventKind::kJoin, w));
        if (std::isfinite(leave)) membership_.push_back(MakeEvent(leave, EventKind::kLeave, w));
      }
    }
    std::sort(membership_.begin(), membership_.end(), EarlierSync);
  }

  bool Next(Event* out) override {
    while (cursor_ == buffer_.size()) {
      buffer_.clear();
      cursor_ = 0;
      if (!NextRound()) return false;
    }
    *out = buffer_[cursor_++];
    out->seq = seq_++;
    if (out->kind == EventKind::kPull) out->batch = batch_[out->worker] = batches_++;
    if (out->kind == EventKind::kPush) out->batch = batch_[out->worker];
    return true;
  }

 private:
  static int Rank(EventKind k) {  // a leave closes the old window before a rejoin opens one
    return k == EventKind::kLeave ? 0 : k == EventKind::kJoin ? 1 : k == EventKind::kPull ? 2 : 3;
  }
  static bool EarlierSync(const Event& a, const Event& b) {
    return std::make_tuple(a.t_ms, a.worker, Rank(a.kind)) <
           std::make_tuple(b.t_ms, b.worker, Rank(b.kind));
  }

  // Moves the membership events with t <= until (or < until) into the buffer.
  void TakeMembership(double until, bool inclusive) {
    while (member_cursor_ < membership_.size()) {
      const double t = membership_[member_cursor_].t_ms;
      if (inclusive ? t > until : t >= until) break;
      buffer_.push_back(membership_[member_cursor_++]);
    }
  }

  // Runs worker w's step of the round starting at t; returns when w is done with it.
  double RunStep(uint32_t w, double t, uint64_t* pushed) {
    const double leave = model_.LeaveIfActive(w, t);
    const double pull_t = t + model_.MessageMs(rng_);
    if (pull_t >= leave) return leave;
    const Event pull = MakeEvent(pull_t, EventKind::kPull, w, next_step_[w]++, 0, round_);
    buffer_.push_back(pull);
    const double push_t = pull_t + model_.ComputeMs(w, pull_t, rng_) + model_.MessageMs(rng_);
    if (push_t >= leave) return leave;
    Event push = pull;
    push.kind = EventKind::kPush;
    push.t_ms = push_t;
    buffer_.push_back(push);
    ++*pushed;
    return push_t;
  }

  bool NextRound() {
    if (pushes_ >= updates_) return false;
    const double t = start_;
    TakeMembership(t, /*inclusive=*/true);
    double end = t;
    uint64_t participants = 0, pushed = 0;
    for (uint32_t w = 0; w < next_step_.size() && participants < updates_ - pushes_; ++w) {
      if (model_.LeaveIfActive(w, t) < t) continue;
      ++participants;
      end = std::max(end, RunStep(w, t, &pushed));
    }
    if (participants == 0) {
      end = NextJoinAfter(t);
      if (end == kInf) return !buffer_.empty();  // every worker left for good
    }
    TakeMembership(end, /*inclusive=*/false);
    pushes_ += pushed;
    if (pushed > 0) ++round_;
    start_ = end;
    std::stable_sort(buffer_.begin(), buffer_.end(), EarlierSync);
    return true;
  }

  double NextJoinAfter(double t) const {
    for (size_t i = member_cursor_; i < membership_.size(); ++i) {
      if (membership_[i].kind == EventKind::kJoin && membership_[i].t_ms > t) {
        return membership_[i].t_ms;
      }
    }
    return kInf;
  }

  const uint64_t updates_;
  Rng rng_;
  WorkerModel model_;
  std::vector<uint64_t> next_step_, batch_;  // per worker
  std::vector<Event> membership_;            // churn joins and leaves, sorted
  std::vector<Event> buffer_;                // the current round's events, sorted
  size_t cursor_ = 0, member_cursor_ = 0;
  double start_ = 0;
  uint64_t seq_ = 0, round_ = 0, pushes_ = 0, batches_ = 0;
};

// Staleness override: logical order only (the rule is in schedule.h), t_ms = 0.
class StalenessSim final : public Scheduler {
 public:
  explicit StalenessSim(const ScheduleOptions& o)
      : updates_(o.updates), rng_(o.seed), tau_(*o.staleness), workers_(o.workers) {}

  bool Next(Event* out) override {
    const bool can_pull = pushes_ + queue_.size() < updates_ && free_ > 0;
    const uint64_t first_due = queue_.empty() ? kNever : queue_.begin()->due;
    const uint64_t gap = first_due - version_;  // meaningful when first_due > version_
    if (first_due < version_) {
      Apply(out);  // overdue: drain before pulling more
    } else if (can_pull && !pulled_at_version_) {
      Pull(out);
    } else if (first_due == version_) {
      Apply(out);
    } else if (can_pull && (queue_.empty() || queue_.size() <= gap)) {
      Pull(out);  // the queue cannot fill the versions until its first push is due
    } else if (!queue_.empty()) {
      Apply(out);  // nothing due and no pull helps: the earliest push goes early
    } else {
      return false;
    }
    out->seq = seq_++;
    return true;
  }

 private:
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  struct Queued {
    uint64_t due, pull_order;
    uint32_t worker;
    uint64_t step, batch, base;
    bool operator<(const Queued& b) const {
      return std::tie(due, pull_order) < std::tie(b.due, b.pull_order);
    }
  };
  struct WorkerState {
    bool busy = false;
    uint64_t next_step = 0;
  };

  uint64_t SampleTau() {
    // Capped so a heavy-tailed draw cannot overflow the version arithmetic.
    const double tau = std::min(std::round(tau_.Sample(rng_)), 1e15);
    return static_cast<uint64_t>(std::max(tau, 0.0));
  }

  void Pull(Event* out) {
    uint32_t w = next_worker_;
    while (workers_[w].busy) w = (w + 1) % workers_.size();
    next_worker_ = (w + 1) % workers_.size();
    workers_[w].busy = true;
    --free_;
    pulled_at_version_ = true;
    const Queued q{version_ + SampleTau(),  batches_, w,
                   workers_[w].next_step++, batches_, version_};
    ++batches_;
    queue_.insert(q);
    *out = MakeEvent(0, EventKind::kPull, w, q.step, q.batch, q.base);
  }

  void Apply(Event* out) {
    const Queued q = *queue_.begin();
    queue_.erase(queue_.begin());
    *out = MakeEvent(0, EventKind::kPush, q.worker, q.step, q.batch, q.base, version_ - q.base);
    ++version_;
    ++pushes_;
    workers_[q.worker].busy = false;
    ++free_;
    pulled_at_version_ = false;
  }

  const uint64_t updates_;
  Rng rng_;
  Delay tau_;
  std::vector<WorkerState> workers_;
  std::set<Queued> queue_;
  uint64_t free_ = workers_.size();
  uint32_t next_worker_ = 0;
  bool pulled_at_version_ = false;
  uint64_t seq_ = 0, version_ = 0, pushes_ = 0, batches_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const ScheduleOptions& options) {
  ONLINEPS_RETURN_IF_ERROR(Validate(options));
  std::unique_ptr<Scheduler> s;
  if (StalenessSet(options)) {
    s = std::make_unique<StalenessSim>(options);
  } else if (options.mode == SyncMode::kSync) {
    s = std::make_unique<SyncSim>(options);
  } else {
    s = std::make_unique<AsyncSim>(options);
  }
  return s;
}

StatusOr<Schedule> BuildSchedule(const ScheduleOptions& options) {
  if (options.updates > kMaxBuildUpdates) {
    return InvalidArgument("ScheduleOptions.updates " + std::to_string(options.updates) +
                           " > 1e8: use the streaming Scheduler");
  }
  ONLINEPS_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler, Scheduler::Create(options));
  Schedule s;
  s.worker_pushes.assign(options.workers, 0);
  for (Event e; scheduler->Next(&e);) {
    s.duration_ms = e.t_ms;
    if (e.kind == EventKind::kPush) {
      if (e.expected_tau >= s.tau_histogram.size()) s.tau_histogram.resize(e.expected_tau + 1);
      ++s.tau_histogram[e.expected_tau];
      ++s.worker_pushes[e.worker];
      ++s.pushes;
    }
    s.events.push_back(e);
  }
  return s;
}

double Schedule::TauMean() const {
  double sum = 0;
  for (size_t k = 0; k < tau_histogram.size(); ++k)
    sum += static_cast<double>(k) * tau_histogram[k];
  return pushes == 0 ? 0 : sum / pushes;
}

uint64_t Schedule::TauQuantile(double q) const {
  const double target = std::ceil(std::clamp(q, 0.0, 1.0) * pushes);
  uint64_t seen = 0;
  for (size_t k = 0; k < tau_histogram.size(); ++k) {
    seen += tau_histogram[k];
    if (seen > 0 && seen >= target) return k;
  }
  return 0;
}

uint64_t Schedule::TauMax() const { return tau_histogram.empty() ? 0 : tau_histogram.size() - 1; }

}  // namespace onlineps::replay
