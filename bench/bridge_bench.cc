// bridge_bench: MCP tools/call latency and throughput through the bridge, beside the
// same infer sent straight to the worker (the floor the bridge adds to) and the same
// load against the TypeScript reference MCP server (npm
// @modelcontextprotocol/server-everything, its echo tool), all measured in one run.
// Processes: a PS shard, one text-model worker, the bridge, and the TypeScript server,
// on loopback; the load generator's threads share the machine's cores with them.
//   bridge_bench [--seconds S] [--sessions 1,64] [--rounds R] [--bin-dir DIR]
//                [--everything DIR]   (DIR holds node_modules/@modelcontextprotocol/...)
//                [--idle N]  (then: a new client's first answer with N idle connections
//                             open, beside the same with none; 0: skip)
//                [--compare-bridge BIN [--compare-flags "F ..."]]  (a second bridge binary,
//                             e.g. an older build, as one more target on the same worker)
//                [--client lean|httplib]  (the load generator's HTTP client: prebuilt
//                             requests with answers checked, not parsed (default), or the
//                             McpHttpClient of the tests, cpp-httplib with nlohmann::json)
// Not a test.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/mcp_client.h"
#include "tests/raw_http_client.h"
#include "tests/subprocess.h"
#include "worker/worker_client.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using onlineps::testing::CpuSeconds;
using onlineps::testing::Subprocess;

struct Flags {
  double seconds = 3.0;  // per figure, split over the rounds
  int rounds = 3;        // targets alternate within each round so noise hits all
  std::vector<int> sessions = {1, 64};
  std::string bin_dir = ONLINEPS_BIN_DIR;
  std::string everything = ONLINEPS_SOURCE_DIR "/bench/node";
  int idle = 0;                // idle connections for the new-client figure; 0: skip it
  std::string compare_bridge;  // a second bridge binary to measure beside the first
  std::vector<std::string> compare_flags;
  std::vector<std::string> bridge_flags;  // extra flags of the bridge under test
  bool lean = true;                       // --client lean (true) or httplib
};

struct Figure {
  std::vector<double> us;
  double seconds = 0;
  double server_cpu = 0;  // CPU seconds of the target's server processes
  double client_cpu = 0;  // CPU seconds of this process (the load generator's threads)
  uint64_t errors = 0;
  std::string first_error;
  double Quantile(double q) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    return us[std::min(us.size() - 1, static_cast<size_t>(q * static_cast<double>(us.size())))];
  }
  double PerSecond() const { return seconds > 0 ? static_cast<double>(us.size()) / seconds : 0; }
};

// One client of a target: make_caller runs once per thread, its result per request.
// `servers` are the processes serving the target, whose CPU time is charged to it.
struct Target {
  std::string name;
  std::function<std::function<bool(std::string*)>(int thread)> make_caller;
  std::vector<pid_t> servers;
};

// One MCP session of the load generator; false with `error` set for a failure or a
// tool error.
class Mcp {
 public:
  explicit Mcp(int port) : client_(onlineps::LoopbackMcpUrl(port), Options()) {}
  bool Initialize(std::string* error) {
    const onlineps::Status st = client_.Initialize();
    if (!st.ok()) *error = st.ToString();
    return st.ok();
  }
  bool Call(const std::string& tool, const json& args, std::string* error) {
    auto r = client_.CallTool(tool, args);
    if (!r.ok()) {
      *error = r.status().ToString();
      return false;
    }
    if (r->is_error) *error = r->result.dump().substr(0, 300);
    return !r->is_error;
  }
  const onlineps::McpHttpClient& client() const { return client_; }

 private:
  static onlineps::McpClientOptions Options() {
    onlineps::McpClientOptions o;
    o.client_name = "bridge_bench";
    return o;
  }
  onlineps::McpHttpClient client_;
};

// A load generator's MCP session that costs little CPU of its own, as HTTP load tools
// (wrk, h2load) do: the session is opened with McpHttpClient, then each tools/call goes
// out as prebuilt bytes on one keep-alive connection, and its answer is checked (HTTP
// 200, a JSON-RPC result with this call's id, no tool error) without being parsed into
// a document. Answers may be JSON or an SSE stream, with a Content-Length or chunked.
class LeanMcp {
 public:
  LeanMcp(int port, const std::string& tool, const json& args) : port_(port) {
    Mcp opener(port);
    std::string e;
    if (!opener.Initialize(&e)) return;
    head_ = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
            "\r\nAccept: application/json, text/event-stream\r\nContent-Type: "
            "application/json\r\nMcp-Session-Id: " +
            opener.client().session_id() +
            "\r\nMCP-Protocol-Version: " + opener.client().protocol_version() +
            "\r\nContent-Length: ";
    params_ = json({{"name", tool}, {"arguments", args}}).dump();
    conn_ = onlineps::testing::RawClient::Connect(port_);
  }

  bool Call(std::string* error) {
    if (!conn_) {
      *error = "no session or connection";
      return false;
    }
    const int64_t id = onlineps::McpHttpClient::NextId();
    const std::string id_text = std::to_string(id);
    body_ = "{\"jsonrpc\":\"2.0\",\"id\":" + id_text + ",\"method\":\"tools/call\",\"params\":";
    body_ += params_;
    body_ += '}';
    request_ = head_;
    request_ += std::to_string(body_.size());
    request_ += "\r\n\r\n";
    request_ += body_;
    if (!conn_->Send(request_)) return Fail(error, "send failed");
    std::string_view answer;
    int status = 0;
    if (!ReadAnswer(&status, &answer)) return Fail(error, "no complete answer");
    if (status != 200) return Fail(error, "HTTP " + std::to_string(status));
    const std::string want = "\"id\":" + id_text;
    if (answer.find(want) == std::string_view::npos ||
        answer.find("\"result\"") == std::string_view::npos) {
      return Fail(error, std::string(answer.substr(0, 300)));
    }
    if (answer.find("\"isError\":true") != std::string_view::npos) {
      return Fail(error, std::string(answer.substr(0, 300)));
    }
    return true;
  }

 private:
  bool Fail(std::string* error, std::string what) {
    *error = std::move(what);
    conn_ = onlineps::testing::RawClient::Connect(port_);  // start clean
    in_.clear();
    return false;
  }
  // Reads into in_ until at least `n` bytes are held; false on EOF or error.
  bool Need(size_t n) {
    char buf[65536];
    while (in_.size() < n) {
      const ssize_t got = recv(conn_->fd(), buf, sizeof(buf), 0);
      if (got <= 0) return false;
      in_.append(buf, static_cast<size_t>(got));
    }
    return true;
  }
  // Position of `what` in in_ at or after `from`, reading more as needed; npos on EOF.
  size_t Find(std::string_view what, size_t from) {
    for (;;) {
      const size_t at = in_.find(what, from);
      if (at != std::string::npos) return at;
      if (!Need(in_.size() + 1)) return std::string::npos;
    }
  }
  // One response: its status and its body (chunks joined); consumed from in_.
  bool ReadAnswer(int* status, std::string_view* answer) {
    const size_t end = Find("\r\n\r\n", 0);
    if (end == std::string::npos || in_.compare(0, 5, "HTTP/") != 0 || in_.size() < 12) {
      return false;
    }
    *status = std::atoi(in_.c_str() + 9);
    std::string head = in_.substr(0, end);
    std::transform(head.begin(), head.end(), head.begin(), ::tolower);
    size_t pos = end + 4;
    body_.clear();
    const size_t cl = head.find("\r\ncontent-length:");
    if (cl != std::string::npos) {
      const size_t len = std::strtoull(head.c_str() + cl + 17, nullptr, 10);
      if (!Need(pos + len)) return false;
      body_.assign(in_, pos, len);
      pos += len;
    } else if (head.find("transfer-encoding: chunked") != std::string::npos) {
      for (;;) {
        const size_t eol = Find("\r\n", pos);
        if (eol == std::string::npos) return false;
        const size_t len = std::strtoull(in_.c_str() + pos, nullptr, 16);
        if (!Need(eol + 2 + len + 2)) return false;
        body_.append(in_, eol + 2, len);
        pos = eol + 2 + len + 2;
        if (len == 0) break;
      }
    }
    in_.erase(0, pos);
    *answer = body_;
    return true;
  }

  const int port_;
  std::string head_;    // the request line and headers up to Content-Length's value
  std::string params_;  // the tools/call params, serialized once
  std::unique_ptr<onlineps::testing::RawClient> conn_;
  std::string in_;       // received, not yet consumed
  std::string body_;     // the request body, then the answer's body
  std::string request_;  // the whole request
};

// Runs `threads` callers of `target` for `seconds`, appending to `fig`.
void Run(const Target& target, int threads, double seconds, Figure* fig) {
  std::vector<std::function<bool(std::string*)>> callers(threads);
  for (int t = 0; t < threads; ++t) callers[t] = target.make_caller(t);
  std::vector<std::vector<double>> lat(threads);
  std::vector<uint64_t> errors(threads, 0);
  std::vector<std::string> first(threads);
  std::atomic<bool> go{false};
  const auto warm = std::chrono::milliseconds(200);
  std::vector<std::thread> pool;
  Clock::time_point start, stop;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (!go) std::this_thread::yield();
      const auto measure_from = start + warm;
      while (true) {
        const auto a = Clock::now();
        if (a >= stop) break;
        std::string e;
        const bool ok = callers[t](&e);
        const auto b = Clock::now();
        if (a < measure_from) continue;
        if (ok) {
          lat[t].push_back(std::chrono::duration<double, std::micro>(b - a).count());
        } else if (errors[t]++ == 0) {
          first[t] = e;
        }
      }
    });
  }
  double cpu_before = 0;
  for (pid_t p : target.servers) cpu_before += CpuSeconds(p);
  const double client_before = CpuSeconds(getpid());
  start = Clock::now();
  stop = start + warm +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  go = true;
  for (auto& th : pool) th.join();
  double cpu_after = 0;
  for (pid_t p : target.servers) cpu_after += CpuSeconds(p);
  // The warm-up's calls are not counted; charge its CPU pro rata.
  fig->server_cpu += (cpu_after - cpu_before) * seconds / (seconds + 0.2);
  fig->client_cpu += (CpuSeconds(getpid()) - client_before) * seconds / (seconds + 0.2);
  fig->seconds += seconds;
  for (int t = 0; t < threads; ++t) {
    fig->us.insert(fig->us.end(), lat[t].begin(), lat[t].end());
    fig->errors += errors[t];
    if (fig->first_error.empty()) fig->first_error = first[t];
  }
}

bool WaitForHttp(int port, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    Mcp m(port);
    std::string e;
    if (m.Initialize(&e)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// A target's caller factory: each load thread opens its own MCP session on `port` and
// calls `tool` with `args`.
std::function<std::function<bool(std::string*)>(int)> McpCalls(int port, std::string tool,
                                                               json args, bool lean) {
  return [port, tool = std::move(tool), args = std::move(args), lean](int) {
    if (lean) {
      auto m = std::make_shared<LeanMcp>(port, tool, args);
      return std::function<bool(std::string*)>([m](std::string* error) { return m->Call(error); });
    }
    auto m = std::make_shared<Mcp>(port);
    std::string e;
    m->Initialize(&e);
    return std::function<bool(std::string*)>(
        [m, tool, args](std::string* error) { return m->Call(tool, args, error); });
  };
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, ',');) out.push_back(std::stoi(part));
  return out;
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--seconds") {
      f->seconds = std::atof(next().c_str());
    } else if (a == "--rounds") {
      f->rounds = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--sessions") {
      f->sessions = ParseList(next());
    } else if (a == "--bin-dir") {
      f->bin_dir = next();
    } else if (a == "--everything") {
      f->everything = next();
    } else if (a == "--compare-bridge") {
      f->compare_bridge = next();
    } else if (a == "--compare-flags" || a == "--bridge-flags") {
      std::stringstream ss(next());
      auto& out = a == "--compare-flags" ? f->compare_flags : f->bridge_flags;
      for (std::string w; ss >> w;) out.push_back(w);
    } else if (a == "--client") {
      const std::string c = next();
      if (c != "lean" && c != "httplib") {
        std::fprintf(stderr, "bridge_bench: --client is lean or httplib, not '%s'\n", c.c_str());
        return false;
      }
      f->lean = c == "lean";
    } else if (a == "--idle") {
      f->idle = std::max(0, std::atoi(next().c_str()));
    } else {
      const bool help = a == "--help" || a == "-h";
      if (!help) std::fprintf(stderr, "bridge_bench: unknown argument '%s'\n", a.c_str());
      std::fputs(
          "usage: bridge_bench [--seconds S] [--rounds R] [--sessions 1,64] [--bin-dir DIR] "
          "[--everything DIR] [--idle N] [--client lean|httplib]\n"
          "       [--bridge-flags \"F ...\"] [--compare-bridge BIN] [--compare-flags \"F ...\"]\n",
          help ? stdout : stderr);
      if (help) std::exit(0);
      return false;
    }
  }
  return f->seconds > 0 && !f->sessions.empty();
}

// Milliseconds from a new client's connect to the answer of its first tool call
// (initialize, notifications/initialized, tools/call get_context), `trials` times.
std::vector<double> NewClientMs(int port, int trials) {
  std::vector<double> ms;
  for (int i = 0; i < trials; ++i) {
    const auto start = Clock::now();
    Mcp m(port);
    std::string e;
    if (!m.Initialize(&e) || !m.Call("get_context", json::object(), &e)) {
      std::fprintf(stderr, "bridge_bench: new client failed: %s\n", e.c_str());
      continue;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

// The new-client figure with `idle` connections open that never send a byte, beside
// the same with none, in one run. They come from 127.0.0.2-9 so that the default
// per-address cap (512) holds them all.
void IdleFigure(int port, int idle) {
  constexpr int kTrials = 30;
  auto quantile = [](const std::vector<double>& v, double q) {
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
  };
  const std::vector<double> none = NewClientMs(port, kTrials);
  std::vector<std::unique_ptr<onlineps::testing::RawClient>> conns;
  const std::string sources[] = {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5",
                                 "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"};
  for (int i = 0; i < idle; ++i) {
    auto c = onlineps::testing::RawClient::Connect(port, sources[i % 8].c_str());
    if (!c) {
      std::fprintf(stderr, "bridge_bench: idle connection %d failed\n", i);
      break;
    }
    conns.push_back(std::move(c));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // all accepted
  const std::vector<double> with = NewClientMs(port, kTrials);
  std::printf("new client: connect -> initialize -> first tool call answered, %d trials\n",
              kTrials);
  std::printf("%-36s %10s %10s %10s\n", "idle connections open", "p50 ms", "p99 ms", "max ms");
  std::printf("%-36d %10.2f %10.2f %10.2f\n", 0, quantile(none, 0.5), quantile(none, 0.99),
              none.empty() ? 0.0 : none.back());
  std::printf("%-36zu %10.2f %10.2f %10.2f\n", conns.size(), quantile(with, 0.5),
              quantile(with, 0.99), with.empty() ? 0.0 : with.back());
  const double delay = quantile(with, 0.99) - quantile(none, 0.99);
  std::printf("  %zu idle connections delay a new client by %.2f ms at p99 (target <= 50 ms: %s)\n",
              conns.size(), delay, delay <= 50 ? "met" : "MISSED");
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  const std::string b = f.bin_dir;
  Subprocess ps({b + "/onlineps_ps", "--shard-index", "0", "--num-shards", "1", "--listen",
                 "tcp://127.0.0.1:0", "--admin-port", "-1", "--log-level", "warn"});
  const std::string ps_ep = ps.WaitForLine("LISTENING ", std::chrono::seconds(30));
  Subprocess worker({b + "/onlineps_worker", "--ps", ps_ep, "--listen", "tcp://127.0.0.1:0",
                     "--model", "text", "--labels", "negative,positive", "--admin-port", "-1",
                     "--log-level", "warn"});
  const std::string worker_ep = worker.WaitForLine("LISTENING ", std::chrono::seconds(60));
  auto bridge_argv = [&](const std::string& bin, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {bin,  "--workers",   worker_ep, "--port", "0", "--admin-port",
                                     "-1", "--log-level", "warn"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  };
  Subprocess bridge(bridge_argv(b + "/onlineps_mcp_bridge", f.bridge_flags));
  const std::string url = bridge.WaitForLine("LISTENING ", std::chrono::seconds(30));
  std::unique_ptr<Subprocess> other;
  int other_port = 0;
  if (!f.compare_bridge.empty()) {
    other = std::make_unique<Subprocess>(bridge_argv(f.compare_bridge, f.compare_flags));
    const std::string other_url = other->WaitForLine("LISTENING ", std::chrono::seconds(30));
    if (other_url.empty()) {
      std::fprintf(stderr, "bridge_bench: %s did not start\n", f.compare_bridge.c_str());
      return 1;
    }
    other_port = std::stoi(other_url.substr(other_url.rfind(':') + 1));
  }
  if (ps_ep.empty() || worker_ep.empty() || url.empty()) {
    std::fprintf(stderr, "bridge_bench: the cluster did not start (binaries in %s?)\n", b.c_str());
    return 1;
  }
  const int bridge_port = std::stoi(url.substr(url.rfind(':') + 1));
  // The TypeScript reference server on a free port.
  const int ts_port = 20000 + static_cast<int>(getpid() % 20000);
  setenv("PORT", std::to_string(ts_port).c_str(), 1);
  const std::string ts_main =
      f.everything + "/node_modules/@modelcontextprotocol/server-everything/dist/index.js";
  Subprocess ts({"/usr/bin/node", ts_main, "streamableHttp"});
  const bool have_ts = WaitForHttp(ts_port, std::chrono::seconds(30));
  if (!have_ts) {
    std::fprintf(stderr,
                 "bridge_bench: the TypeScript server did not start (%s; run npm ci in %s)\n",
                 ts_main.c_str(), f.everything.c_str());
  }

  onlineps::worker::WorkerClientOptions wo;
  wo.endpoint = worker_ep;
  auto direct = onlineps::worker::WorkerClient::Connect(wo);
  if (!direct.ok()) return 1;
  onlineps::worker::WorkerClient* client = direct->get();
  const std::string text = "a lovely warm film with a dull ending";
  std::vector<Target> targets = {
      {"direct worker RPC",
       [&](int t) {
         const json body = {{"session", "bench-" + std::to_string(t)},
                            {"examples", {{{"text", text}}}}};
         return std::function<bool(std::string*)>([client, body](std::string* e) {
           auto r = client->Call(onlineps::Op::kInfer, body);
           if (!r.ok()) *e = r.status().ToString();
           return r.ok();
         });
       },
       {worker.pid()}},
      {"bridge tools/call infer",
       McpCalls(bridge_port, "infer", {{"text", text}}, f.lean),
       {bridge.pid(), worker.pid()}},
  };
  if (have_ts) {
    targets.push_back({"TypeScript server-everything echo",
                       McpCalls(ts_port, "echo", {{"message", text}}, f.lean),
                       {ts.pid()}});
  }
  if (other) {
    targets.push_back({"compared bridge tools/call infer",
                       McpCalls(other_port, "infer", {{"text", text}}, f.lean),
                       {other->pid(), worker.pid()}});
  }
  std::printf(
      "bridge_bench: 1 PS shard, 1 text-model worker, bridge (HTTP, JSON replies), %u "
      "cores; %.1f s per figure in %d alternating rounds; load generator's HTTP client: %s\n",
      std::thread::hardware_concurrency(), f.seconds, f.rounds,
      f.lean ? "lean (prebuilt requests, answers checked)" : "httplib (McpHttpClient)");
  std::printf("%-36s %8s %10s %10s %10s %14s %7s %14s\n", "target", "sessions", "p50 us", "p99 us",
              "calls/s", "server CPU/call", "errors", "client CPU/call");
  for (int sessions : f.sessions) {
    std::vector<Figure> figs(targets.size());
    for (int r = 0; r < f.rounds; ++r) {
      for (size_t i = 0; i < targets.size(); ++i) {
        Run(targets[i], sessions, f.seconds / f.rounds, &figs[i]);
      }
    }
    auto cpu_per_call = [](const Figure& g) {
      return g.us.empty() ? 0.0 : g.server_cpu * 1e6 / static_cast<double>(g.us.size());
    };
    auto client_per_call = [](const Figure& g) {
      return g.us.empty() ? 0.0 : g.client_cpu * 1e6 / static_cast<double>(g.us.size());
    };
    for (size_t i = 0; i < targets.size(); ++i) {
      Figure& g = figs[i];
      const double cpu_us = cpu_per_call(g);
      std::printf("%-36s %8d %10.1f %10.1f %10.0f %12.1f us %7llu %12.1f us\n",
                  targets[i].name.c_str(), sessions, g.Quantile(0.5), g.Quantile(0.99),
                  g.PerSecond(), cpu_us, static_cast<unsigned long long>(g.errors),
                  client_per_call(g));
      if (g.errors) std::printf("    first error: %s\n", g.first_error.c_str());
    }
    std::printf(
        "  sessions %d: the bridge's own CPU per call (bridge+worker minus worker alone) "
        "%.1f us\n",
        sessions, cpu_per_call(figs[1]) - cpu_per_call(figs[0]));
    const double overhead = figs[1].Quantile(0.5) - figs[0].Quantile(0.5);
    // Issue 4 asked <= 0.5 ms for one session; issue 20 <= 1 ms at 64 sessions.
    const double target_us = sessions <= 1 ? 500 : 1000;
    std::printf("  sessions %d: bridge p50 overhead over direct %.1f us (target <= %.0f us: %s)",
                sessions, overhead, target_us, overhead <= target_us ? "met" : "MISSED");
    if (have_ts) {
      const double ratio = figs[1].PerSecond() / std::max(1.0, figs[2].PerSecond());
      std::printf("; bridge / TypeScript calls/s %.2fx (target >= 5x: %s)", ratio,
                  ratio >= 5 ? "met" : "MISSED");
    }
    std::printf("\n");
    if (other) {
      const Figure& o = figs.back();
      std::printf(
          "  sessions %d: compared bridge: own CPU per call %.1f us, calls/s %.2fx the bridge's",
          sessions, cpu_per_call(o) - cpu_per_call(figs[0]),
          o.PerSecond() / std::max(1.0, figs[1].PerSecond()));
      if (have_ts) {
        std::printf(", %.2fx TypeScript", o.PerSecond() / std::max(1.0, figs[2].PerSecond()));
      }
      std::printf("\n");
    }
  }
  if (f.idle > 0) IdleFigure(bridge_port, f.idle);
  return 0;
}
