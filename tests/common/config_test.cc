#include "common/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace onlineps {
namespace {

// A server-like option set, bound to variables as callers do.
struct Flags {
  int num_shards = 1;
  std::string host = "0.0.0.0";
  bool verbose = false;
  std::vector<std::string> peers;
};

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kEnvNames) unsetenv(name);
    AddTestFlags(app_, &flags_);
  }

  static void AddTestFlags(CLI::App& app, Flags* f) {
    app.add_option("--num-shards", f->num_shards, "Shards");
    app.add_option("--host", f->host, "Bind host");
    app.add_flag("--verbose", f->verbose, "Chatty");
    app.add_option("--peers", f->peers, "Peer addresses");
  }

  // Reads a config file holding `text` into `f` through `app` (given the test's flags), as
  // another process would read what this one printed.
  StatusOr<ParseResult> ReadBack(const std::string& text, CLI::App* app, Flags* f) {
    AddTestFlags(*app, f);
    const std::string path = WriteFile(text);
    const char* argv[] = {"prog", "--config", path.c_str()};
    std::ostringstream out;
    return ParseFlags(*app, 3, argv, out);
  }
  void TearDown() override {
    for (const char* name : kEnvNames) unsetenv(name);
    for (const std::string& path : files_) std::remove(path.c_str());
  }

  std::string WriteFile(const std::string& text) {
    std::string path = ::testing::TempDir() + "config_test_" + std::to_string(getpid()) + "_" +
                       std::to_string(files_.size()) + ".toml";
    std::ofstream(path) << text;
    files_.push_back(path);
    return path;
  }

  StatusOr<ParseResult> Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    return ParseFlags(app_, static_cast<int>(argv.size()), argv.data(), out_);
  }

  static constexpr const char* kEnvNames[] = {"ONLINEPS_NUM_SHARDS", "ONLINEPS_HOST",
                                              "ONLINEPS_CONFIG", "ONLINEPS_VERBOSE"};
  CLI::App app_{"config test"};
  Flags flags_;
  std::ostringstream out_;
  std::vector<std::string> files_;
};

// A misspelt flag or subcommand is named as such, not reported as a missing required
// option or subcommand (which CLI11 checks first).
TEST_F(ConfigTest, UnknownFlagOrSubcommandIsNamedBeforeWhatIsMissing) {
  std::string needed;
  app_.add_option("--needed", needed, "Required")->required();
  auto flag = Parse({"--host", "h", "--no-such-flag"});
  EXPECT_EQ(flag.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(flag.status().message().find("unknown flag --no-such-flag"), std::string::npos)
      << flag.status().message();
  auto missing = Parse({"--verbose", "--host", "h"});  // known flags: the real error stays
  EXPECT_NE(missing.status().message().find("--needed is required"), std::string::npos)
      << missing.status().message();
}

TEST_F(ConfigTest, UnknownSubcommandIsNamedWithTheKnownOnes) {
  app_.add_subcommand("pull", "Pull");
  app_.add_subcommand("push", "Push");
  app_.require_subcommand(1);
  auto r = Parse({"--num-shards", "2", "pul"});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("unknown subcommand 'pul' (expected one of: pull, push)"),
            std::string::npos)
      << r.status().message();
  EXPECT_TRUE(Parse({"--num-shards", "2", "pull"}).ok());
}

TEST_F(ConfigTest, DefaultOnly) {
  StatusOr<ParseResult> r = Parse({});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->exit_now);
  EXPECT_EQ(flags_.num_shards, 1);
  EXPECT_EQ(flags_.host, "0.0.0.0");
}

TEST_F(ConfigTest, FileBeatsDefault) {
  std::string path = WriteFile("# shards\nnum-shards = 3\n\nhost = \"10.0.0.1\"  # bind\n");
  StatusOr<ParseResult> r = Parse({"--config", path});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config_file, path);
  EXPECT_EQ(flags_.num_shards, 3);
  EXPECT_EQ(flags_.host, "10.0.0.1");
}

TEST_F(ConfigTest, EnvBeatsFile) {
  setenv("ONLINEPS_NUM_SHARDS", "5", 1);
  setenv("ONLINEPS_CONFIG", WriteFile("num-shards = 3\n").c_str(), 1);
  StatusOr<ParseResult> r = Parse({});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(flags_.num_shards, 5);
}

// A binary with its own env prefix (onlineps_replay: ONLINEPS_REPLAY_) read the
// cluster's ONLINEPS_CONFIG, a file of other binaries' keys, and exited on its first
// key. It reads `prefix`CONFIG.
TEST_F(ConfigTest, TheConfigFileEnvFollowsThePrefix) {
  setenv("ONLINEPS_CONFIG", WriteFile("no-such-key = 1\n").c_str(), 1);
  setenv("ONLINEPS_TEST_CONFIG", WriteFile("num-shards = 6\n").c_str(), 1);
  const char* argv[] = {"prog"};
  StatusOr<ParseResult> r = ParseFlags(app_, 1, argv, out_, "ONLINEPS_TEST_");
  unsetenv("ONLINEPS_TEST_CONFIG");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(flags_.num_shards, 6);
  EXPECT_NE(r->config_file.find("config_test_"), std::string::npos) << r->config_file;
}

TEST_F(ConfigTest, FlagBeatsEnv) {
  setenv("ONLINEPS_NUM_SHARDS", "5", 1);
  std::string path = WriteFile("num-shards = 3\n");
  StatusOr<ParseResult> r = Parse({"--config=" + path, "--num-shards", "7"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(flags_.num_shards, 7);
}

TEST_F(ConfigTest, KebabAndSnakeKeysAreTheSame) {
  ASSERT_TRUE(Parse({"--config", WriteFile("num_shards = 4\n")}).ok());
  EXPECT_EQ(flags_.num_shards, 4);
}

TEST_F(ConfigTest, BoolFlagAndArrayFromFile) {
  std::string path = WriteFile("verbose = true\npeers = [\"a:1\", 'b:2']\n");
  StatusOr<ParseResult> r = Parse({"--config", path});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(flags_.verbose);
  EXPECT_EQ(flags_.peers, (std::vector<std::string>{"a:1", "b:2"}));
}

TEST_F(ConfigTest, EnvNameDerivedFromLongName) {
  EXPECT_EQ(EnvNameForFlag("num-shards"), "ONLINEPS_NUM_SHARDS");
  setenv("ONLINEPS_HOST", "127.0.0.1", 1);
  ASSERT_TRUE(Parse({}).ok());
  EXPECT_EQ(flags_.host, "127.0.0.1");
  EXPECT_EQ(app_.get_option("--host")->get_envname(), "ONLINEPS_HOST");
}

TEST_F(ConfigTest, UnknownKeyNamesFileLineAndSuggests) {
  std::string path = WriteFile("host = x\nnum-shard = 3\n");
  StatusOr<ParseResult> r = Parse({"--config", path});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(path + ":2"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'num-shard'"), std::string::npos);
  EXPECT_NE(r.status().message().find("did you mean 'num-shards'"), std::string::npos);
}

TEST_F(ConfigTest, MalformedLineNamesFileLine) {
  for (const std::string text : {"num-shards 3\n", "[server]\n", "host = \"open\n", "host =\n"}) {
    std::string path = WriteFile("# ok\n" + text);
    StatusOr<ParseResult> r = Parse({"--config", path});
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(path + ":2:"), std::string::npos) << r.status().message();
  }
}

TEST_F(ConfigTest, DuplicateKeyIsAnError) {
  StatusOr<ParseResult> r = Parse({"--config", WriteFile("num-shards = 2\nnum_shards = 3\n")});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("duplicate key"), std::string::npos);
}

TEST_F(ConfigTest, MissingFileIsNotFound) {
  StatusOr<ParseResult> r = Parse({"--config", "/nonexistent/onlineps.toml"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/onlineps.toml"), std::string::npos);
}

// A directory where the file should be (a ConfigMap mounted at the file's path) is an
// error, not an empty file that leaves every default in place.
TEST_F(ConfigTest, ADirectoryForTheConfigFileIsAnError) {
  const std::string dir = ::testing::TempDir() + "config_test_dir_" + std::to_string(getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  StatusOr<ParseResult> r = Parse({"--config", dir});
  ::rmdir(dir.c_str());
  ASSERT_FALSE(r.ok()) << "a directory was read as an empty config file";
  EXPECT_NE(r.status().message().find("is a directory"), std::string::npos) << r.status().message();
}

TEST_F(ConfigTest, BadFlagValueNamesTheFlag) {
  StatusOr<ParseResult> r = Parse({"--num-shards", "many"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--num-shards"), std::string::npos) << r.status().message();
}

TEST_F(ConfigTest, BadFileValueNamesFileLineAndKey) {
  std::string path = WriteFile("num-shards = many\n");
  StatusOr<ParseResult> r = Parse({"--config", path});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ":1"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("num-shards"), std::string::npos);
}

// An unsigned option takes plain decimal digits that fit: strtoull alone would read "-1"
// as 2^64-1 and clamp an overflow, from argv, the environment or a file alike.
TEST_F(ConfigTest, UnsignedOptionsRefuseNegativeAndOverflowingValues) {
  uint64_t interval = 7;
  size_t senders = 3;
  app_.add_option("--interval-s", interval, "Seconds");
  app_.add_option("--senders", senders, "Senders");
  for (const char* bad : {"-1", "99999999999999999999", "0x10", "+3", "1.5"}) {
    StatusOr<ParseResult> r = Parse({"--interval-s", bad});
    ASSERT_FALSE(r.ok()) << bad << " was taken as " << interval;
    EXPECT_NE(r.status().message().find("--interval-s"), std::string::npos) << r.status().message();
  }
  setenv("ONLINEPS_SENDERS", "-5", 1);
  StatusOr<ParseResult> env = Parse({});
  unsetenv("ONLINEPS_SENDERS");
  EXPECT_FALSE(env.ok()) << "-5 from the environment was taken as " << senders;
  const std::string path = WriteFile("senders = -7\n");
  EXPECT_FALSE(Parse({"--config", path}).ok()) << "-7 from a file was taken as " << senders;
  ASSERT_TRUE(Parse({"--interval-s", "18446744073709551615", "--senders", "0"}).ok());
  EXPECT_EQ(interval, UINT64_MAX);
  EXPECT_EQ(senders, 0u);
}

// Integers are decimal: CLI11 alone reads "010" as octal 8 and "0x10" as 16 (a port or a
// shard count quietly became another), and a signed option past 64 bits was clamped.
TEST_F(ConfigTest, IntegerOptionsAreDecimalFromEverySource) {
  int64_t offset = 0;
  uint64_t count = 0;
  app_.add_option("--offset", offset, "Signed");
  app_.add_option("--count", count, "Unsigned");
  for (const char* flag : {"--num-shards", "--offset", "--count"}) {
    for (const char* bad : {"010", "0x10", "00", "-0x1", "99999999999999999999999"}) {
      if (std::string(flag) != "--offset" && bad[0] == '-') continue;
      StatusOr<ParseResult> r = Parse({flag, bad});
      ASSERT_FALSE(r.ok()) << flag << " " << bad << " was taken";
      EXPECT_NE(r.status().message().find(flag), std::string::npos) << r.status().message();
    }
  }
  StatusOr<ParseResult> octal = Parse({"--num-shards", "010"});
  ASSERT_FALSE(octal.ok());
  EXPECT_NE(octal.status().message().find("decimal"), std::string::npos)
      << octal.status().message();
  setenv("ONLINEPS_NUM_SHARDS", "010", 1);
  EXPECT_FALSE(Parse({}).ok()) << "010 from the environment was taken as " << flags_.num_shards;
  unsetenv("ONLINEPS_NUM_SHARDS");
  EXPECT_FALSE(Parse({"--config", WriteFile("num-shards = 010\n")}).ok())
      << "010 from a file was taken as " << flags_.num_shards;
  ASSERT_TRUE(Parse({"--num-shards", "10", "--offset", "-12", "--count", "0"}).ok());
  EXPECT_EQ(flags_.num_shards, 10);
  EXPECT_EQ(offset, -12);
}

// A floating-point option takes a finite number (strtod reads "nan" and "inf"), checked
// beside the checks the option has already.
TEST_F(ConfigTest, FloatOptionsRefuseNanAndInf) {
  double rate = 0.5, norm = 1;
  app_.add_option("--rate", rate, "Rate");
  app_.add_option("--norm", norm, "Norm")->check(CLI::NonNegativeNumber);
  for (const char* bad : {"nan", "inf", "-inf", "NaN", "1e400"}) {
    for (const char* flag : {"--rate", "--norm"}) {
      StatusOr<ParseResult> r = Parse({flag, bad});
      ASSERT_FALSE(r.ok()) << flag << " " << bad << " was taken";
      EXPECT_NE(r.status().message().find(flag), std::string::npos) << r.status().message();
    }
  }
  ASSERT_TRUE(Parse({"--rate", "-2.5e3", "--norm", "0"}).ok());
  EXPECT_EQ(rate, -2500.0);
  EXPECT_EQ(norm, 0.0);
}

TEST_F(ConfigTest, UnknownFlagIsInvalidArgument) {
  StatusOr<ParseResult> r = Parse({"--nope"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--nope"), std::string::npos);
}

TEST_F(ConfigTest, PrintConfigShowsEffectiveValues) {
  setenv("ONLINEPS_HOST", "10.1.2.3", 1);
  std::string path = WriteFile("num-shards = 3\n");
  StatusOr<ParseResult> r = Parse({"--config", path, "--print-config", "--verbose"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->exit_now);
  const std::string out = out_.str();
  EXPECT_NE(out.find("num-shards = 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("host = 10.1.2.3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("verbose = true\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("print-config"), std::string::npos) << out;
  EXPECT_EQ(out, EffectiveConfig(app_));
}

// A CLI that needs a subcommand (onlineps_ps_cli) printed "A subcommand is required"
// for --print-config alone; the top-level configuration is printed, and the
// requirement still holds for everything else.
TEST_F(ConfigTest, PrintConfigNeedsNoSubcommand) {
  app_.add_subcommand("pull", "Pull");
  app_.require_subcommand(1);
  StatusOr<ParseResult> r = Parse({"--num-shards", "4", "--print-config"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->exit_now);
  EXPECT_NE(out_.str().find("num-shards = 4\n"), std::string::npos) << out_.str();
  CLI::App other("other");
  Flags flags;
  AddTestFlags(other, &flags);
  other.add_subcommand("pull", "Pull");
  other.require_subcommand(1);
  const char* argv[] = {"prog", "--num-shards", "4"};
  std::ostringstream out;
  StatusOr<ParseResult> without = ParseFlags(other, 3, argv, out);
  ASSERT_FALSE(without.ok());
  EXPECT_NE(without.status().message().find("subcommand"), std::string::npos)
      << without.status().ToString();
}

TEST_F(ConfigTest, PrintedConfigReadsBack) {
  ASSERT_TRUE(Parse({"--num-shards", "9", "--host", "my host", "--peers", "a", "b"}).ok());
  CLI::App again("again");
  Flags flags;
  StatusOr<ParseResult> r = ReadBack(EffectiveConfig(app_), &again, &flags);
  ASSERT_TRUE(r.ok()) << r.status().ToString() << "\n" << EffectiveConfig(app_);
  EXPECT_EQ(flags.num_shards, 9);
  EXPECT_EQ(flags.host, "my host");
  EXPECT_EQ(flags.peers, (std::vector<std::string>{"a", "b"}));
}

// What --print-config writes reads back for lists too: an empty one ("peers = []") was
// refused by options that need a value, and items with characters that need quotes were
// written as one quoted string "[a|b,c]" that read back as a single item.
TEST_F(ConfigTest, PrintedListsReadBackEmptyOrWithQuotedItems) {
  CLI::App app("lists");
  std::vector<std::string> required_list, shards;
  app.add_option("--members", required_list, "At least one when given")->expected(1, 8);
  app.add_option("--shards", shards, "Shards")->delimiter(',');
  const char* argv[] = {"prog", "--shards", "tcp://a:1|tcp://b:2,tcp://c:3"};
  ASSERT_TRUE(ParseFlags(app, 3, argv, out_).ok());
  const std::string printed = EffectiveConfig(app);
  EXPECT_NE(printed.find("members = []"), std::string::npos) << printed;
  const std::string path = WriteFile(printed);
  CLI::App again("again");
  std::vector<std::string> members2, shards2;
  again.add_option("--members", members2, "")->expected(1, 8);
  again.add_option("--shards", shards2, "")->delimiter(',');
  const char* argv2[] = {"prog", "--config", path.c_str()};
  StatusOr<ParseResult> r = ParseFlags(again, 3, argv2, out_);
  ASSERT_TRUE(r.ok()) << r.status().ToString() << "\n" << printed;
  EXPECT_TRUE(members2.empty());
  EXPECT_EQ(shards2, (std::vector<std::string>{"tcp://a:1|tcp://b:2", "tcp://c:3"})) << printed;
}

// `!--no-cache` (giving it turns caching off) means the same from every source: CLI11 2.1
// alone would take ONLINEPS_NO_CACHE=true, or `no-cache = true` in a file, as cache = true.
TEST_F(ConfigTest, NegatedFlagMeansTheSameFromArgvEnvAndFile) {
  struct Case {
    std::vector<std::string> args;
    const char* env;  // ONLINEPS_NO_CACHE, or null
    const char* file;
    bool cache;
  };
  const std::vector<Case> cases = {
      {{}, nullptr, nullptr, true},
      {{"--no-cache"}, nullptr, nullptr, false},
      {{}, "true", nullptr, false},
      {{}, "1", nullptr, false},
      {{}, "false", nullptr, true},
      {{}, nullptr, "no-cache = true\n", false},
      {{}, nullptr, "no-cache = false\n", true},
      {{}, "false", "no-cache = true\n", true},   // env beats the file
      {{"--no-cache"}, "false", nullptr, false},  // argv beats env
  };
  for (const Case& c : cases) {
    const std::string what = std::string("env ") + (c.env ? c.env : "unset") + ", file " +
                             (c.file ? c.file : "none") + ", args " + std::to_string(c.args.size());
    c.env ? setenv("ONLINEPS_NO_CACHE", c.env, 1) : unsetenv("ONLINEPS_NO_CACHE");
    std::vector<std::string> args = c.args;
    if (c.file) args.insert(args.begin(), {"--config", WriteFile(c.file)});
    args.insert(args.begin(), "prog");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    CLI::App app("negated");
    bool cache = true;
    app.add_flag("!--no-cache", cache, "Do not cache");
    StatusOr<ParseResult> r = ParseFlags(app, static_cast<int>(argv.size()), argv.data(), out_);
    ASSERT_TRUE(r.ok()) << what << ": " << r.status().ToString();
    EXPECT_EQ(cache, c.cache) << what;
    // What --print-config says reads back to the same value.
    const std::string printed = EffectiveConfig(app);
    EXPECT_NE(printed.find(c.cache ? "no-cache = false" : "no-cache = true"), std::string::npos)
        << what << ": " << printed;
    unsetenv("ONLINEPS_NO_CACHE");
    CLI::App again("again");
    bool cache2 = !c.cache;
    again.add_flag("!--no-cache", cache2, "Do not cache");
    const std::string path = WriteFile(printed);
    const char* argv2[] = {"prog", "--config", path.c_str()};
    ASSERT_TRUE(ParseFlags(again, 3, argv2, out_).ok()) << what;
    EXPECT_EQ(cache2, c.cache) << what << ": printed config read back";
    // --help still names the variable.
    EXPECT_NE(app.help().find("ONLINEPS_NO_CACHE"), std::string::npos);
  }
  setenv("ONLINEPS_NO_CACHE", "maybe", 1);
  CLI::App app("negated");
  bool cache = true;
  app.add_flag("!--no-cache", cache, "Do not cache");
  const char* argv[] = {"prog"};
  StatusOr<ParseResult> r = ParseFlags(app, 1, argv, out_);
  unsetenv("ONLINEPS_NO_CACHE");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("ONLINEPS_NO_CACHE='maybe'"), std::string::npos)
      << r.status().ToString();
}

TEST_F(ConfigTest, HelpIsReportedNotExited) {
  StatusOr<ParseResult> r = Parse({"--help"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->exit_now);
  EXPECT_NE(out_.str().find("--num-shards"), std::string::npos);
  EXPECT_NE(out_.str().find("--config"), std::string::npos);
}

TEST_F(ConfigTest, RequiredOptionSatisfiedByFile) {
  std::string role;
  app_.add_option("--role", role)->required();
  ASSERT_TRUE(Parse({"--config", WriteFile("role = ps\n")}).ok());
  EXPECT_EQ(role, "ps");
}

// Config-file arrays whose quoted items hold '#' or escapes read whole (they were cut at
// the '#' and kept their escapes, so --print-config output did not read back), and a file
// saved with a UTF-8 BOM reads (its first key was refused as 'bad key').
TEST_F(ConfigTest, AQuotedArrayItemWithAHashReadsWhole) {
  auto r = Parse({"--config", WriteFile("peers = [\"host-a#1\", \"host-b\"]\n")});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(flags_.peers, (std::vector<std::string>{"host-a#1", "host-b"}));
}

TEST_F(ConfigTest, QuotedArrayItemEscapesAreDecoded) {
  auto r = Parse({"--config", WriteFile("peers = [\"a\\\"b\", \"c\"]\n")});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(flags_.peers, (std::vector<std::string>{"a\"b", "c"}));
}

TEST_F(ConfigTest, PrintConfigRoundTripsAListItemWithAHash) {
  auto r = Parse({"--peers", "host-a#1", "--peers", "host-b", "--print-config"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::string printed = out_.str();
  CLI::App again{"again"};
  Flags f2;
  auto r2 = ReadBack(printed, &again, &f2);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString() << "\nprinted:\n" << printed;
  EXPECT_EQ(f2.peers, flags_.peers) << "printed:\n" << printed;
  // And once more from the file's own --print-config (values that came from a file).
  CLI::App third{"third"};
  Flags f3;
  auto r3 = ReadBack(EffectiveConfig(again), &third, &f3);
  ASSERT_TRUE(r3.ok()) << r3.status().ToString();
  EXPECT_EQ(f3.peers, flags_.peers) << EffectiveConfig(again);
}

TEST_F(ConfigTest, AUtf8BomBeforeTheFirstKeyIsAccepted) {
  auto r = Parse({"--config", WriteFile("\xEF\xBB\xBFnum-shards = 3\n")});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(flags_.num_shards, 3);
}

}  // namespace
}  // namespace onlineps
