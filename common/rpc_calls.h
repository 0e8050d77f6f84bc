// RpcCalls: the calls a client has in flight, the one RPC core of PsClient and
// WorkerClient. It owns the request ids (RequestIdPool: recycled, never 0, and a late
// reply to a recycled id never matches), the call each id stands for, each attempt's
// deadline, and the resends scheduled for later. One timer thread hands back attempts
// whose deadline passed (on_expired) and resends whose time came (on_due); both run on
// that thread, without the lock held, and may call Add or Later again.
//
// Call is the client's own per-attempt state, owned by the table while in flight and
// handed back, exactly once, by Take (its reply came), on_expired, on_due or Stop.
// Thread-safe.
#ifndef ONLINEPS_COMMON_RPC_CALLS_H_
#define ONLINEPS_COMMON_RPC_CALLS_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/request_ids.h"
#include "common/status.h"

namespace onlineps {

template <typename Call>
class RpcCalls {
 public:
  using Clock = std::chrono::steady_clock;
  using Handler = std::function<void(std::unique_ptr<Call>)>;
  // Sends attempt `id` of `call`. Runs under the table's lock, so that its reply cannot
  // be looked up before the call is registered: it must only hand frames to a transport.
  using Sender = std::function<void(uint32_t id, Call& call)>;

  // At most `capacity` (<= 65536) calls in flight. on_due may be null when Later is not
  // used.
  RpcCalls(uint32_t capacity, Handler on_expired, Handler on_due)
      : on_expired_(std::move(on_expired)), on_due_(std::move(on_due)), ids_(capacity) {
    MutexLock lock(&mu_);  // no other thread yet; for the analysis
    slots_.resize(ids_.capacity());
  }
  ~RpcCalls() { (void)Stop(); }
  RpcCalls(const RpcCalls&) = delete;
  RpcCalls& operator=(const RpcCalls&) = delete;

  // Starts the timer thread. Call once, before the first Add.
  void Start() {
    timer_ = std::thread([this] { TimerLoop(); });
  }

  // Registers *call under a fresh id, due back by `deadline`, and runs send(id, call).
  // On success *call is null. Errors leave *call with the caller: kResourceExhausted when
  // every id is in flight and none came free by `wait_until` (default: no waiting),
  // kCancelled after Stop().
  StatusOr<uint32_t> Add(std::unique_ptr<Call>* call, Clock::time_point deadline,
                         const Sender& send,
                         Clock::time_point wait_until = Clock::time_point::min()) {
    MutexLock lock(&mu_);
    std::optional<uint32_t> id;
    free_cv_.WaitUntil(&mu_, wait_until,
                       [&]() REQUIRES(mu_) { return stop_ || (id = ids_.Acquire()).has_value(); });
    if (stop_) {
      if (id) ids_.Release(*id);
      return Cancelled("client shut down");
    }
    if (!id) {
      return ResourceExhausted("more than " + std::to_string(ids_.capacity()) +
                               " requests in flight");
    }
    AddDeadline(deadline, *id);
    // Wake the timer only when this deadline comes before its planned wake-up; waking it
    // on every call would cost a thread switch per round trip.
    if (deadline < timer_wake_) timer_cv_.Signal();
    Call& c = **call;
    slots_[*id & 0xffff] = std::move(*call);
    send(*id, c);
    return *id;
  }

  // As Add, but in two steps: prepare(id, call) runs under the lock and returns what
  // transmit(R&&) then sends without it. prepare copies out all transmit needs (the call
  // may be taken and gone once the lock is released), so a reply that arrives on the
  // sending thread itself (an in-process server run on the sender) can be taken, and a
  // reply on another thread never waits for the send.
  template <typename Prepare, typename Transmit>
  StatusOr<uint32_t> AddThen(std::unique_ptr<Call>* call, Clock::time_point deadline,
                             const Prepare& prepare, const Transmit& transmit,
                             Clock::time_point wait_until = Clock::time_point::min()) {
    decltype(prepare(uint32_t{0}, **call)) out;
    const StatusOr<uint32_t> id = Add(
        call, deadline, [&](uint32_t i, Call& c) { out = prepare(i, c); }, wait_until);
    if (id.ok()) transmit(std::move(out));
    return id;
  }

  // The call registered under `id` when `match` (if given) accepts it; null for a late,
  // unknown or foreign reply, or after Stop().
  std::unique_ptr<Call> Take(uint32_t id, const std::function<bool(const Call&)>& match = nullptr) {
    std::unique_ptr<Call> call;
    {
      MutexLock lock(&mu_);
      const std::optional<uint32_t> slot = ids_.SlotOf(id);
      if (!slot || !slots_[*slot] || (match && !match(*slots_[*slot]))) return nullptr;
      call = std::move(slots_[*slot]);
      ids_.Release(id);
      DropAnswered();
    }
    free_cv_.Signal();
    return call;
  }

  // Every call in flight (not the resends scheduled by Later), for the owner to fail:
  // their replies can no longer come (e.g. the connection they were sent on dropped).
  std::vector<std::unique_ptr<Call>> TakeAll() {
    std::vector<std::unique_ptr<Call>> taken;
    {
      MutexLock lock(&mu_);
      for (size_t slot = 0; slot < slots_.size(); ++slot) {
        if (!slots_[slot]) continue;
        taken.push_back(std::move(slots_[slot]));
        ids_.ReleaseSlot(static_cast<uint32_t>(slot));
      }
      DropAnswered();
    }
    free_cv_.SignalAll();
    return taken;
  }

  // Hands `call` to on_due at `when`, on the timer thread, and returns null; after
  // Stop() returns `call` instead, for the owner to cancel.
  [[nodiscard]] std::unique_ptr<Call> Later(Clock::time_point when, std::unique_ptr<Call> call) {
    MutexLock lock(&mu_);
    if (stop_) return call;
    delayed_.emplace_back(when, std::move(call));
    timer_cv_.Signal();
    return nullptr;
  }

  // Stops the timer and returns every call still in flight or scheduled, for the owner
  // to cancel. Idempotent (a second call returns nothing).
  std::vector<std::unique_ptr<Call>> Stop() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    timer_cv_.SignalAll();
    free_cv_.SignalAll();
    if (timer_.joinable() && timer_.get_id() != std::this_thread::get_id()) timer_.join();
    std::vector<std::unique_ptr<Call>> left;
    MutexLock lock(&mu_);
    for (auto& c : slots_) {
      if (c) left.push_back(std::move(c));
    }
    for (auto& d : delayed_) left.push_back(std::move(d.second));
    delayed_.clear();
    return left;
  }

  size_t in_flight() const {
    MutexLock lock(&mu_);
    return ids_.in_flight();
  }

  // Deadlines the timer still holds, of calls in flight or answered but not yet dropped.
  size_t deadlines_held() const {
    MutexLock lock(&mu_);
    size_t n = others_.size();
    for (const auto& q : queues_) n += q.size();
    return n;
  }

 private:
  void TimerLoop() {
    MutexLock lock(&mu_);
    while (!stop_) {
      auto wake = Clock::now() + std::chrono::milliseconds(50);
      for (const auto& q : queues_) {
        if (!q.empty()) wake = std::min(wake, q.front().first);
      }
      if (!others_.empty()) wake = std::min(wake, others_.top().first);
      for (const auto& d : delayed_) wake = std::min(wake, d.first);
      timer_wake_ = wake;
      timer_cv_.WaitUntil(&mu_, wake);
      timer_wake_ = Clock::time_point::min();  // awake: Add need not signal
      if (stop_) break;
      const auto now = Clock::now();
      std::vector<std::unique_ptr<Call>> expired, due;
      auto expire = [&](uint32_t id) REQUIRES(mu_) {
        const std::optional<uint32_t> slot = ids_.SlotOf(id);
        if (!slot || !slots_[*slot]) return;  // answered already
        expired.push_back(std::move(slots_[*slot]));
        ids_.Release(id);
      };
      for (auto& q : queues_) {
        while (!q.empty() && q.front().first <= now) {
          expire(q.front().second);
          q.pop_front();
        }
      }
      while (!others_.empty() && others_.top().first <= now) {
        expire(others_.top().second);
        others_.pop();
      }
      for (size_t i = 0; i < delayed_.size();) {
        if (delayed_[i].first <= now) {
          due.push_back(std::move(delayed_[i].second));
          delayed_[i] = std::move(delayed_.back());
          delayed_.pop_back();
        } else {
          ++i;
        }
      }
      lock.Unlock();
      if (!expired.empty()) free_cv_.SignalAll();
      for (auto& c : expired) on_expired_(std::move(c));
      for (auto& c : due) on_due_(std::move(c));
      lock.Lock();
    }
  }

  using Deadline = std::pair<Clock::time_point, uint32_t>;  // (attempt deadline, id)

  // Files `deadline` in the queue whose last deadline is the latest one not after it, so
  // each queue stays in deadline order: calls made with the same timeout (most of them)
  // share a queue, appended at its back and, as their replies come in order, dropped
  // from its front by Take. A deadline that fits no queue, with every queue in use, goes
  // to a heap. The queues grow with the calls in flight, not with those answered (the
  // heap, for the few calls that fit no queue, keeps each deadline until it passes); one
  // heap of every deadline would keep each until it passed (calls/s x timeout entries)
  // and cost its timer a pop per call.
  void AddDeadline(Clock::time_point deadline, uint32_t id) REQUIRES(mu_) {
    std::deque<Deadline>* best = nullptr;
    std::deque<Deadline>* empty = nullptr;
    for (auto& q : queues_) {
      if (q.empty()) {
        if (!empty) empty = &q;
      } else if (q.back().first <= deadline && (!best || best->back().first < q.back().first)) {
        best = &q;
      }
    }
    if (!best) best = empty;
    if (best) {
      best->emplace_back(deadline, id);
    } else {
      others_.emplace(deadline, id);
    }
  }

  // Drops the answered calls at the front of each queue.
  void DropAnswered() REQUIRES(mu_) {
    for (auto& q : queues_) {
      while (!q.empty()) {
        const std::optional<uint32_t> slot = ids_.SlotOf(q.front().second);
        if (slot && slots_[*slot]) break;
        q.pop_front();
      }
    }
  }

  const Handler on_expired_, on_due_;
  mutable Mutex mu_;
  CondVar timer_cv_;  // the timer: a deadline earlier than planned, a resend, or Stop
  CondVar free_cv_;   // Add waiting for an id
  RequestIdPool ids_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Call>> slots_ GUARDED_BY(mu_);  // index: id & 0xffff
  static constexpr size_t kDeadlineQueues = 4;
  std::deque<Deadline> queues_[kDeadlineQueues] GUARDED_BY(mu_);
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<>> others_ GUARDED_BY(mu_);
  std::vector<std::pair<Clock::time_point, std::unique_ptr<Call>>> delayed_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  Clock::time_point timer_wake_ GUARDED_BY(mu_) = Clock::time_point::max();
  std::thread timer_;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_RPC_CALLS_H_
