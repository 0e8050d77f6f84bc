// The standard process_* metrics (the names every Prometheus client library exports, so
// stock dashboards and alerts work): CPU seconds, resident and virtual memory, open and
// maximum file descriptors, threads and start time, read from /proc/self at each scrape.
// Linux only; on a read error the families it cannot read are left out.
#ifndef ONLINEPS_COMMON_PROCESS_METRICS_H_
#define ONLINEPS_COMMON_PROCESS_METRICS_H_

#include <prometheus/metric_family.h>

#include <optional>
#include <string>
#include <vector>

namespace onlineps {

struct ProcessSample {
  double cpu_seconds = 0;     // user + system
  double resident_bytes = 0;  // RSS
  double virtual_bytes = 0;   // VSZ
  double start_time_s = 0;    // Unix time
  double threads = 0;
  std::optional<double> open_fds, max_fds;
};

// Parses the text of /proc/<pid>/stat (the command name may hold spaces and parentheses),
// given the clock ticks per second, the page size and the boot time (Unix seconds, the
// btime line of /proc/stat). Nothing when the text is not a stat line.
std::optional<ProcessSample> ParseProcStat(const std::string& stat, double ticks_per_s,
                                           double page_bytes, double boot_time_s);

// Reads this process now.
std::optional<ProcessSample> SampleProcess();

// The process_* families of a sample (none when `sample` is empty).
std::vector<prometheus::MetricFamily> ProcessFamilies(const std::optional<ProcessSample>& sample);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_PROCESS_METRICS_H_
