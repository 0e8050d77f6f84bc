#include "ps/table_spec.h"

#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

namespace onlineps::ps {

namespace {

// 2^36 floats (256 GiB): far above one cluster's memory, far below uint64 overflow.
constexpr uint64_t kMaxDenseElements = uint64_t{1} << 36;
constexpr size_t kMaxBaseChars = 80;  // "sha256:" + 64 hex digits, with room

std::string FormatDouble(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

std::string JoinShape(const std::vector<uint64_t>& shape) {
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "x" : "") + std::to_string(shape[i]);
  return out;
}

Status FieldError(const std::string& key, const std::string& value, const std::string& want) {
  return InvalidArgument("table spec field '" + key + "' = '" + value + "': " + want);
}

Status ParseU64(const std::string& key, const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return FieldError(key, s, "expected an unsigned integer");
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return FieldError(key, s, "expected an unsigned integer");
  *out = v;
  return Status::Ok();
}

Status ParseI64(const std::string& key, const std::string& s, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || *end != '\0') return FieldError(key, s, "expected an integer");
  *out = v;
  return Status::Ok();
}

Status ParseDouble(const std::string& key, const std::string& s, double* out) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v)) {
    return FieldError(key, s, "expected a finite number");
  }
  *out = v;
  return Status::Ok();
}

Status ParseBool(const std::string& key, const std::string& s, bool* out) {
  if (s == "true" || s == "1") {
    *out = true;
  } else if (s == "false" || s == "0") {
    *out = false;
  } else {
    return FieldError(key, s, "expected true or false");
  }
  return Status::Ok();
}

Status ParseShape(const std::string& key, const std::string& s, std::vector<uint64_t>* out) {
  out->clear();
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, 'x')) {
    uint64_t d = 0;
    ONLINEPS_RETURN_IF_ERROR(ParseU64(key, part, &d));
    if (d == 0) return FieldError(key, s, "dimensions must be > 0");
    out->push_back(d);
  }
  if (out->empty()) return FieldError(key, s, "expected dimensions like 784x128");
  return Status::Ok();
}

template <typename T>
Status ParseU32(const std::string& key, const std::string& s, T* out) {
  uint64_t v = 0;
  ONLINEPS_RETURN_IF_ERROR(ParseU64(key, s, &v));
  if (v > UINT32_MAX) return FieldError(key, s, "too large");
  *out = static_cast<T>(v);
  return Status::Ok();
}

Status DecodeField(const std::string& k, const std::string& v, TableSpec* s) {
  if (k.rfind("opt.", 0) == 0) return ParseDouble(k, v, &s->optimizer_params[k.substr(4)]);
  if (k.rfind("stl.", 0) == 0) return ParseDouble(k, v, &s->staleness_params[k.substr(4)]);
  if (k == "name") {
    s->name = v;
    return Status::Ok();
  }
  if (k == "kind") {
    if (v != "dense" && v != "sparse") return FieldError(k, v, "expected dense or sparse");
    s->kind = v == "dense" ? TableKind::kDense : TableKind::kSparse;
    return Status::Ok();
  }
  if (k == "shape") return ParseShape(k, v, &s->shape);
  if (k == "dim") return ParseU32(k, v, &s->dim);
  if (k == "optimizer") {
    s->optimizer = v;
    return Status::Ok();
  }
  if (k == "staleness") {
    s->staleness = v;
    return Status::Ok();
  }
  if (k == "max_staleness") return ParseI64(k, v, &s->max_staleness);
  if (k == "bound_mode") {
    if (v != "reject" && v != "block") return FieldError(k, v, "expected reject or block");
    s->bound_mode = v == "reject" ? BoundMode::kReject : BoundMode::kBlock;
    return Status::Ok();
  }
  if (k == "block_timeout_ms") return ParseU64(k, v, &s->block_timeout_ms);
  if (k == "polyak") return ParseBool(k, v, &s->polyak);
  if (k == "polyak_start") return ParseU64(k, v, &s->polyak_start);
  if (k == "accumulate") return ParseU32(k, v, &s->accumulate);
  if (k == "accumulate_mean") return ParseBool(k, v, &s->accumulate_mean);
  if (k == "delta_scale") return ParseDouble(k, v, &s->delta_scale);
  if (k == "clip_norm") return ParseDouble(k, v, &s->clip_norm);
  if (k == "init") {
    if (v != "zeros" && v != "constant" && v != "uniform" && v != "normal") {
      return FieldError(k, v, "expected zeros, constant, uniform or normal");
    }
    s->init = v;
    return Status::Ok();
  }
  if (k == "init_value") return ParseDouble(k, v, &s->init_value);
  if (k == "seed") return ParseU64(k, v, &s->seed);
  if (k == "admit_after") return ParseU32(k, v, &s->admit_after);
  if (k == "ttl_ms") return ParseU64(k, v, &s->ttl_ms);
  if (k == "max_rows") return ParseU64(k, v, &s->max_rows);
  if (k == "dc_max_backups") return ParseU32(k, v, &s->dc_max_backups);
  if (k == "base") {
    if (v.empty() || v.size() > kMaxBaseChars ||
        v.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789:") != std::string::npos) {
      return FieldError(k, v, "expected up to 80 of [a-z0-9:], e.g. sha256:<hex>");
    }
    s->base = v;
    return Status::Ok();
  }
  return InvalidArgument("table spec has unknown field '" + k + "'");
}

Status Validate(const TableSpec& s) {
  if (s.name.empty() || s.name.size() > 128) {
    return InvalidArgument("table name must be 1 to 128 characters");
  }
  if (s.kind == TableKind::kDense && s.shape.empty()) {
    return InvalidArgument("dense table '" + s.name + "' needs a shape");
  }
  uint64_t elems = 1;
  for (uint64_t d : s.shape) {
    if (d != 0 && elems > kMaxDenseElements / d) {
      return InvalidArgument("dense table '" + s.name + "' has more than " +
                             std::to_string(kMaxDenseElements) + " elements");
    }
    elems *= d;
  }
  if (s.kind == TableKind::kSparse && (s.dim == 0 || s.dim > 65536)) {
    return InvalidArgument("sparse table '" + s.name + "' needs dim in [1, 65536]");
  }
  if (s.accumulate == 0) return InvalidArgument("accumulate must be >= 1");
  if (s.clip_norm < 0) return InvalidArgument("clip_norm must be >= 0 (0: no clip)");
  // Both are used as floats: past the float range they would be Inf.
  if (!(std::abs(s.delta_scale) <= FLT_MAX)) {
    return InvalidArgument("delta_scale must be within the float range (|x| <= 3.4e38), got " +
                           FormatDouble(s.delta_scale));
  }
  if (!(std::abs(s.init_value) <= FLT_MAX)) {
    return InvalidArgument("init_value must be within the float range (|x| <= 3.4e38), got " +
                           FormatDouble(s.init_value));
  }
  if (s.dc_max_backups == 0) return InvalidArgument("dc_max_backups must be >= 1");
  if (s.max_staleness < -1) return InvalidArgument("max_staleness must be >= 0, or -1 for none");
  auto opt = CreateOptimizer(s.optimizer, s.optimizer_params);
  if (!opt.ok()) return opt.status().WithContext("table '" + s.name + "'");
  auto pol = CreateStalenessPolicy(s.staleness, s.staleness_params);
  if (!pol.ok()) return pol.status().WithContext("table '" + s.name + "'");
  return Status::Ok();
}

}  // namespace

uint64_t TableSpec::size() const {
  uint64_t n = shape.empty() ? 0 : 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

bool TableSpec::operator==(const TableSpec& o) const { return EncodeSpec(*this) == EncodeSpec(o); }

bool EqualExceptCaps(const TableSpec& a, const TableSpec& b) {
  TableSpec b_with_caps_of_a = b;
  b_with_caps_of_a.admit_after = a.admit_after;
  b_with_caps_of_a.ttl_ms = a.ttl_ms;
  b_with_caps_of_a.max_rows = a.max_rows;
  return a == b_with_caps_of_a;
}

std::string DescribeSpecDifference(const TableSpec& have, const TableSpec& asked) {
  const std::map<std::string, std::string> h = EncodeSpec(have);
  const std::map<std::string, std::string> a = EncodeSpec(asked);
  auto value = [](const std::map<std::string, std::string>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? std::string("(none)") : it->second;
  };
  std::set<std::string> keys;
  for (const auto& [k, v] : h) keys.insert(k);
  for (const auto& [k, v] : a) keys.insert(k);
  std::string out;
  for (const std::string& k : keys) {
    const std::string hv = value(h, k), av = value(a, k);
    if (hv == av) continue;
    if (!out.empty()) out += ", ";
    out += k + "=" + hv + " (asked " + av + ")";
  }
  return out;
}

std::string DescribeBase(const std::string& base) { return base.empty() ? "none" : base; }

std::string DescribeCaps(const TableSpec& s) {
  return "max_rows=" + std::to_string(s.max_rows) + " ttl_ms=" + std::to_string(s.ttl_ms) +
         " admit_after=" + std::to_string(s.admit_after);
}

std::map<std::string, std::string> EncodeSpec(const TableSpec& s) {
  std::map<std::string, std::string> m;
  m["name"] = s.name;
  m["kind"] = s.kind == TableKind::kDense ? "dense" : "sparse";
  if (s.kind == TableKind::kDense) m["shape"] = JoinShape(s.shape);
  if (s.kind == TableKind::kSparse) m["dim"] = std::to_string(s.dim);
  m["optimizer"] = s.optimizer;
  for (const auto& [k, v] : s.optimizer_params) m["opt." + k] = FormatDouble(v);
  m["staleness"] = s.staleness;
  for (const auto& [k, v] : s.staleness_params) m["stl." + k] = FormatDouble(v);
  m["max_staleness"] = std::to_string(s.max_staleness);
  m["bound_mode"] = s.bound_mode == BoundMode::kReject ? "reject" : "block";
  m["block_timeout_ms"] = std::to_string(s.block_timeout_ms);
  m["polyak"] = s.polyak ? "true" : "false";
  m["polyak_start"] = std::to_string(s.polyak_start);
  m["accumulate"] = std::to_string(s.accumulate);
  m["accumulate_mean"] = s.accumulate_mean ? "true" : "false";
  m["delta_scale"] = FormatDouble(s.delta_scale);
  if (s.clip_norm > 0) m["clip_norm"] = FormatDouble(s.clip_norm);  // absent: off
  m["init"] = s.init;
  m["init_value"] = FormatDouble(s.init_value);
  m["seed"] = std::to_string(s.seed);
  m["admit_after"] = std::to_string(s.admit_after);
  m["ttl_ms"] = std::to_string(s.ttl_ms);
  m["max_rows"] = std::to_string(s.max_rows);
  m["dc_max_backups"] = std::to_string(s.dc_max_backups);
  if (!s.base.empty()) m["base"] = s.base;  // absent: no frozen base (older specs too)
  return m;
}

StatusOr<TableSpec> DecodeSpec(const std::map<std::string, std::string>& map) {
  TableSpec s;
  if (map.count("name") == 0 || map.count("kind") == 0) {
    return InvalidArgument("table spec needs at least 'name' and 'kind'");
  }
  for (const auto& [k, v] : map) ONLINEPS_RETURN_IF_ERROR(DecodeField(k, v, &s));
  ONLINEPS_RETURN_IF_ERROR(Validate(s));
  return s;
}

}  // namespace onlineps::ps
