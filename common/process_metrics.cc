#include "common/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace onlineps {
namespace {

std::string ReadAll(const char* path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Unix time of boot: the btime line of /proc/stat; 0 when absent.
double BootTime() {
  std::istringstream in(ReadAll("/proc/stat"));
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime" && (in >> value)) return value;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

std::optional<double> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  double n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the directory stream's own descriptor
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(m);
  return f;
}

}  // namespace

std::optional<ProcessSample> ParseProcStat(const std::string& stat, double ticks_per_s,
                                           double page_bytes, double boot_time_s) {
  // "pid (comm) state ppid ...": fields after the last ')' start at field 3 (state).
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || ticks_per_s <= 0) return std::nullopt;
  std::istringstream in(stat.substr(close + 1));
  std::vector<std::string> f;
  for (std::string s; in >> s;) f.push_back(s);
  // Field N (1-based, proc(5)) is f[N - 3]: utime 14, stime 15, num_threads 20,
  // starttime 22, vsize 23, rss 24.
  if (f.size() < 22) return std::nullopt;
  ProcessSample p;
  try {
    p.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / ticks_per_s;
    p.threads = std::stod(f[17]);
    p.start_time_s = boot_time_s + std::stod(f[19]) / ticks_per_s;
    p.virtual_bytes = std::stod(f[20]);
    p.resident_bytes = std::stod(f[21]) * page_bytes;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return p;
}

std::optional<ProcessSample> SampleProcess() {
  static const double boot = BootTime();
  std::optional<ProcessSample> p =
      ParseProcStat(ReadAll("/proc/self/stat"), static_cast<double>(sysconf(_SC_CLK_TCK)),
                    static_cast<double>(sysconf(_SC_PAGESIZE)), boot);
  if (!p) return p;
  p->open_fds = OpenFds();
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    p->max_fds = static_cast<double>(limit.rlim_cur);
  }
  return p;
}

std::vector<prometheus::MetricFamily> ProcessFamilies(const std::optional<ProcessSample>& sample) {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  if (!sample) return out;
  const ProcessSample& p = *sample;
  out.push_back(Family("process_cpu_seconds_total",
                       "Total user and system CPU time spent in seconds.", MetricType::Counter,
                       p.cpu_seconds));
  out.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes.",
                       MetricType::Gauge, p.resident_bytes));
  out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                       MetricType::Gauge, p.virtual_bytes));
  out.push_back(Family("process_start_time_seconds",
                       "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
                       p.start_time_s));
  out.push_back(Family("process_threads", "Number of OS threads in the process.", MetricType::Gauge,
                       p.threads));
  if (p.open_fds) {
    out.push_back(Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
                         *p.open_fds));
  }
  if (p.max_fds) {
    out.push_back(Family("process_max_fds", "Maximum number of open file descriptors.",
                         MetricType::Gauge, *p.max_fds));
  }
  return out;
}

}  // namespace onlineps
