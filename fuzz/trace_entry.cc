// The trace reader on a file holding the input: the header, then every record until the
// end or the first error. Whatever it accepts must survive ToJson / *FromJson unchanged.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_entries.h"
#include "replay/trace.h"

namespace onlineps::fuzz {
namespace {

// A trace longer than this many records is read no further (the input bounds it anyway).
constexpr int kMaxRecords = 100000;

std::string TempPath() {
  static const std::string path =
      (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
      "/onlineps_trace_fuzz_" + std::to_string(getpid()) + ".jsonl";
  return path;
}

bool WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

std::string CheckRecord(const replay::TraceRecord& r) {
  StatusOr<replay::TraceRecord> back = replay::RecordFromJson(replay::ToJson(r));
  if (!back.ok()) return "an accepted record does not re-read: " + back.status().ToString();
  const nlohmann::json a = replay::ToJson(r), b = replay::ToJson(*back);
  if (a.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) !=
      b.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)) {
    return "a record changed in a ToJson / RecordFromJson round trip";
  }
  return "";
}

}  // namespace

std::string TraceOne(const uint8_t* data, size_t size) {
  const std::string path = TempPath();
  if (!WriteFile(path, data, size)) return "";  // no disk: nothing to test
  auto reader = replay::TraceReader::Open(path);
  std::string problem;
  if (reader.ok()) {
    StatusOr<replay::TraceHeader> h = replay::HeaderFromJson(replay::ToJson((*reader)->header()));
    if (!h.ok()) problem = "an accepted header does not re-read: " + h.status().ToString();
    replay::TraceRecord rec;
    for (int n = 0; problem.empty() && n < kMaxRecords; ++n) {
      StatusOr<bool> more = (*reader)->Next(&rec);
      if (!more.ok() || !*more) break;
      problem = CheckRecord(rec);
    }
  }
  std::remove(path.c_str());
  return problem;
}

}  // namespace onlineps::fuzz
