// Await: runs an asynchronous operation and blocks the calling thread until the
// operation's callback delivers its value (once, from any thread, or from inside
// `start` itself). The synchronous forms of the bridge's asynchronous calls are this.
#ifndef ONLINEPS_COMMON_AWAIT_H_
#define ONLINEPS_COMMON_AWAIT_H_

#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "common/mutex.h"

namespace onlineps {

// `start` receives the callback to call with the result; Await returns that result.
template <typename T, typename Start>
T Await(Start&& start) {
  struct State {
    Mutex mu;
    CondVar cv;
    std::optional<T> value GUARDED_BY(mu);
  };
  auto s = std::make_shared<State>();
  std::forward<Start>(start)(std::function<void(T)>([s](T v) {
    {
      MutexLock lock(&s->mu);
      s->value.emplace(std::move(v));
    }
    s->cv.SignalAll();
  }));
  MutexLock lock(&s->mu);
  s->cv.Wait(&s->mu, [&]() REQUIRES(s->mu) { return s->value.has_value(); });
  return std::move(*s->value);
}

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_AWAIT_H_
