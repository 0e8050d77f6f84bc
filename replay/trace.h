// Trace files (docs/trace.md): JSON Lines, a header line, then one record per line.
// TraceReader reads what the MCP bridge recorder, the replay tool and dataset converters
// write; TraceWriter writes the same format. Both are thread-compatible (not thread-safe):
// one thread per object. Records keep unknown fields verbatim in `extra`.
#ifndef ONLINEPS_REPLAY_TRACE_H_
#define ONLINEPS_REPLAY_TRACE_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace onlineps::replay {

constexpr const char* kTraceFormat = "onlineps-trace";
constexpr int kTraceFormatVersion = 1;

enum class RecordKind { kCall, kLearn, kInfer, kPull, kPush };
// "call", "learn", "infer", "pull", "push".
const char* RecordKindName(RecordKind k);
// Inverse of RecordKindName; kInvalidArgument naming `s` for anything else.
StatusOr<RecordKind> ParseRecordKind(const std::string& s);

struct TraceHeader {
  int format_version = kTraceFormatVersion;
  std::string run_id;  // 64 random bits hex; NewRunId() makes one
  std::string source;  // "mcp_bridge", "onlineps_replay", converter name
  std::string commit;  // git commit of the writer, "" if unknown
  int64_t start_unix_us = 0;
  nlohmann::json dataset;    // optional object: name, package, package_version, files, split_seed
  nlohmann::json model;      // optional object (bridge writes labels + tables)
  nlohmann::json optimizer;  // optional: {"name","params","staleness","staleness_params"}
  nlohmann::json workers;    // optional: array of worker names/endpoints
  nlohmann::json seeds;      // optional object of named seeds
  nlohmann::json extra;      // every other header field, kept verbatim (incl. "clock")
};

struct TraceRecord {
  RecordKind kind = RecordKind::kCall;
  uint64_t seq = 0;
  int64_t t_us = 0;           // microseconds since start_unix_us
  std::string session;        // call/learn/infer: routing key ("" if none)
  std::string worker;         // worker that served / pushed ("" if unknown)
  std::string tool;           // call only
  nlohmann::json arguments;   // call: tool arguments; learn/infer: inline {"examples":[...]}
  nlohmann::json ref;         // payload by reference, e.g. {"split":"train","offset":96,"count":32}
  std::string table;          // pull/push: table name ("" = all tables of the model)
  int64_t shard = -1;         // pull/push: shard index, -1 = all shards
  int64_t base_version = -1;  // push: version the gradient was computed at; pull: version read
  int64_t applied_version = -1;  // push: version after the PS applied it
  int64_t tau = -1;              // staleness as the PS measured it (copied, not recomputed)
  int64_t version = -1;          // call: the version the reply reported
  uint64_t nnz = 0, bytes = 0;   // push/pull sizes
  double loss = NAN;             // learn/push: loss if known (omitted when NaN)
  bool is_error = false;         // call
  std::string summary;           // call
  int64_t latency_us = -1, wait_us = -1, run_us = -1;  // call
  nlohmann::json extra;                                // unknown fields, kept verbatim
};

// 64 random bits as 16 lower-case hex digits.
std::string NewRunId();

// Round-trip helpers. ToJson omits fields at their unset defaults (-1, "", null, NaN, 0
// sizes) except kind, seq and t_us; is_error is written for every call record. The
// *FromJson functions check every known field's type; an error names the field. A null
// value of an optional field reads as unset.
nlohmann::json ToJson(const TraceHeader& h);
StatusOr<TraceHeader> HeaderFromJson(const nlohmann::json& j);
nlohmann::json ToJson(const TraceRecord& r);
StatusOr<TraceRecord> RecordFromJson(const nlohmann::json& j);

class TraceReader {
 public:
  // Opens `path` and parses the header. kNotFound: no such file; kInvalidArgument (naming
  // "path:1"): empty file, first line not a JSON object, format not "onlineps-trace",
  // unknown format_version, or a header field of the wrong type.
  // Lines longer than `max_line_bytes` are refused (the file is not read on).
  static constexpr size_t kMaxLineBytes = size_t{256} << 20;
  static StatusOr<std::unique_ptr<TraceReader>> Open(const std::string& path,
                                                     size_t max_line_bytes = kMaxLineBytes);

  const TraceHeader& header() const { return header_; }

  // Reads the next record into *out; false at the end. Blank lines are skipped. Errors
  // name "path:line" (and the field): kDataLoss for a line that is not a JSON object or
  // nests arrays/objects deeper than 128 levels, kInvalidArgument for an unknown kind or
  // a field of the wrong type. A last line with no trailing newline that does not parse (a
  // writer that crashed mid-line) ends the trace instead: Next returns false and
  // truncated_tail() becomes true.
  StatusOr<bool> Next(TraceRecord* out);

  bool truncated_tail() const { return truncated_tail_; }
  uint64_t line() const { return record_line_; }  // line number of the last record returned

 private:
  TraceReader(std::string path, std::ifstream in, size_t max_line_bytes);
  std::string Where() const { return path_ + ":" + std::to_string(line_); }

  const std::string path_;
  std::ifstream in_;
  size_t max_line_bytes_;
  TraceHeader header_;
  uint64_t line_ = 0;         // lines consumed so far
  uint64_t record_line_ = 0;  // line of the last record returned
  bool truncated_tail_ = false;
};

class TraceWriter {
 public:
  // Creates `path` and writes the header (format fields filled in). kAlreadyExists naming
  // the file when it exists and !overwrite; kUnavailable when it cannot be written.
  static StatusOr<std::unique_ptr<TraceWriter>> Create(const std::string& path,
                                                       const TraceHeader& header,
                                                       bool overwrite = false);
  ~TraceWriter();  // closes the file; errors are lost: call Close() to see them

  // Writes one record as a line and flushes it. kUnavailable on a write error or after
  // Close(). Invalid UTF-8 in strings is replaced (U+FFFD), never an error.
  Status Write(const TraceRecord& r);
  // Flushes and closes. Idempotent.
  Status Close();

 private:
  TraceWriter(std::string path, std::FILE* f) : path_(std::move(path)), file_(f) {}
  Status WriteLine(const nlohmann::json& j);

  const std::string path_;
  std::FILE* file_;  // null once closed
};

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_TRACE_H_
