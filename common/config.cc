#include "common/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

namespace onlineps {
namespace {

constexpr char kConfigFlag[] = "--config";
constexpr char kPrintConfigFlag[] = "--print-config";

struct FileEntry {
  std::string key;  // as written in the file
  std::string value;
  int line = 0;
};

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string Replace(std::string s, char from, char to) {
  std::replace(s.begin(), s.end(), from, to);
  return s;
}

// Reads a "..." (with TOML basic escapes) or '...' (literal) string at the start of
// `rest`; *end is then the index just past its closing quote. nullopt when unterminated
// or for an unknown escape.
std::optional<std::string> ScanQuoted(std::string_view rest, size_t* end) {
  const char quote = rest[0];
  std::string value;
  size_t i = 1;
  for (; i < rest.size() && rest[i] != quote; ++i) {
    if (quote == '"' && rest[i] == '\\' && i + 1 < rest.size()) {
      const char c = rest[++i];
      const char* from = "nrt\"\\";
      const char* to = "\n\r\t\"\\";
      const char* hit = c != '\0' ? std::strchr(from, c) : nullptr;
      if (hit == nullptr) return std::nullopt;
      value += to[hit - from];
    } else {
      value += rest[i];
    }
  }
  if (i >= rest.size()) return std::nullopt;  // unterminated
  *end = i + 1;
  return value;
}

// Parses a quoted value (ScanQuoted) at the start of `rest`; anything after the closing
// quote must be a comment.
std::optional<std::string> ParseQuoted(std::string_view rest) {
  size_t end = 0;
  std::optional<std::string> value = ScanQuoted(rest, &end);
  if (!value) return std::nullopt;
  std::string_view tail = Trim(rest.substr(end));
  if (!tail.empty() && tail[0] != '#') return std::nullopt;
  return value;
}

// TOML arrays `["a", "b"]` become CLI11's vector default syntax `[a,b]`.
std::string NormalizeArray(std::string_view bare) {
  std::string out = "[";
  std::string_view items = bare.substr(1, bare.size() - 2);
  while (!items.empty()) {
    size_t comma = items.find(',');
    std::string_view item = Trim(items.substr(0, comma));
    if (item.size() >= 2 && (item[0] == '"' || item[0] == '\'') && item.back() == item[0]) {
      item = item.substr(1, item.size() - 2);
    }
    if (!item.empty()) out += (out.size() > 1 ? "," : "") + std::string(item);
    items = comma == std::string_view::npos ? std::string_view() : items.substr(comma + 1);
  }
  return out + "]";
}

// A one-line array `[a, "b#c", 'd']` at the start of `rest`, as CLI11's `[a,b#c,d]`;
// nullopt when `rest` is not one (then it is read as a plain value). Quoted items may hold
// '#' and escapes; no item may hold ',' (CLI11 splits on it).
std::optional<std::string> ParseArray(std::string_view rest) {
  std::string out = "[";
  size_t i = 1;
  bool first = true;
  auto skip_ws = [&] {
    while (i < rest.size() && (rest[i] == ' ' || rest[i] == '\t')) ++i;
  };
  for (;;) {
    skip_ws();
    if (i >= rest.size()) return std::nullopt;
    if (rest[i] == ']' && first) {
      ++i;
      break;
    }
    std::string item;
    if (rest[i] == '"' || rest[i] == '\'') {
      size_t end = 0;
      std::optional<std::string> quoted = ScanQuoted(rest.substr(i), &end);
      if (!quoted) return std::nullopt;
      item = std::move(*quoted);
      i += end;
    } else {
      const size_t j = rest.find_first_of(",]#", i);
      if (j == std::string_view::npos || rest[j] == '#') return std::nullopt;
      item = std::string(Trim(rest.substr(i, j - i)));
      i = j;
    }
    if (item.find(',') != std::string::npos) return std::nullopt;
    if (!item.empty()) {
      out += (first ? "" : ",") + item;
      first = false;
    }
    skip_ws();
    if (i < rest.size() && rest[i] == ',') {
      ++i;
      continue;
    }
    if (i < rest.size() && rest[i] == ']') {
      ++i;
      break;
    }
    return std::nullopt;
  }
  std::string_view tail = Trim(rest.substr(i));
  if (!tail.empty() && tail[0] != '#') return std::nullopt;
  return out + "]";
}

// Returns the value of `rest` (the text after '='), or an error message.
StatusOr<std::string> ParseValue(std::string_view rest) {
  if (rest.empty() || rest[0] == '#') return InvalidArgument("missing value after '='");
  if (rest[0] == '[') {
    if (std::optional<std::string> array = ParseArray(rest)) return *array;
  }
  if (rest[0] == '"' || rest[0] == '\'') {
    std::optional<std::string> quoted = ParseQuoted(rest);
    if (!quoted) return InvalidArgument("bad quoted value: " + std::string(rest));
    return *quoted;
  }
  std::string_view bare = Trim(rest.substr(0, rest.find('#')));
  if (bare.size() >= 2 && bare.front() == '[' && bare.back() == ']') return NormalizeArray(bare);
  return std::string(bare);
}

bool IsKey(std::string_view key) {
  return !key.empty() && std::all_of(key.begin(), key.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_';
  });
}

// One line of the file: nullopt for blank and comment lines.
StatusOr<std::optional<FileEntry>> ParseLine(std::string_view raw, int line_no) {
  std::string_view line = Trim(raw);
  if (line.empty() || line[0] == '#') return std::optional<FileEntry>();
  if (line[0] == '[') {
    return InvalidArgument("[section] headers are not supported; write flat `key = value` lines");
  }
  size_t eq = line.find('=');
  if (eq == std::string_view::npos) {
    return InvalidArgument("expected `key = value`, got '" + std::string(line) + "'");
  }
  std::string_view key = Trim(line.substr(0, eq));
  if (!IsKey(key)) return InvalidArgument("bad key '" + std::string(key) + "'");
  StatusOr<std::string> value = ParseValue(Trim(line.substr(eq + 1)));
  if (!value.ok()) return value.status();
  return std::optional<FileEntry>(FileEntry{std::string(key), std::move(value).value(), line_no});
}

StatusOr<std::vector<FileEntry>> ReadConfigFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return NotFound("config file '" + path + "' not found");
  }
  // A directory opens as a stream that reads nothing: it would pass as an empty file
  // (a Kubernetes ConfigMap mounted at the file's path is a directory).
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgument("config file '" + path + "' is a directory");
  }
  std::ifstream in(path);
  if (!in) return InvalidArgument("cannot read config file '" + path + "'");
  std::vector<FileEntry> entries;
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    // A UTF-8 byte order mark, as some Windows editors save a file.
    if (line_no == 1 && raw.rfind("\xEF\xBB\xBF", 0) == 0) raw.erase(0, 3);
    StatusOr<std::optional<FileEntry>> entry = ParseLine(raw, line_no);
    if (!entry.ok()) return entry.status().WithContext(path + ":" + std::to_string(line_no));
    if (entry.value()) entries.push_back(std::move(*entry.value()));
  }
  if (in.bad()) return InvalidArgument("cannot read config file '" + path + "'");
  return entries;
}

// Options the user may not set from a file or env: they control parsing itself.
bool IsBuiltin(const CLI::App& app, const CLI::Option* opt) {
  return opt == app.get_help_ptr() || opt == app.get_help_all_ptr() ||
         opt->check_name(kConfigFlag) || opt->check_name(kPrintConfigFlag);
}

// A negated flag (`!--no-x`: giving it sets x = false). CLI11 2.1 inverts the value of
// such a flag on the command line (--no-x=true sets x = false) but not from env or a
// default: ONLINEPS_NO_X=true would set x = true. Their env and file values, and what
// --print-config prints for them, go through the flag's own inversion here.
bool IsNegatedFlag(const CLI::Option& opt) {
  return !opt.get_lnames().empty() && opt.get_expected_max() == 0 &&
         opt.get_flag_value(opt.get_lnames()[0], "") == "false";
}

// `value` as the option's value (for a negated flag: the value of the flag itself).
std::string OptionValue(const CLI::Option& opt, const std::string& value) {
  return IsNegatedFlag(opt) ? opt.get_flag_value(opt.get_lnames()[0], value) : value;
}

// Installs `value` as the option's default, below env and argv in precedence.
void SetDefault(CLI::Option* opt, const std::string& value) {
  opt->default_val(OptionValue(*opt, value));
  // Options without a bound variable only see a default through a forced callback;
  // a value from the file or env satisfies `required`.
  if (!opt->get_run_callback_for_default()) opt->force_callback();
  opt->required(false);
}

// While alive: negated flags read from env by SetDefault, with CLI11's own env reading
// of them off (restored after, so --help still names their variables).
class NegatedFlagEnv {
 public:
  explicit NegatedFlagEnv(CLI::App& app) {
    for (CLI::Option* opt : app.get_options()) {
      if (!IsNegatedFlag(*opt) || opt->get_envname().empty()) continue;
      const std::string name = opt->get_envname();
      saved_.emplace_back(opt, name);
      opt->envname("");
      const char* v = std::getenv(name.c_str());
      if (v == nullptr || *v == '\0') continue;  // empty counts as unset, as in CLI11
      try {
        SetDefault(opt, v);
      } catch (const CLI::Error& e) {
        error_ = InvalidArgument("environment variable " + name + "='" + v + "' for --" +
                                 opt->get_lnames()[0] + ": " + e.what());
      }
    }
  }
  ~NegatedFlagEnv() {
    for (auto& [opt, name] : saved_) opt->envname(name);
  }
  const Status& error() const { return error_; }

 private:
  std::vector<std::pair<CLI::Option*, std::string>> saved_;
  Status error_;
};

// Long options are usually kebab-case but may be snake_case; accept either spelling.
CLI::Option* FindFileOption(CLI::App& app, const std::string& key) {
  for (const std::string& name : {Replace(key, '_', '-'), Replace(key, '-', '_')}) {
    CLI::Option* opt = app.get_option_no_throw("--" + name);
    if (opt != nullptr && !IsBuiltin(app, opt)) return opt;
  }
  return nullptr;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// " (did you mean 'num-shards'?)" for the closest long option within 2 edits.
std::string Suggestion(const CLI::App& app, const std::string& key) {
  const std::string wanted = Replace(key, '_', '-');
  std::string best;
  size_t best_distance = 3;
  for (const CLI::Option* opt : app.get_options()) {
    if (IsBuiltin(app, opt) || opt->get_lnames().empty()) continue;
    const std::string name = Replace(opt->get_lnames()[0], '_', '-');
    size_t d = EditDistance(wanted, name);
    if (d < best_distance) {
      best_distance = d;
      best = name;
    }
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

// The file value becomes the option's default, so env and argv still override it.
Status ApplyEntry(CLI::App& app, const FileEntry& entry, const std::string& path) {
  const std::string where = path + ":" + std::to_string(entry.line);
  CLI::Option* opt = FindFileOption(app, entry.key);
  if (opt == nullptr) {
    return InvalidArgument(where + ": unknown key '" + entry.key + "'" +
                           Suggestion(app, entry.key));
  }
  // An empty list (what --print-config writes for a list option left empty) leaves the
  // option at its default: CLI11 reads "[]" as a value with no items, which options that
  // take one or more refuse.
  if (entry.value == "[]") return Status::Ok();
  try {
    SetDefault(opt, entry.value);
  } catch (const CLI::Error& e) {
    return InvalidArgument(where + ": bad value for '" + entry.key + "': " + e.what());
  }
  return Status::Ok();
}

Status ApplyConfigFile(CLI::App& app, const std::string& path) {
  ONLINEPS_ASSIGN_OR_RETURN(std::vector<FileEntry> entries, ReadConfigFile(path));
  std::map<const CLI::Option*, int> first_line;  // TOML forbids setting a key twice
  for (const FileEntry& entry : entries) {
    ONLINEPS_RETURN_IF_ERROR(ApplyEntry(app, entry, path));
    auto [it, inserted] = first_line.emplace(FindFileOption(app, entry.key), entry.line);
    if (!inserted) {
      return InvalidArgument(path + ":" + std::to_string(entry.line) + ": duplicate key '" +
                             entry.key + "' (first set on line " + std::to_string(it->second) +
                             ")");
    }
  }
  return Status::Ok();
}

void AddBuiltinOptions(CLI::App& app, const std::string& env_prefix) {
  if (app.get_option_no_throw(kConfigFlag) == nullptr) {
    app.add_option(kConfigFlag, "Config file of `key = value` lines (flags and env override it)")
        ->envname(env_prefix + "CONFIG")
        ->type_name("FILE");
  }
  if (app.get_option_no_throw(kPrintConfigFlag) == nullptr) {
    app.add_flag(kPrintConfigFlag, "Print the effective configuration and exit");
  }
}

// Number checks CLI11 does not make. It reads an unsigned option with strtoull, which takes "-1" as
// 2^64-1 and clamps a value past 2^64-1: such an option must be plain decimal digits that fit in 64
// bits (a narrower type is then range-checked by CLI11 itself). Applies to argv, environment and
// config file values alike, in `app` and its subcommands.
//
// CLI11 also reads integers with base 0: "010" is 8 and "0x10" is 16. Both kinds of integer
// option take decimal digits only, without a leading 0 (a signed one may start with '-'),
// and a signed one must fit in 64 bits too (past that it was accepted, clamped).
std::string DecimalProblem(const std::string& v, bool sign_allowed) {
  const size_t start = sign_allowed && !v.empty() && v[0] == '-' ? 1 : 0;
  if (v.size() == start || !std::all_of(v.begin() + static_cast<std::ptrdiff_t>(start), v.end(),
                                        [](char c) { return c >= '0' && c <= '9'; })) {
    return sign_allowed ? "must be a whole number, not '" + v + "'"
                        : "must be a whole number >= 0, not '" + v + "'";
  }
  if (v.size() > start + 1 && v[start] == '0') {
    return "'" + v + "': write numbers in decimal without a leading 0 (it would be read as octal)";
  }
  errno = 0;
  if (sign_allowed) {
    (void)std::strtoll(v.c_str(), nullptr, 10);
  } else {
    (void)std::strtoull(v.c_str(), nullptr, 10);
  }
  if (errno == ERANGE) return "'" + v + "' is out of range";
  return std::string();
}

void CheckNumberOptions(CLI::App& app) {
  static const CLI::Validator kUnsigned(
      [](std::string& v) -> std::string { return DecimalProblem(v, /*sign_allowed=*/false); }, "");
  static const CLI::Validator kSigned(
      [](std::string& v) -> std::string { return DecimalProblem(v, /*sign_allowed=*/true); }, "");
  // A floating-point option takes a finite number: strtod reads "nan" and "inf", which
  // no option here means (0 or -1 mark "none" where one exists).
  static const CLI::Validator kFinite(
      [](std::string& v) -> std::string {
        char* end = nullptr;
        const double d = std::strtod(v.c_str(), &end);
        if (end != v.c_str() && *end == '\0' && !std::isfinite(d)) {
          return "must be a finite number, not '" + v + "'";
        }
        return std::string();  // other mistakes: CLI11's own message
      },
      "");
  for (CLI::Option* opt : app.get_options()) {
    // The type name, then the descriptions of the checks already added ("FLOAT:...").
    const std::string type = opt->get_type_name();
    if (type == "UINT" || type.rfind("UINT:", 0) == 0) opt->check(kUnsigned);
    if (type == "INT" || type.rfind("INT:", 0) == 0) opt->check(kSigned);
    if (type == "FLOAT" || type.rfind("FLOAT:", 0) == 0) opt->check(kFinite);
  }
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    CheckNumberOptions(*sub);
  }
}

// Also captures defaults from bound variables so --help and EffectiveConfig show them.
void PrepareOptions(CLI::App& app, const std::string& env_prefix) {
  CheckNumberOptions(app);
  for (CLI::Option* opt : app.get_options()) {
    if (IsBuiltin(app, opt) || opt->get_lnames().empty()) continue;
    if (opt->get_envname().empty()) {
      opt->envname(EnvNameForFlag(opt->get_lnames()[0], env_prefix));
    }
    if (opt->get_default_str().empty()) opt->capture_default_str();
  }
}

// The file must be known before CLI11 parses argv, so look for --config by hand;
// CLI11 still parses it later and rejects a malformed use.
std::string FindConfigPath(int argc, const char* const* argv, const std::string& env_prefix) {
  std::string path;
  const std::string prefix = std::string(kConfigFlag) + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg == kConfigFlag && i + 1 < argc) path = argv[++i];
    if (arg.rfind(prefix, 0) == 0) path = arg.substr(prefix.size());
  }
  if (path.empty()) {
    const char* env = std::getenv((env_prefix + "CONFIG").c_str());
    if (env != nullptr) path = env;
  }
  return path;
}

std::string SuccessText(const CLI::App& app, const CLI::Success& e) {
  if (dynamic_cast<const CLI::CallForHelp*>(&e) != nullptr) return app.help();
  if (dynamic_cast<const CLI::CallForAllHelp*>(&e) != nullptr) {
    return app.help("", CLI::AppFormatMode::All);
  }
  return std::string(e.what()) + "\n";  // --version
}

std::string QuoteIfNeeded(const std::string& v) {
  bool bare = !v.empty() && std::all_of(v.begin(), v.end(), [](unsigned char c) {
    return std::isalnum(c) || (c != '\0' && std::strchr("._-+:/@,[]", c) != nullptr);
  });
  if (bare) return v;
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// An option's effective value as a config file line's value (what --print-config writes):
// a list of several values as an array whose items are quoted one by one where needed
// ("[a|b,c]" quoted whole would read back as one string).
std::string PrintedValue(const CLI::Option& opt) {
  if (opt.count() == 0) {
    std::string def = opt.get_default_str();
    return QuoteIfNeeded(def.empty() && opt.get_expected_max() == 0 ? "false"
                                                                    : OptionValue(opt, def));
  }
  const CLI::results_t results = opt.reduced_results();
  if (results.size() == 1) return QuoteIfNeeded(OptionValue(opt, results[0]));
  std::string joined;
  for (const std::string& r : results) {
    joined += (joined.empty() ? "" : ",") + QuoteIfNeeded(OptionValue(opt, r));
  }
  return "[" + joined + "]";
}

}  // namespace

std::string EnvNameForFlag(const std::string& long_name, const std::string& env_prefix) {
  std::string env = env_prefix;
  for (unsigned char c : long_name) env += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return env;
}

std::string EffectiveConfig(const CLI::App& app) {
  std::ostringstream out;
  const CLI::Option* config = app.get_option_no_throw(kConfigFlag);
  if (config != nullptr && config->count() > 0) {
    out << "# config file: " << config->as<std::string>() << "\n";
  }
  for (const CLI::Option* opt : app.get_options()) {
    if (IsBuiltin(app, opt) || opt->get_lnames().empty()) continue;
    out << opt->get_lnames()[0] << " = " << PrintedValue(*opt) << "\n";
  }
  return out.str();
}

namespace {

// CLI11 reports a missing required option or subcommand before an argument it does not
// know; the unknown one is the real mistake ("--ps is required" for a misspelt flag), so
// name it instead. "" when every argument is known.
std::string UnknownArgument(CLI::App& app, int argc, const char* const* argv) {
  CLI::App* current = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a.rfind("--", 0) == 0) {
      const std::string name = a.substr(0, a.find('='));
      const CLI::Option* opt = current->get_option_no_throw(name);
      if (opt == nullptr) opt = app.get_option_no_throw(name);
      if (opt == nullptr) return "unknown flag " + name + " (--help lists them)";
      if (a.find('=') == std::string::npos && opt->get_expected_min() > 0) ++i;  // its value
      continue;
    }
    if (a.rfind("-", 0) == 0) continue;  // short flags: left to CLI11
    const auto subs = current->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) continue;  // a positional argument
    CLI::App* next = nullptr;
    std::string names;
    for (CLI::App* sub : subs) {
      if (sub->check_name(a)) next = sub;
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (next == nullptr) return "unknown subcommand '" + a + "' (expected one of: " + names + ")";
    current = next;
  }
  return "";
}

// Whether --print-config is among the arguments (before a "--").
bool HasPrintConfig(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == kPrintConfigFlag) return true;
  }
  return false;
}

}  // namespace

StatusOr<ParseResult> ParseFlags(CLI::App& app, int argc, const char* const* argv,
                                 std::ostream& out, const std::string& env_prefix) {
  ParseResult result;
  Status file_status;
  try {
    AddBuiltinOptions(app, env_prefix);
    PrepareOptions(app, env_prefix);
    result.config_file = FindConfigPath(argc, argv, env_prefix);
    if (!result.config_file.empty()) file_status = ApplyConfigFile(app, result.config_file);
    NegatedFlagEnv negated(app);  // after the file: env wins over it
    if (!negated.error().ok()) return negated.error();
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // help wins over every error, as in any CLI
    out << SuccessText(app, e);
    result.exit_now = true;
    return result;
  } catch (const CLI::ParseError& e) {
    if (!file_status.ok()) return file_status;
    // --print-config shows the configuration without what a run needs besides it: a
    // subcommand (onlineps_ps_cli) or a required argument (onlineps_worker_cli's op).
    // CLI11 checks requirements after it has set every value.
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && HasPrintConfig(argc, argv) &&
        UnknownArgument(app, argc, argv).empty()) {
      out << EffectiveConfig(app);
      result.exit_now = true;
      return result;
    }
    // A misspelt flag is named the same way whether CLI11 saw it as extra or first
    // missed a required option because of it.
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr ||
        dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      if (std::string unknown = UnknownArgument(app, argc, argv); !unknown.empty()) {
        return InvalidArgument(unknown);
      }
    }
    return InvalidArgument(e.what());
  } catch (const std::exception& e) {  // CLI::ConstructionError: the caller's options clash
    return Internal(std::string("command-line setup: ") + e.what());
  }
  if (!file_status.ok()) return file_status;
  if (app.get_option(kPrintConfigFlag)->count() > 0) {
    out << EffectiveConfig(app);
    result.exit_now = true;
  }
  return result;
}

Status ParseNamedNumbers(const std::vector<std::string>& items, const std::string& flag,
                         std::map<std::string, double>* out) {
  for (const std::string& kv : items) {
    const size_t eq = kv.find('=');
    char* end = nullptr;
    const double v = eq == std::string::npos ? 0 : std::strtod(kv.c_str() + eq + 1, &end);
    if (eq == std::string::npos || eq == 0 || end == nullptr || *end != '\0') {
      return InvalidArgument(flag + " '" + kv + "' is not NAME=NUMBER");
    }
    (*out)[kv.substr(0, eq)] = v;
  }
  return Status::Ok();
}

}  // namespace onlineps
