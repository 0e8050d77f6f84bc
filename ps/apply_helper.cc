#include "ps/apply_helper.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace onlineps::ps {

struct ApplyHelper::State {
  std::mutex mu;
  std::condition_variable wake;
  std::function<void()> task;  // set while pending or running
  std::atomic<bool> busy{false};
  std::atomic<bool> done{false};
};

ApplyHelper::ApplyHelper() : state_(new State) {
  std::thread([s = state_] {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(s->mu);
        s->wake.wait(lock, [&] { return static_cast<bool>(s->task); });
        task = std::move(s->task);
        s->task = nullptr;
      }
      task();
      s->done.store(true, std::memory_order_release);
    }
  }).detach();
}

ApplyHelper* ApplyHelper::Get() {
  static ApplyHelper* helper =
      std::thread::hardware_concurrency() > 1 ? new ApplyHelper() : nullptr;
  return helper;
}

bool ApplyHelper::TryStart(std::function<void()> task) {
  if (state_->busy.exchange(true, std::memory_order_acquire)) return false;
  state_->done.store(false, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->task = std::move(task);
  }
  state_->wake.notify_one();
  return true;
}

void ApplyHelper::Wait() {
  // The caller's own half took about as long as the helper's: its end is near. Spin,
  // yielding the core, rather than sleep on a futex (a wake-up costs tens of
  // microseconds here).
  while (!state_->done.load(std::memory_order_acquire)) std::this_thread::yield();
  state_->busy.store(false, std::memory_order_release);
}

}  // namespace onlineps::ps
