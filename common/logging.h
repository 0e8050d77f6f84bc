// Process-wide logging on spdlog: one default logger named after the component,
// writing UTC ISO-8601 lines to stderr as text or as one JSON object per line.
// Call InitLogging once from main() before starting threads; logging afterwards
// (spdlog::info etc.) is thread-safe.
#ifndef ONLINEPS_COMMON_LOGGING_H_
#define ONLINEPS_COMMON_LOGGING_H_

#include <spdlog/common.h>

#include <string>

#include "common/status.h"

namespace onlineps {

struct LogOptions {
  // trace, debug, info, warn (or warning), error, critical, off. Empty means "not
  // given": SPDLOG_LEVEL (e.g. "info" or "ps=debug,worker=warn") applies if set,
  // else info. An explicit level always beats SPDLOG_LEVEL.
  std::string level;
  // "text": `[2026-12-02T12:00:00.123Z] [info] [ps] message`;
  // "json": `{"ts":"...Z","level":"info","component":"ps","msg":"..."}`.
  std::string format = "text";
  // Logger name, e.g. "ps", "worker"; shown in every line.
  std::string component;
};

// Installs the default spdlog logger. `sink` receives every line; nullptr means
// stderr (tests pass an ostream_sink). kInvalidArgument on a bad level or format,
// leaving the previous logger in place.
Status InitLogging(const LogOptions& options, spdlog::sink_ptr sink = nullptr);

// "warn" -> spdlog::level::warn; kInvalidArgument naming the accepted names.
StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_LOGGING_H_
