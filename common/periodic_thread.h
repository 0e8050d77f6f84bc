// PeriodicThread: runs `tick` on its own thread every `period` (first at once when
// `tick_first`) until Stop() or destruction. Stop() wakes the waiting thread at once;
// a tick in progress finishes first. Wake() runs a tick now (or right after the one in
// progress); wakes while a tick runs coalesce into one. The one primitive for "wait until stop or
// period" loops. Start/Stop from one owning thread; Start after Stop starts it again.
#ifndef ONLINEPS_COMMON_PERIODIC_THREAD_H_
#define ONLINEPS_COMMON_PERIODIC_THREAD_H_

#include <chrono>
#include <functional>
#include <thread>
#include <utility>

#include "common/mutex.h"

namespace onlineps {

class PeriodicThread {
 public:
  PeriodicThread() = default;
  ~PeriodicThread() { Stop(); }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Does nothing while running.
  void Start(std::chrono::milliseconds period, std::function<void()> tick, bool tick_first) {
    if (thread_.joinable()) return;
    {
      MutexLock lock(&mu_);
      stop_ = false;
      wake_ = false;
    }
    thread_ = std::thread([this, period, tick = std::move(tick), tick_first] {
      MutexLock lock(&mu_);
      if (tick_first) {
        lock.Unlock();
        tick();
        lock.Lock();
      }
      for (;;) {
        cv_.WaitFor(&mu_, period, [this]() REQUIRES(mu_) { return stop_ || wake_; });
        if (stop_) break;
        wake_ = false;
        lock.Unlock();
        tick();
        lock.Lock();
      }
    });
  }

  // Thread-safe; does nothing when not running.
  void Wake() {
    {
      MutexLock lock(&mu_);
      wake_ = true;
    }
    cv_.SignalAll();
  }

  // Returns once the thread has ended. Idempotent.
  void Stop() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    if (thread_.joinable()) thread_.join();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool wake_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_PERIODIC_THREAD_H_
