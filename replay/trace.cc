#include "replay/trace.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "common/json_depth.h"

namespace onlineps::replay {

using nlohmann::json;

namespace {

constexpr const char* kKindNames[] = {"call", "learn", "infer", "pull", "push"};

// Records the bridge writes nest 64 levels at most (mcp_bridge kMaxJsonDepth).
constexpr size_t kMaxDepth = 128;

Status WrongType(const std::string& key, const char* want, const json& v) {
  return InvalidArgument("field '" + key + "' must be " + want + ", got " + v.type_name());
}

// Each Get* leaves *out alone when the key is absent or null (= unset).
Status GetString(const json& j, const std::string& key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return WrongType(key, "a string", *it);
  *out = it->get<std::string>();
  return Status::Ok();
}

Status GetInt(const json& j, const std::string& key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgument("field '" + key + "' is out of range for int64");
    }
  } else if (!it->is_number_integer()) {
    return WrongType(key, "an integer", *it);
  }
  *out = it->get<int64_t>();
  return Status::Ok();
}

Status GetUint(const json& j, const std::string& key, uint64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number_unsigned()) return WrongType(key, "a non-negative integer", *it);
  *out = it->get<uint64_t>();
  return Status::Ok();
}

Status GetBool(const json& j, const std::string& key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return WrongType(key, "a boolean", *it);
  *out = it->get<bool>();
  return Status::Ok();
}

Status GetDouble(const json& j, const std::string& key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number()) return WrongType(key, "a number", *it);
  *out = it->get<double>();
  return Status::Ok();
}

// kind: json::value_t::object or ::array.
Status GetStructured(const json& j, const std::string& key, json::value_t kind, json* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (it->type() != kind) {
    return WrongType(key, kind == json::value_t::object ? "an object" : "an array", *it);
  }
  *out = *it;
  return Status::Ok();
}

Status Require(const json& j, const std::string& key) {
  if (!j.contains(key)) return InvalidArgument("missing field '" + key + "'");
  return Status::Ok();
}

// Copies the members of `extra` whose keys `known` does not define into *j.
void MergeExtra(const json& extra, const char* const* known, size_t n, json* j) {
  if (!extra.is_object()) return;
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    bool is_known = false;
    for (size_t i = 0; i < n && !is_known; ++i) is_known = it.key() == known[i];
    if (!is_known && !j->contains(it.key())) (*j)[it.key()] = it.value();
  }
}

constexpr const char* kHeaderKeys[] = {"kind",   "format",    "format_version", "run_id",
                                       "source", "commit",    "start_unix_us",  "dataset",
                                       "model",  "optimizer", "workers",        "seeds"};
constexpr const char* kRecordKeys[] = {
    "kind",      "seq",        "t_us",    "session", "worker",       "tool",
    "arguments", "ref",        "table",   "shard",   "base_version", "applied_version",
    "tau",       "version",    "nnz",     "bytes",   "loss",         "is_error",
    "summary",   "latency_us", "wait_us", "run_us"};

json Extra(const json& j, const char* const* known, size_t n) {
  json extra = json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool is_known = false;
    for (size_t i = 0; i < n && !is_known; ++i) is_known = it.key() == known[i];
    if (!is_known) extra[it.key()] = it.value();
  }
  return extra.empty() ? json() : extra;
}

}  // namespace

const char* RecordKindName(RecordKind k) { return kKindNames[static_cast<int>(k)]; }

StatusOr<RecordKind> ParseRecordKind(const std::string& s) {
  for (int i = 0; i < 5; ++i) {
    if (s == kKindNames[i]) return static_cast<RecordKind>(i);
  }
  return InvalidArgument("unknown record kind '" + s + "' (known: call, learn, infer, pull, push)");
}

std::string NewRunId() {
  std::random_device rd;
  uint64_t bits = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(bits));
  return buf;
}

json ToJson(const TraceHeader& h) {
  json j = {{"kind", "header"},   {"format", kTraceFormat}, {"format_version", h.format_version},
            {"run_id", h.run_id}, {"source", h.source},     {"start_unix_us", h.start_unix_us}};
  if (!h.commit.empty()) j["commit"] = h.commit;
  if (!h.dataset.is_null()) j["dataset"] = h.dataset;
  if (!h.model.is_null()) j["model"] = h.model;
  if (!h.optimizer.is_null()) j["optimizer"] = h.optimizer;
  if (!h.workers.is_null()) j["workers"] = h.workers;
  if (!h.seeds.is_null()) j["seeds"] = h.seeds;
  MergeExtra(h.extra, kHeaderKeys, std::size(kHeaderKeys), &j);
  return j;
}

StatusOr<TraceHeader> HeaderFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument(std::string("header is ") + j.type_name());
  std::string kind = "header", format;
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "kind", &kind));
  if (kind != "header") return InvalidArgument("header has kind '" + kind + "', not 'header'");
  ONLINEPS_RETURN_IF_ERROR(Require(j, "format"));
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "format", &format));
  if (format != kTraceFormat) {
    return InvalidArgument("format is '" + format + "', not '" + kTraceFormat + "'");
  }
  TraceHeader h;
  int64_t version = -1;
  ONLINEPS_RETURN_IF_ERROR(Require(j, "format_version"));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "format_version", &version));
  if (version != kTraceFormatVersion) {
    return InvalidArgument("unknown format_version " + std::to_string(version) +
                           " (this reader knows 1)");
  }
  h.format_version = static_cast<int>(version);
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "run_id", &h.run_id));
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "source", &h.source));
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "commit", &h.commit));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "start_unix_us", &h.start_unix_us));
  ONLINEPS_RETURN_IF_ERROR(GetStructured(j, "dataset", json::value_t::object, &h.dataset));
  ONLINEPS_RETURN_IF_ERROR(GetStructured(j, "model", json::value_t::object, &h.model));
  ONLINEPS_RETURN_IF_ERROR(GetStructured(j, "optimizer", json::value_t::object, &h.optimizer));
  ONLINEPS_RETURN_IF_ERROR(GetStructured(j, "workers", json::value_t::array, &h.workers));
  ONLINEPS_RETURN_IF_ERROR(GetStructured(j, "seeds", json::value_t::object, &h.seeds));
  h.extra = Extra(j, kHeaderKeys, std::size(kHeaderKeys));
  return h;
}

json ToJson(const TraceRecord& r) {
  json j = {{"kind", RecordKindName(r.kind)}, {"seq", r.seq}, {"t_us", r.t_us}};
  auto str = [&j](const char* k, const std::string& v) {
    if (!v.empty()) j[k] = v;
  };
  auto num = [&j](const char* k, int64_t v) {
    if (v != -1) j[k] = v;
  };
  str("session", r.session);
  str("worker", r.worker);
  str("tool", r.tool);
  if (!r.arguments.is_null()) j["arguments"] = r.arguments;
  if (!r.ref.is_null()) j["ref"] = r.ref;
  str("table", r.table);
  num("shard", r.shard);
  num("base_version", r.base_version);
  num("applied_version", r.applied_version);
  num("tau", r.tau);
  num("version", r.version);
  if (r.nnz != 0) j["nnz"] = r.nnz;
  if (r.bytes != 0) j["bytes"] = r.bytes;
  if (!std::isnan(r.loss)) j["loss"] = r.loss;
  if (r.is_error || r.kind == RecordKind::kCall) j["is_error"] = r.is_error;
  str("summary", r.summary);
  num("latency_us", r.latency_us);
  num("wait_us", r.wait_us);
  num("run_us", r.run_us);
  MergeExtra(r.extra, kRecordKeys, std::size(kRecordKeys), &j);
  return j;
}

StatusOr<TraceRecord> RecordFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument(std::string("record is ") + j.type_name());
  TraceRecord r;
  std::string kind;
  for (const char* key : {"kind", "seq", "t_us"}) ONLINEPS_RETURN_IF_ERROR(Require(j, key));
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "kind", &kind));
  ONLINEPS_ASSIGN_OR_RETURN(r.kind, ParseRecordKind(kind));
  ONLINEPS_RETURN_IF_ERROR(GetUint(j, "seq", &r.seq));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "t_us", &r.t_us));
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "session", &r.session));
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "worker", &r.worker));
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "tool", &r.tool));
  ONLINEPS_RETURN_IF_ERROR(GetStructured(j, "arguments", json::value_t::object, &r.arguments));
  ONLINEPS_RETURN_IF_ERROR(GetStructured(j, "ref", json::value_t::object, &r.ref));
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "table", &r.table));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "shard", &r.shard));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "base_version", &r.base_version));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "applied_version", &r.applied_version));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "tau", &r.tau));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "version", &r.version));
  ONLINEPS_RETURN_IF_ERROR(GetUint(j, "nnz", &r.nnz));
  ONLINEPS_RETURN_IF_ERROR(GetUint(j, "bytes", &r.bytes));
  ONLINEPS_RETURN_IF_ERROR(GetDouble(j, "loss", &r.loss));
  ONLINEPS_RETURN_IF_ERROR(GetBool(j, "is_error", &r.is_error));
  ONLINEPS_RETURN_IF_ERROR(GetString(j, "summary", &r.summary));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "latency_us", &r.latency_us));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "wait_us", &r.wait_us));
  ONLINEPS_RETURN_IF_ERROR(GetInt(j, "run_us", &r.run_us));
  r.extra = Extra(j, kRecordKeys, std::size(kRecordKeys));
  return r;
}

// ---- TraceReader ----

namespace {

// std::getline that reads at most `max` bytes of a line (then sets *too_long and stops,
// for the caller to refuse the file), so that a file with no newline (/dev/zero) cannot
// take all memory or time. Sets
// eofbit when the input ends, as std::getline does: after a line without '\n' too.
bool GetBoundedLine(std::istream& in, size_t max, std::string* line, bool* too_long) {
  line->clear();
  *too_long = false;
  std::streambuf* buf = in.rdbuf();
  bool any = false;
  for (;;) {
    const int c = buf->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      return any;
    }
    any = true;
    if (c == '\n') return true;
    if (line->size() == max) {
      *too_long = true;  // the caller stops here: the rest is not read
      return true;
    }
    line->push_back(static_cast<char>(c));
  }
}

}  // namespace

TraceReader::TraceReader(std::string path, std::ifstream in, size_t max_line_bytes)
    : path_(std::move(path)), in_(std::move(in)), max_line_bytes_(max_line_bytes) {}

StatusOr<std::unique_ptr<TraceReader>> TraceReader::Open(const std::string& path,
                                                         size_t max_line_bytes) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound("trace " + path + ": no such file");
  if (std::filesystem::is_directory(path, ec)) {
    return InvalidArgument("trace " + path + ": is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Unavailable("trace " + path + ": " + std::strerror(errno));
  std::unique_ptr<TraceReader> r(new TraceReader(path, std::move(in), max_line_bytes));
  std::string line;
  bool too_long = false;
  if (!GetBoundedLine(r->in_, max_line_bytes, &line, &too_long)) {
    return InvalidArgument(path + ":1: empty trace file");
  }
  r->line_ = 1;
  if (too_long) {
    return InvalidArgument(path + ":1: header longer than " + std::to_string(max_line_bytes) +
                           " bytes");
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (NestsDeeperThan(line, kMaxDepth)) {
    return InvalidArgument(path + ":1: header nests deeper than " + std::to_string(kMaxDepth) +
                           " levels");
  }
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    return InvalidArgument(path + ":1: header is not JSON (" + e.what() + ")");
  }
  if (!j.is_object()) return InvalidArgument(path + ":1: header is not a JSON object");
  auto h = HeaderFromJson(j);
  if (!h.ok()) return h.status().WithContext(path + ":1");
  r->header_ = std::move(h).value();
  return r;
}

StatusOr<bool> TraceReader::Next(TraceRecord* out) {
  std::string line;
  bool too_long = false;
  while (GetBoundedLine(in_, max_line_bytes_, &line, &too_long)) {
    ++line_;
    // eof is set only when the line ended without '\n': the file's last bytes.
    const bool unterminated = in_.eof();
    if (too_long) {
      return DataLoss(Where() + ": longer than " + std::to_string(max_line_bytes_) +
                      " bytes (the bridge records calls of at most --max-request-bytes)");
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (NestsDeeperThan(line, kMaxDepth)) {
      return DataLoss(Where() + ": nests deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      if (unterminated) {
        truncated_tail_ = true;
        return false;
      }
      return DataLoss(Where() + ": not JSON (" + e.what() + ")");
    }
    if (!j.is_object()) return DataLoss(Where() + ": not a JSON object");
    auto r = RecordFromJson(j);
    if (!r.ok()) return r.status().WithContext(Where());
    *out = std::move(r).value();
    record_line_ = line_;
    return true;
  }
  if (in_.bad()) return DataLoss(path_ + ": read error after line " + std::to_string(line_));
  return false;
}

// ---- TraceWriter ----

StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Create(const std::string& path,
                                                           const TraceHeader& header,
                                                           bool overwrite) {
  // "x" (glibc, C11) makes the existence check and the create one atomic step.
  std::FILE* f = std::fopen(path.c_str(), overwrite ? "w" : "wx");
  if (!f && errno == EEXIST) {
    return AlreadyExists("trace " + path + " exists (refusing to overwrite it)");
  }
  if (!f) return Unavailable("trace " + path + ": " + std::strerror(errno));
  std::unique_ptr<TraceWriter> w(new TraceWriter(path, f));
  TraceHeader h = header;
  h.format_version = kTraceFormatVersion;
  ONLINEPS_RETURN_IF_ERROR(w->WriteLine(ToJson(h)));
  return w;
}

TraceWriter::~TraceWriter() {
  if (file_) std::fclose(file_);
}

Status TraceWriter::Write(const TraceRecord& r) { return WriteLine(ToJson(r)); }

Status TraceWriter::WriteLine(const json& j) {
  if (!file_) return Unavailable("trace " + path_ + ": closed");
  const std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return Unavailable("trace " + path_ + ": write failed: " + std::strerror(errno));
  }
  return Status::Ok();
}

Status TraceWriter::Close() {
  if (!file_) return Status::Ok();
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) return Unavailable("trace " + path_ + ": close failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace onlineps::replay
