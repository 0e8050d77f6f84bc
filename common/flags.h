// The flags every binary shares, on CLI11 (library onlineps_flags, with config.h):
// --log-level / --log-format (common/logging.h) and the CURVE key files
// (common/curve.h). Libraries that only move messages (the PS and worker clients)
// link onlineps_common alone and never see CLI11.
#ifndef ONLINEPS_COMMON_FLAGS_H_
#define ONLINEPS_COMMON_FLAGS_H_

#include <CLI/CLI.hpp>
#include <string>

#include "common/curve.h"
#include "common/logging.h"
#include "common/status.h"

namespace onlineps {

// A check that a number lies in [lo, hi] (hi infinite: no upper bound), with a message
// that reads well for fractions and huge bounds (CLI::Range and CLI::NonNegativeNumber
// print doubles with %f: 0.000000 to 1797693134862315708145...).
CLI::Validator NumberIn(double lo, double hi);

// The range every --*-timeout-ms flag of a call's deadline takes: 1 ms to 1 hour (0 and
// negative values would fail every call later as "no answer in -1 ms").
inline CLI::Range TimeoutMs() { return CLI::Range(1, 3600000); }

// The range of a lifetime in seconds (idle limits, TTLs): `lo` to 100 years. Longer ones
// overflow once compared in nanoseconds, and wrapped into the past: every session or
// context counted as expired at once.
inline CLI::Range LifetimeS(int64_t lo) { return CLI::Range(lo, int64_t{100} * 365 * 86400); }

// Adds --log-level and --log-format bound to `options` (which must outlive `app`).
void AddLoggingFlags(CLI::App& app, LogOptions* options);

// The three flags; `server` adds --curve-allow, `client` adds --curve-server-key.
struct CurveFlags {
  std::string cert, server_key, allow;
};
void AddCurveFlags(CLI::App& app, CurveFlags* f, bool server, bool client);
// Loads the files the flags name. --curve-server-key or --curve-allow without
// --curve-cert is an error (CURVE needs this process's own key pair).
StatusOr<CurveOptions> LoadCurve(const CurveFlags& f);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_FLAGS_H_
