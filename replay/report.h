// Output files of a replay run (docs/replay.md): tidy CSV of the learning curve and
// the staleness summary, manifest.json, and gnuplot plots (PNG and SVG).
// Functions are stateless; errors name the file.
#ifndef ONLINEPS_REPLAY_REPORT_H_
#define ONLINEPS_REPLAY_REPORT_H_

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "replay/replayer.h"

namespace onlineps::replay {

// `s` as one CSV field (RFC 4180): quoted, with quotes doubled, when it holds a comma, a
// quote or a line break (a line break becomes a space, so every record stays one line).
std::string CsvField(const std::string& s);

// `run` is written as CsvField(run) in each of the three files below.
// curve.csv: run,updates,samples,virtual_ms,wall_s,train_loss,test_loss,test_accuracy,
// progressive_accuracy (one row per evaluation).
Status WriteCurveCsv(const std::string& path, const std::string& run, const ReplayResult& r);
// staleness.csv: run,scope,id,count,mean,p50,p90,p99,max with scope overall | worker | shard.
Status WriteStalenessCsv(const std::string& path, const std::string& run, const ReplayResult& r);
// tau_histogram.csv: run,tau,count (overall, non-zero buckets).
Status WriteHistogramCsv(const std::string& path, const std::string& run, const ReplayResult& r);
Status WriteJson(const std::string& path, const nlohmann::json& j);
// Renders accuracy and loss against updates and the staleness histogram from the CSVs
// in `dir` into DIR/{curve,staleness}.{png,svg}. A series `r` holds no value of (test
// accuracy and loss without a test split) is left out; a figure with none is not written.
// kNotFound when gnuplot is missing.
Status Plot(const std::string& dir, const ReplayResult& r);
// Versions of the libraries linked in, for the manifest.
nlohmann::json LibraryVersions();

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_REPORT_H_
