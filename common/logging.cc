#include "common/logging.h"

#include <spdlog/cfg/env.h>
#include <spdlog/formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

namespace onlineps {
namespace {

// Our own names: spdlog's are "warning"/"critical" and differ from the flag values.
constexpr std::array<std::string_view, 7> kLevelNames = {"trace", "debug",    "info", "warn",
                                                         "error", "critical", "off"};

// "2026-12-02T12:00:00.123Z"; UTC so lines from pods in any zone sort together.
std::string Iso8601Utc(std::chrono::system_clock::time_point t) {
  using std::chrono::milliseconds;
  const auto since_epoch = std::chrono::floor<milliseconds>(t.time_since_epoch());
  const auto secs = std::chrono::floor<std::chrono::seconds>(since_epoch);
  const std::time_t tt = static_cast<std::time_t>(secs.count());
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[40];
  size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof(buf) - n, ".%03dZ", static_cast<int>((since_epoch - secs).count()));
  return buf;
}

// A JSON string literal. nlohmann escapes quotes, backslashes and control characters,
// and replaces invalid UTF-8 instead of throwing, so a log line is always valid JSON.
std::string JsonString(std::string_view s) {
  return nlohmann::json(std::string(s))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void Append(spdlog::memory_buf_t& dest, std::string_view s) {
  dest.append(s.data(), s.data() + s.size());
}

// A pattern_formatter cannot escape %v, hence a formatter of our own.
class LineFormatter : public spdlog::formatter {
 public:
  explicit LineFormatter(bool json) : json_(json) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::string_view level = kLevelNames[static_cast<size_t>(msg.level)];
    const std::string_view component(msg.logger_name.data(), msg.logger_name.size());
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    const std::string ts = Iso8601Utc(msg.time);
    if (json_) {
      Append(dest, "{\"ts\":\"" + ts + "\",\"level\":\"");
      Append(dest, level);
      Append(dest, "\",\"component\":" + JsonString(component) + ",\"msg\":");
      Append(dest, JsonString(payload));
      Append(dest, "}\n");
    } else {
      Append(dest, "[" + ts + "] [");
      Append(dest, level);
      Append(dest, "] [");
      Append(dest, component);
      Append(dest, "] ");
      Append(dest, payload);
      Append(dest, "\n");
    }
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<LineFormatter>(json_);
  }

 private:
  const bool json_;
};

}  // namespace

StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name) {
  if (name == "warning") return spdlog::level::warn;
  for (size_t i = 0; i < kLevelNames.size(); ++i) {
    if (name == kLevelNames[i]) return static_cast<spdlog::level::level_enum>(i);
  }
  return InvalidArgument("bad log level '" + name +
                         "': want trace, debug, info, warn, error, critical or off");
}

Status InitLogging(const LogOptions& options, spdlog::sink_ptr sink) {
  if (options.format != "text" && options.format != "json") {
    return InvalidArgument("bad log format '" + options.format + "': want text or json");
  }
  spdlog::level::level_enum level = spdlog::level::info;
  if (!options.level.empty()) {
    ONLINEPS_ASSIGN_OR_RETURN(level, ParseLogLevel(options.level));
  }
  if (sink == nullptr) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(options.component, std::move(sink));
  logger->set_formatter(std::make_unique<LineFormatter>(options.format == "json"));
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  try {
    spdlog::set_default_logger(logger);
    // After registration, so SPDLOG_LEVEL's per-logger entries ("ps=debug") apply.
    if (options.level.empty()) spdlog::cfg::load_env_levels();
  } catch (const std::exception& e) {
    return Internal(std::string("logging setup: ") + e.what());
  }
  return Status::Ok();
}

}  // namespace onlineps
