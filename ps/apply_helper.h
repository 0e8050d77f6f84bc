// ApplyHelper: one process-wide thread that runs a task beside its caller, so that a large
// sparse push or pull applies half of its lock stripes there while the caller applies the
// other half (two cores instead of one for a call's memory-bound apply). One task at a
// time: a caller that finds the helper busy (another call's half) runs its task itself.
// Thread-safe.
#ifndef ONLINEPS_PS_APPLY_HELPER_H_
#define ONLINEPS_PS_APPLY_HELPER_H_

#include <atomic>
#include <cstddef>
#include <functional>

namespace onlineps::ps {

class ApplyHelper {
 public:
  // The process's helper (started at its first use), or null on a machine with one core.
  static ApplyHelper* Get();

  // Hands `task` to the helper thread and returns true, or returns false (task not run)
  // when the helper is busy. After true, the caller must call Finish() before it returns
  // or starts another task.
  bool TryStart(std::function<void()> task);
  // Returns true once the task handed over by this caller's TryStart has run on the
  // helper, or false at once when the helper has not started it yet: it is taken back
  // and never runs (so a call never waits for a helper slow to wake; tasks share their
  // work with the caller, so nothing is left for it by then). Rethrows what the task
  // threw on the helper (std::bad_alloc), once the helper is free again.
  bool Finish();

  // Runs unit(0) .. unit(count - 1), each once, on the caller and, when it is free, the
  // helper thread, both taking units from one counter: when the helper is slow to start
  // the caller runs them all and takes the task back (never slower than alone). What a
  // unit throws on either thread is rethrown here after the helper has stopped using
  // this frame.
  template <typename Unit>
  void Share(size_t count, const Unit& unit) {
    std::atomic<size_t> next{0};
    auto share = [&] {
      for (size_t i; (i = next.fetch_add(1)) < count;) unit(i);
    };
    const bool started = TryStart(share);
    try {
      share();
    } catch (...) {
      next.store(count);  // none left for the helper; wait for its current one
      if (started) Finish();
      throw;
    }
    if (started) Finish();
  }

 private:
  ApplyHelper();
  struct State;
  State* const state_;  // never destroyed: the thread outlives static destruction
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_APPLY_HELPER_H_
