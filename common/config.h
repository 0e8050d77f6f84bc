// Command-line, environment and config-file configuration on top of CLI11.
// Precedence, highest first: command-line flag > ONLINEPS_* environment variable >
// config file (--config / ONLINEPS_CONFIG) > built-in default. See docs/configuration.md.
// Not thread-safe: call from main() before starting threads.
#ifndef ONLINEPS_COMMON_CONFIG_H_
#define ONLINEPS_COMMON_CONFIG_H_

#include <CLI/CLI.hpp>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace onlineps {

struct ParseResult {
  // --help, --help-all or --print-config was handled and its text written: the
  // caller should exit with status 0 without doing anything else.
  bool exit_now = false;
  // The config file that was read; empty when none was given.
  std::string config_file;
};

// Parses argv into the options the caller already added to `app`.
// Adds --config FILE and --print-config, names every long option's environment
// variable (--num-shards -> `env_prefix`NUM_SHARDS) unless it has one, loads the config
// file as option defaults, then lets CLI11 apply env and argv. Help and
// --print-config text goes to `out`. Never exits the process. Errors:
// kInvalidArgument (bad flag, value or file line, naming it), kNotFound (no file).
// Top-level options only; subcommand options get env names from CLI11 as usual.
// --config is read from `env_prefix`CONFIG (ONLINEPS_CONFIG with the default prefix; a
// binary with its own prefix, onlineps_replay, does not read the cluster's file).
StatusOr<ParseResult> ParseFlags(CLI::App& app, int argc, const char* const* argv,
                                 std::ostream& out = std::cout,
                                 const std::string& env_prefix = "ONLINEPS_");

// The effective value of every long option after ParseFlags, one `key = value` per
// line in config-file syntax (the output can be fed back with --config).
std::string EffectiveConfig(const CLI::App& app);

// Values of a repeated NAME=NUMBER flag (e.g. --opt-param lr=0.1) into `out`, later
// ones overriding earlier. kInvalidArgument naming `flag` and the bad item.
Status ParseNamedNumbers(const std::vector<std::string>& items, const std::string& flag,
                         std::map<std::string, double>* out);

// The environment variable ParseFlags gives a long option: "num-shards" ->
// "ONLINEPS_NUM_SHARDS" (with the default prefix).
std::string EnvNameForFlag(const std::string& long_name,
                           const std::string& env_prefix = "ONLINEPS_");

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_CONFIG_H_
