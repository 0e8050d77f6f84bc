#include "ps/apply_helper.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

namespace onlineps::ps {

namespace {
// The state word: the task's generation (which TryStart handed it over) times 4, plus
// its phase. The generation keeps a helper that took a task late (after its caller took
// it back) from running it when a later task is pending.
enum Phase : uint64_t { kIdle, kPending, kRunning, kDone };
constexpr uint64_t Word(uint64_t gen, Phase p) { return gen << 2 | p; }
}  // namespace

struct ApplyHelper::State {
  std::mutex mu;
  std::condition_variable wake;
  std::function<void()> task;  // set while pending
  uint64_t task_gen = 0;       // the generation of `task`
  std::exception_ptr error;    // what the running task threw; read by Finish after kDone
  std::atomic<uint64_t> word{Word(0, kIdle)};
};

ApplyHelper::ApplyHelper() : state_(new State) {
  std::thread([s = state_] {
    for (;;) {
      std::function<void()> task;
      uint64_t gen;
      {
        std::unique_lock<std::mutex> lock(s->mu);
        s->wake.wait(lock, [&] { return static_cast<bool>(s->task); });
        task = std::move(s->task);
        s->task = nullptr;
        gen = s->task_gen;
      }
      uint64_t pending = Word(gen, kPending);
      if (!s->word.compare_exchange_strong(pending, Word(gen, kRunning),
                                           std::memory_order_acq_rel)) {
        continue;  // taken back by its caller
      }
      try {
        task();
      } catch (...) {
        s->error = std::current_exception();  // rethrown by the caller's Finish
      }
      s->word.store(Word(gen, kDone), std::memory_order_release);
    }
  }).detach();
}

ApplyHelper* ApplyHelper::Get() {
  static ApplyHelper* helper =
      std::thread::hardware_concurrency() > 1 ? new ApplyHelper() : nullptr;
  return helper;
}

bool ApplyHelper::TryStart(std::function<void()> task) {
  uint64_t w = state_->word.load(std::memory_order_acquire);
  if ((w & 3) != kIdle) return false;
  const uint64_t gen = (w >> 2) + 1;
  if (!state_->word.compare_exchange_strong(w, Word(gen, kPending), std::memory_order_acq_rel)) {
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->task = std::move(task);
    state_->task_gen = gen;
  }
  state_->wake.notify_one();
  return true;
}

bool ApplyHelper::Finish() {
  uint64_t w = state_->word.load(std::memory_order_acquire);
  const uint64_t gen = w >> 2;
  uint64_t pending = Word(gen, kPending);
  if (state_->word.compare_exchange_strong(pending, Word(gen, kIdle), std::memory_order_acq_rel)) {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->task_gen == gen) state_->task = nullptr;  // not taken yet: drop it
    return false;
  }
  // Running: the work it has left is small (see ForEachKeyByStripe). Spin, yielding
  // the core, rather than sleep on a futex (a wake-up costs tens of microseconds here).
  while (state_->word.load(std::memory_order_acquire) != Word(gen, kDone)) {
    std::this_thread::yield();
  }
  std::exception_ptr error = std::exchange(state_->error, nullptr);
  state_->word.store(Word(gen, kIdle), std::memory_order_release);
  if (error) std::rethrow_exception(error);
  return true;
}

}  // namespace onlineps::ps
