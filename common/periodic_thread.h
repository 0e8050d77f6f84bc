// PeriodicThread: runs `tick` on its own thread every `period` (first at once when
// `tick_first`) until Stop() or destruction. Stop() wakes the waiting thread at once;
// a tick in progress finishes first. The one primitive for "wait until stop or period"
// loops. Start/Stop from one owning thread; Start after Stop starts it again.
#ifndef ONLINEPS_COMMON_PERIODIC_THREAD_H_
#define ONLINEPS_COMMON_PERIODIC_THREAD_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

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
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = false;
    }
    thread_ = std::thread([this, period, tick = std::move(tick), tick_first] {
      std::unique_lock<std::mutex> lock(mu_);
      if (tick_first) {
        lock.unlock();
        tick();
        lock.lock();
      }
      while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
        lock.unlock();
        tick();
        lock.lock();
      }
    });
  }

  // Returns once the thread has ended. Idempotent.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_PERIODIC_THREAD_H_
