// Running a small request on the thread that received it (the ZeroMQ server's I/O thread,
// or a mem:// sender's own thread): shared by both server transports.
#ifndef ONLINEPS_COMMON_INLINE_REQUEST_H_
#define ONLINEPS_COMMON_INLINE_REQUEST_H_

#include <cstddef>
#include <utility>

#include "common/handler_pool.h"
#include "common/transport.h"

namespace onlineps {

// Runs `in` on the calling thread when its frames hold at most `max_bytes` and lane `key`
// of `pool` is idle, with Incoming::requeue set to hand it, unanswered, to that lane (queued
// behind the inline run, so the peer's order holds) if the Handler must not wait. True when
// it ran; otherwise `in` is unchanged (requeue empty) for the caller to Submit.
inline bool RunInlineIfIdle(HandlerPool<Incoming>* pool, size_t key, size_t max_bytes,
                            Incoming& in) {
  size_t bytes = 0;
  for (const Frame& f : in.frames) bytes += f.size();
  if (bytes > max_bytes) return false;
  in.requeue = [pool, key](Incoming&& again) {
    again.requeue = nullptr;
    pool->Submit(key, std::move(again));
  };
  if (pool->TryRunInline(key, in)) return true;
  in.requeue = nullptr;
  return false;
}

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_INLINE_REQUEST_H_
