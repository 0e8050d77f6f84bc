#include "replay/report.h"

#include <spdlog/version.h>
#include <zmq.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <limits>
#include <msgpack/version.hpp>
#include <sstream>

namespace onlineps::replay {
namespace {

// Full precision, and empty cells (not "nan") for values that do not exist.
std::string Num(double v) {
  if (!std::isfinite(v)) return "";
  std::ostringstream s;
  s << std::setprecision(std::numeric_limits<double>::max_digits10) << v;
  return s.str();
}

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) return Unavailable("cannot write " + path);
  f << text;
  f.close();
  if (!f) return Unavailable("cannot write " + path);
  return Status::Ok();
}

std::string StatsRow(const std::string& run, const std::string& scope, size_t id,
                     const StalenessStats& s) {
  return run + "," + scope + "," + std::to_string(id) + "," + std::to_string(s.count()) + "," +
         Num(s.Mean()) + "," + std::to_string(s.Quantile(0.5)) + "," +
         std::to_string(s.Quantile(0.9)) + "," + std::to_string(s.Quantile(0.99)) + "," +
         std::to_string(s.Max()) + "\n";
}

}  // namespace

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return out + "\"";
}

Status WriteCurveCsv(const std::string& path, const std::string& name, const ReplayResult& r) {
  const std::string run = CsvField(name);
  std::string out =
      "run,updates,samples,virtual_ms,wall_s,train_loss,test_loss,test_accuracy,"
      "progressive_accuracy\n";
  for (const EvalRow& e : r.curve) {
    out += run + "," + std::to_string(e.updates) + "," + std::to_string(e.samples) + "," +
           Num(e.virtual_ms) + "," + Num(e.wall_s) + "," + Num(e.train_loss) + "," +
           Num(e.test_loss) + "," + Num(e.test_accuracy) + "," +
           (e.progressive_accuracy < 0 ? "" : Num(e.progressive_accuracy)) + "\n";
  }
  return WriteText(path, out);
}

Status WriteStalenessCsv(const std::string& path, const std::string& name, const ReplayResult& r) {
  const std::string run = CsvField(name);
  std::string out = "run,scope,id,count,mean,p50,p90,p99,max\n";
  out += StatsRow(run, "overall", 0, r.overall);
  for (size_t w = 0; w < r.per_worker.size(); ++w)
    out += StatsRow(run, "worker", w, r.per_worker[w]);
  for (size_t s = 0; s < r.per_shard.size(); ++s) out += StatsRow(run, "shard", s, r.per_shard[s]);
  return WriteText(path, out);
}

Status WriteHistogramCsv(const std::string& path, const std::string& name, const ReplayResult& r) {
  const std::string run = CsvField(name);
  std::string out = "run,tau,count\n";
  const auto& h = r.overall.histogram();
  for (size_t t = 0; t < h.size(); ++t) {
    if (h[t]) out += run + "," + std::to_string(t) + "," + std::to_string(h[t]) + "\n";
  }
  return WriteText(path, out);
}

Status WriteJson(const std::string& path, const nlohmann::json& j) {
  return WriteText(path, j.dump(2) + "\n");
}

Status Plot(const std::string& dir, const ReplayResult& r) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return NotFound("gnuplot is not installed (apt-get install gnuplot-nox); plots skipped");
  }
  // gnuplot stops at a plot whose column holds no number ("x range is invalid"), losing
  // every later figure: a run without a test split (a trace, --dataset none) leaves the
  // test columns empty, so only the series that hold values are plotted.
  bool accuracy = false, test_loss = false, train_loss = false, staleness = false;
  for (const EvalRow& e : r.curve) {
    accuracy |= std::isfinite(e.test_accuracy);
    test_loss |= std::isfinite(e.test_loss);
    train_loss |= std::isfinite(e.train_loss);
  }
  for (uint64_t count : r.overall.histogram()) staleness |= count > 0;
  const bool loss = test_loss || train_loss;
  const std::string curve = "'" + dir + "/curve.csv'";
  std::string gp = "set datafile separator ','\nset key autotitle columnhead\nset grid\n";
  for (const char* term : {"pngcairo size 900,600", "svg size 900,600"}) {
    const std::string ext = std::string(term).rfind("png", 0) == 0 ? "png" : "svg";
    gp += std::string("set terminal ") + term + "\n";
    if (accuracy || loss) {
      gp += "set output '" + dir + "/curve." + ext + "'\n";
      gp += "set multiplot layout 1," + std::to_string(int{accuracy} + int{loss}) + "\n";
      gp += "set xlabel 'updates'\n";
    }
    if (accuracy) {
      gp += "set ylabel 'test accuracy'\n";
      gp += "plot " + curve + " using 2:8 with linespoints title 'test accuracy'\n";
    }
    if (loss) {
      std::string series;
      if (test_loss) series = curve + " using 2:7 with linespoints title 'test loss'";
      if (train_loss) {
        series += (series.empty() ? "" : ", ") + curve + " using 2:6 with lines title 'train loss'";
      }
      gp += "set ylabel 'loss'\nplot " + series + "\n";
    }
    if (accuracy || loss) gp += "unset multiplot\n";
    if (staleness) {
      gp += "set output '" + dir + "/staleness." + ext + "'\n";
      gp += "set xlabel 'staleness tau'\nset ylabel 'pushes'\nset style fill solid 0.6\n";
      gp += "plot '" + dir + "/tau_histogram.csv' using 2:3 with boxes title 'pushes'\n";
    }
  }
  ONLINEPS_RETURN_IF_ERROR(WriteText(dir + "/plot.gp", gp));
  const std::string cmd = "gnuplot '" + dir + "/plot.gp' 2>'" + dir + "/plot.log'";
  if (std::system(cmd.c_str()) != 0) {
    return Internal("gnuplot failed; see " + dir + "/plot.log");
  }
  return Status::Ok();
}

nlohmann::json LibraryVersions() {
  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  return {
      {"libzmq", std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch)},
      {"msgpack-c", MSGPACK_VERSION},
      {"spdlog", std::to_string(SPDLOG_VER_MAJOR) + "." + std::to_string(SPDLOG_VER_MINOR) + "." +
                     std::to_string(SPDLOG_VER_PATCH)},
      {"nlohmann_json", std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." +
                            std::to_string(NLOHMANN_JSON_VERSION_MINOR) + "." +
                            std::to_string(NLOHMANN_JSON_VERSION_PATCH)},
      {"compiler", __VERSION__}};
}

}  // namespace onlineps::replay
