#include "replay/delay.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <numeric>

#include "common/strings.h"

namespace onlineps::replay {

struct Delay::KindInfo {
  const char* name;
  Kind kind;
  int min_params, max_params;
  const char* params[3];
};

namespace {

constexpr double kPi = 3.14159265358979323846;

std::string Prefix(const std::string& spec) { return "delay spec '" + spec + "': "; }

// Shortest "%g" form that reads back as the same double, so ToString round-trips.
std::string FormatNumber(double v) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

bool ParseNumber(const std::string& token, double* out) {
  if (token.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(token.c_str(), &end);
  return end == token.c_str() + token.size() && std::isfinite(*out);
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t pos; (pos = s.find(sep, start)) != std::string::npos; start = pos + 1) {
    parts.push_back(s.substr(start, pos - start));
  }
  parts.push_back(s.substr(start));
  return parts;
}

// E[max(m, X)] for X ~ N(mu, sd).
double ClampedNormalMean(double mu, double sd, double m) {
  if (sd == 0) return std::max(mu, m);
  const double a = (m - mu) / sd;
  const double cdf = 0.5 * std::erfc(-a / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * a * a) / std::sqrt(2.0 * kPi);
  return m * cdf + mu * (1.0 - cdf) + sd * pdf;
}

}  // namespace

const Delay::KindInfo* Delay::FindKind(const std::string& name) {
  static const KindInfo kKinds[] = {
      {"none", Kind::kNone, 0, 0, {}},
      {"fixed", Kind::kFixed, 1, 1, {"V"}},
      {"uniform", Kind::kUniform, 2, 2, {"MIN", "MEAN"}},
      {"normal", Kind::kNormal, 2, 3, {"MEAN", "SD", "MIN"}},
      {"half-normal", Kind::kHalfNormal, 2, 2, {"MIN", "SD"}},
      {"exp", Kind::kExp, 1, 1, {"MEAN"}},
      {"shifted-exp", Kind::kShiftedExp, 2, 2, {"SHIFT", "MEAN"}},
      {"lognormal", Kind::kLogNormal, 2, 2, {"MU", "SIGMA"}},
      {"pareto", Kind::kPareto, 2, 2, {"SCALE", "SHAPE"}},
  };
  for (const KindInfo& info : kKinds) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

StatusOr<Delay> Delay::Parse(const std::string& spec) {
  if (spec.rfind("list@", 0) == 0) return ReadListFile(spec, spec.substr(5));
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string args = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (name == "list") return ParseList(spec, args);
  const KindInfo* info = FindKind(name);
  if (info == nullptr) {
    return InvalidArgument(Prefix(spec) + "unknown kind '" + name +
                           "' (want none, fixed, uniform, normal, half-normal, exp, "
                           "shifted-exp, lognormal, pareto, list:V1,... or list@PATH)");
  }
  if (colon == std::string::npos && info->min_params > 0) {
    return InvalidArgument(Prefix(spec) + "wrong number of parameters: " + name + " takes " +
                           std::to_string(info->min_params) + ", got 0");
  }
  return ParseParams(spec, *info, args);
}

StatusOr<Delay> Delay::ParseParams(const std::string& spec, const KindInfo& info,
                                   const std::string& args) {
  const std::vector<std::string> tokens =
      args.empty() && info.max_params == 0 ? std::vector<std::string>{} : Split(args, ',');
  const int n = static_cast<int>(tokens.size());
  if (n < info.min_params || n > info.max_params) {
    const std::string want =
        info.min_params == info.max_params
            ? std::to_string(info.min_params)
            : std::to_string(info.min_params) + " or " + std::to_string(info.max_params);
    return InvalidArgument(Prefix(spec) + "wrong number of parameters: " + info.name + " takes " +
                           want + ", got " + std::to_string(n));
  }
  Delay d;
  d.kind_ = info.kind;
  for (int i = 0; i < n; ++i) {
    if (!ParseNumber(tokens[i], &d.p_[i])) {
      return InvalidArgument(Prefix(spec) + info.params[i] + ": bad number '" + tokens[i] + "'");
    }
    const bool may_be_negative = info.kind == Kind::kLogNormal && i == 0;
    if (d.p_[i] < 0 && !may_be_negative) {
      return InvalidArgument(Prefix(spec) + info.params[i] + " must be >= 0 (negative value " +
                             tokens[i] + ")");
    }
  }
  if (info.kind == Kind::kUniform && d.p_[0] > d.p_[1]) {
    return InvalidArgument(Prefix(spec) + "MIN " + tokens[0] + " > MEAN " + tokens[1]);
  }
  if (info.kind == Kind::kPareto && d.p_[1] <= 0) {
    return InvalidArgument(Prefix(spec) + "SHAPE must be > 0, got " + tokens[1]);
  }
  return d;
}

StatusOr<Delay> Delay::ParseList(const std::string& spec, const std::string& args) {
  if (args.empty()) return InvalidArgument(Prefix(spec) + "empty list");
  auto values = std::make_shared<std::vector<double>>();
  for (const std::string& token : Split(args, ',')) {
    double v;
    if (!ParseNumber(token, &v)) {
      return InvalidArgument(Prefix(spec) + "bad number '" + token + "' in list");
    }
    if (v < 0) return InvalidArgument(Prefix(spec) + "negative value " + token + " in list");
    values->push_back(v);
  }
  Delay d;
  d.kind_ = Kind::kList;
  d.list_ = std::move(values);
  return d;
}

StatusOr<Delay> Delay::ReadListFile(const std::string& spec, const std::string& path) {
  std::ifstream in(path);
  if (!in.is_open()) return NotFound(Prefix(spec) + "cannot read file '" + path + "'");
  auto values = std::make_shared<std::vector<double>>();
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    const std::string text = Trim(line.substr(0, line.find('#')));
    if (text.empty()) continue;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    double v;
    if (!ParseNumber(text, &v)) {
      return InvalidArgument(Prefix(spec) + where + "bad number '" + text + "'");
    }
    if (v < 0) return InvalidArgument(Prefix(spec) + where + "negative value " + text);
    values->push_back(v);
  }
  if (in.bad()) return NotFound(Prefix(spec) + "error reading file '" + path + "'");
  if (values->empty()) return InvalidArgument(Prefix(spec) + "empty list: no numbers in " + path);
  Delay d;
  d.kind_ = Kind::kList;
  d.list_ = std::move(values);
  d.path_ = path;
  return d;
}

double Delay::Sample(Rng& rng) {
  switch (kind_) {
    case Kind::kNone:
      return 0;
    case Kind::kFixed:
      return p_[0];
    case Kind::kUniform:
      return p_[0] + 2.0 * (p_[1] - p_[0]) * rng.Uniform();
    case Kind::kNormal:
      return std::max(p_[2], p_[0] + p_[1] * rng.Normal());
    case Kind::kHalfNormal:
      return p_[0] + p_[1] * std::fabs(rng.Normal());
    case Kind::kExp:
      return -p_[0] * std::log(1.0 - rng.Uniform());
    case Kind::kShiftedExp:
      return p_[0] - p_[1] * std::log(1.0 - rng.Uniform());
    case Kind::kLogNormal:
      return std::exp(p_[0] + p_[1] * rng.Normal());
    case Kind::kPareto:
      // Capped so a tiny SHAPE cannot overflow to infinity.
      return std::min(p_[0] * std::pow(1.0 - rng.Uniform(), -1.0 / p_[1]),
                      std::numeric_limits<double>::max());
    case Kind::kList: {
      const double v = (*list_)[cursor_];
      cursor_ = (cursor_ + 1) % list_->size();
      return v;
    }
  }
  return 0;
}

double Delay::Mean() const {
  switch (kind_) {
    case Kind::kNone:
      return 0;
    case Kind::kFixed:
    case Kind::kExp:
      return p_[0];
    case Kind::kUniform:
      return p_[1];
    case Kind::kNormal:
      return ClampedNormalMean(p_[0], p_[1], p_[2]);
    case Kind::kHalfNormal:
      return p_[0] + p_[1] * std::sqrt(2.0 / kPi);
    case Kind::kShiftedExp:
      return p_[0] + p_[1];
    case Kind::kLogNormal:
      return std::exp(p_[0] + 0.5 * p_[1] * p_[1]);
    case Kind::kPareto:
      return p_[1] > 1 ? p_[1] * p_[0] / (p_[1] - 1) : std::numeric_limits<double>::infinity();
    case Kind::kList:
      return std::accumulate(list_->begin(), list_->end(), 0.0) / list_->size();
  }
  return 0;
}

std::string Delay::ToString() const {
  if (kind_ == Kind::kList) {
    if (!path_.empty()) return "list@" + path_;
    std::string s = "list:";
    for (size_t i = 0; i < list_->size(); ++i) {
      s += (i ? "," : "") + FormatNumber((*list_)[i]);
    }
    return s;
  }
  static const char* const kNames[] = {"none", "fixed",       "uniform",   "normal", "half-normal",
                                       "exp",  "shifted-exp", "lognormal", "pareto"};
  const KindInfo* info = FindKind(kNames[static_cast<int>(kind_)]);
  int n = info->max_params;
  if (kind_ == Kind::kNormal && p_[2] == 0) n = 2;  // MIN defaults to 0
  std::string s = info->name;
  for (int i = 0; i < n; ++i) s += (i ? "," : ":") + FormatNumber(p_[i]);
  return s;
}

bool Delay::IsZero() const { return kind_ == Kind::kNone || (kind_ == Kind::kFixed && p_[0] == 0); }

}  // namespace onlineps::replay
