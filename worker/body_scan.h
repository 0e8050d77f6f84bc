// ScanBody: checks a msgpack request body against RequestLimits before it is decoded.
// nlohmann::json::from_msgpack builds a DOM that can be ~50 times the body's size (a
// 1-byte empty map becomes a heap-allocated std::map) and copies strings a byte at a
// time (~35 ms per MiB), so neither the body's size nor decoding it first bounds the
// work: this scan counts values and reads string lengths without copying anything.
#ifndef ONLINEPS_WORKER_BODY_SCAN_H_
#define ONLINEPS_WORKER_BODY_SCAN_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "worker/request_limits.h"

namespace onlineps::worker {

// kTooLarge, naming the limit and its flag, when the body holds a string (value or key)
// longer than max_text_bytes (naming its place, e.g. "examples[3].text"), more numbers
// than limits.MaxBodyNumbers() or more other values than limits.MaxBodyOtherValues().
// Otherwise OK, also for invalid or truncated msgpack (the decoder refuses it). When
// `session` is given, it is set to the body's top-level "session" string, if it has one
// (a view into p[0..n)), so that requests can be routed without decoding them.
// REQUIRES: the body nests at most 64 levels (MsgpackNestsDeeperThan).
Status ScanBody(const uint8_t* p, size_t n, const RequestLimits& limits,
                std::string_view* session = nullptr);

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_BODY_SCAN_H_
