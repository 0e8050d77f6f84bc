// Test helper: start a real binary as a child process, read its stdout line by line,
// signal it and collect its exit status. The child is killed (SIGKILL) if the object
// dies first, so a failing test leaves no orphans.
#ifndef ONLINEPS_TESTS_SUBPROCESS_H_
#define ONLINEPS_TESTS_SUBPROCESS_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace onlineps::testing {

// The argv of an onlineps_worker in `bin_dir` against the shards `ps` (comma separated) on an
// ephemeral tcp port, without an admin port, logging warnings only; `extra` flags appended.
inline std::vector<std::string> WorkerArgv(const std::string& bin_dir, const std::string& ps,
                                           const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {bin_dir + "/onlineps_worker",
                                   "--ps",
                                   ps,
                                   "--listen",
                                   "tcp://127.0.0.1:0",
                                   "--admin-port",
                                   "-1",
                                   "--log-level",
                                   "warn"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// A loopback TCP port that was free a moment ago (for a child that must be told its
// port before it starts), or -1.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// User + system CPU seconds process `pid` has used (/proc/PID/stat), 0 if unreadable.
inline double CpuSeconds(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  char buf[4096];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  if (!p) return 0;
  unsigned long utime = 0, stime = 0;
  // Fields after ')': state(3) ... utime(14) stime(15).
  std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime);
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// VmHWM of this process in bytes (-1 if unknown), after setting it back to the current
// RSS when `reset` (proc(5), clear_refs "5"): what a step between two calls peaked at.
inline int64_t PeakRss(bool reset) {
  if (reset) {
    std::ofstream out("/proc/self/clear_refs");
    out << "5";
  }
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

class Subprocess {
 public:
  // `with_stderr`: stderr goes to the same pipe as stdout (WaitForLine / ReadToEnd see it).
  explicit Subprocess(std::vector<std::string> argv, bool with_stderr = false) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      if (with_stderr) dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }
  ~Subprocess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }
  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // Next stdout line starting with `prefix` (the rest of it), or "" on timeout/EOF.
  std::string WaitForLine(const std::string& prefix, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      size_t nl;
      while ((nl = buf_.find('\n')) != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
      }
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char tmp[4096];
      ssize_t n = read(out_, tmp, sizeof tmp);
      if (n <= 0) return "";
      buf_.append(tmp, static_cast<size_t>(n));
    }
    return "";
  }

  // Everything not yet read up to EOF (the process closed its output), or up to `timeout`.
  std::string ReadToEnd(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char tmp[4096];
      ssize_t n = read(out_, tmp, sizeof tmp);
      if (n <= 0) break;
      buf_.append(tmp, static_cast<size_t>(n));
    }
    return std::exchange(buf_, std::string());
  }

  // Sends `sig` and waits up to `timeout` for exit; returns the exit code, 128+signal
  // when killed by a signal, or -1 on timeout.
  int Stop(int sig, std::chrono::milliseconds timeout) {
    if (sig != 0) kill(pid_, sig);
    return Wait(timeout);
  }
  int Wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      usleep(10000);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool exited_ = false;
  std::string buf_;
};

}  // namespace onlineps::testing

#endif  // ONLINEPS_TESTS_SUBPROCESS_H_
