// Guarded: runs a call that may throw (libtorch, JSON, msgpack, an allocation) and turns
// what it throws into INTERNAL naming the call, at the worker's boundaries: no exception
// may skip the bookkeeping after the call (a session's turn, a batch's waiters, a reply).
#ifndef ONLINEPS_WORKER_GUARDED_H_
#define ONLINEPS_WORKER_GUARDED_H_

#include <exception>
#include <string>
#include <string_view>

#include "common/status.h"

namespace onlineps::worker {

// `f` returns a Status or a StatusOr; so does Guarded.
template <typename F>
auto Guarded(std::string_view what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Internal(std::string(what) + " failed: " + e.what());
  } catch (...) {
    return Internal(std::string(what) + " failed: a non-standard exception");
  }
}

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_GUARDED_H_
