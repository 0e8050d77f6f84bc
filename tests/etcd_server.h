// Test helper: a real etcd (Debian's etcd-server) on loopback with a temporary data
// directory, started by the test itself and killed with it. Fast elections (10 ms
// heartbeats) so it is ready in well under a second and leases can be 1 s.
#ifndef ONLINEPS_TESTS_ETCD_SERVER_H_
#define ONLINEPS_TESTS_ETCD_SERVER_H_

#include <httplib.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "tests/subprocess.h"

namespace onlineps::testing {

inline int FreeLoopbackPort() {
  // Below the kernel's ephemeral range when it leaves room (Linux: 32768-60999): a
  // server restarted on its port (etcd after an outage, a shard after a kill) must find
  // it free, and an ephemeral port is taken meanwhile by any connect() or bind(0) of a
  // test running beside it.
  int low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &low) != 1) low = 32768;
    std::fclose(f);
  }
  constexpr int kFirst = 20000;
  if (low > kFirst + 1000) {
    std::mt19937 rng(
        static_cast<uint32_t>(getpid()) * 2654435761u ^
        static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
    for (int attempt = 0; attempt < 200; ++attempt) {
      const int port = kFirst + static_cast<int>(rng() % static_cast<uint32_t>(low - kFirst));
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(port));
      const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      close(fd);
      if (free) return port;
    }
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

class EtcdServer {
 public:
  // Starts etcd and waits until it answers (up to 20 s). ok() says whether it did.
  EtcdServer() {
    char tmpl[] = "/tmp/onlineps-etcd-XXXXXX";
    dir_ = mkdtemp(tmpl) ? tmpl : "";
    port_ = FreeLoopbackPort();
    peer_ = FreeLoopbackPort();
    Launch();
  }
  ~EtcdServer() {
    proc_.reset();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  bool ok() const { return ok_; }
  int port() const { return port_; }
  // The etcd process (for SIGSTOP / SIGCONT), or -1 when it is not running.
  pid_t pid() const { return proc_ ? proc_->pid() : -1; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Kills etcd (SIGKILL): every call fails from now on.
  void Kill() {
    proc_.reset();
    ok_ = false;
  }
  // Starts it again on the same data and ports (after Kill): keys and leases survive, as
  // after an etcd outage. Returns whether it answers.
  bool Restart() {
    proc_.reset();
    Launch();
    return ok_;
  }
  // Kills it and starts it again on an empty data directory (etcd's disk lost or
  // replaced): every key is gone and revisions start over. Returns whether it answers.
  bool Wipe() {
    proc_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_ + "/data", ec);
    Launch();
    return ok_;
  }

 private:
  void Launch() {
    const std::string client_url = "http://127.0.0.1:" + std::to_string(port_);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_);
    const std::string cmd =
        "exec /usr/bin/etcd --name t --data-dir " + dir_ + "/data --listen-client-urls " +
        client_url + " --advertise-client-urls " + client_url + " --listen-peer-urls " + peer_url +
        " --initial-advertise-peer-urls " + peer_url + " --initial-cluster t=" + peer_url +
        " --heartbeat-interval 10 --election-timeout 100 --logger zap --log-level error 2>>" +
        dir_ + "/etcd.log";
    proc_ = std::make_unique<Subprocess>(std::vector<std::string>{"/bin/sh", "-c", cmd});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      httplib::Client c("127.0.0.1", port_);
      c.set_connection_timeout(0, 200000);
      auto res = c.Post("/v3/kv/range", R"({"key":"AA=="})", "application/json");
      if (res && res->status == 200) {
        ok_ = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  std::string dir_;
  int port_ = 0, peer_ = 0;
  bool ok_ = false;
  std::unique_ptr<Subprocess> proc_;
};

}  // namespace onlineps::testing

#endif  // ONLINEPS_TESTS_ETCD_SERVER_H_
