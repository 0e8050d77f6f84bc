#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "common/flags.h"

namespace onlineps {
namespace {

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("SPDLOG_LEVEL"); }
  void TearDown() override {
    unsetenv("SPDLOG_LEVEL");
    spdlog::drop_all();  // leave no logger pointing at out_
    spdlog::set_default_logger(std::make_shared<spdlog::logger>(""));
  }

  Status Init(const std::string& level, const std::string& format) {
    LogOptions options;
    options.level = level;
    options.format = format;
    options.component = "ps";
    return InitLogging(options, std::make_shared<spdlog::sinks::ostream_sink_mt>(out_));
  }

  std::ostringstream out_;
};

TEST_F(LoggingTest, JsonEscapesQuotesBackslashesAndNewlines) {
  ASSERT_TRUE(Init("info", "json").ok());
  const std::string message = "say \"hi\"\\path\nnext\tline \x01 end";
  spdlog::info("{}", message);
  std::string line = out_.str();
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  line.pop_back();
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one object per line";
  nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["msg"], message);
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["component"], "ps");
  EXPECT_TRUE(std::regex_match(j["ts"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")))
      << j["ts"];
}

TEST_F(LoggingTest, JsonSurvivesInvalidUtf8) {
  ASSERT_TRUE(Init("info", "json").ok());
  spdlog::info("bad \xff byte");
  nlohmann::json j = nlohmann::json::parse(out_.str());
  EXPECT_NE(j["msg"].get<std::string>().find("bad "), std::string::npos);
}

TEST_F(LoggingTest, TextFormat) {
  ASSERT_TRUE(Init("debug", "text").ok());
  spdlog::warn("disk {}% full", 91);
  EXPECT_TRUE(std::regex_match(
      out_.str(),
      std::regex(R"(\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] \[warn\] \[ps\] disk 91% full\n)")))
      << out_.str();
}

TEST_F(LoggingTest, LevelFiltersMessages) {
  ASSERT_TRUE(Init("warn", "text").ok());
  spdlog::info("hidden");
  spdlog::error("shown");
  EXPECT_EQ(out_.str().find("hidden"), std::string::npos);
  EXPECT_NE(out_.str().find("shown"), std::string::npos);
}

TEST_F(LoggingTest, BadLevelOrFormatRejected) {
  Status s = Init("loud", "text");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("loud"), std::string::npos);
  EXPECT_EQ(Init("info", "xml").code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ParseLogLevel("warning").ok());
  EXPECT_FALSE(ParseLogLevel("").ok());
}

TEST_F(LoggingTest, SpdlogLevelEnvAppliesOnlyWhenLevelNotGiven) {
  setenv("SPDLOG_LEVEL", "ps=debug", 1);
  ASSERT_TRUE(Init("", "text").ok());
  spdlog::debug("from env");
  EXPECT_NE(out_.str().find("from env"), std::string::npos);

  out_.str("");
  ASSERT_TRUE(Init("info", "text").ok());
  spdlog::debug("explicit wins");
  EXPECT_EQ(out_.str().find("explicit wins"), std::string::npos);
}

TEST_F(LoggingTest, DefaultLevelIsInfo) {
  ASSERT_TRUE(Init("", "text").ok());
  spdlog::debug("hidden");
  spdlog::info("shown");
  EXPECT_EQ(out_.str().find("hidden"), std::string::npos);
  EXPECT_NE(out_.str().find("shown"), std::string::npos);
}

TEST_F(LoggingTest, FlagsValidateLevelAndFormat) {
  LogOptions options;
  CLI::App app("logging flags");
  AddLoggingFlags(app, &options);
  app.parse("--log-level warning --log-format json", false);
  EXPECT_EQ(options.level, "warning");
  EXPECT_EQ(options.format, "json");
  EXPECT_THROW(app.parse("--log-level loud", false), CLI::ValidationError);
  EXPECT_THROW(app.parse("--log-format xml", false), CLI::ValidationError);
}

}  // namespace
}  // namespace onlineps
