#include "common/admin_server.h"

#include <httplib.h>
#include <prometheus/gauge.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

namespace onlineps {
namespace {

// Keep in step with project(VERSION) in the top-level CMakeLists.txt.
constexpr char kVersion[] = "0.1.0";
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4";
constexpr size_t kWorkerThreads = 2;  // scrapes and probes are rare and cheap
constexpr time_t kIoTimeoutSeconds = 5;
constexpr size_t kMaxRequestBodyBytes = 4096;  // no endpoint takes a body
constexpr auto kStartTimeout = std::chrono::seconds(5);

// httplib's default also sets SO_REUSEPORT, which lets a second process bind the same
// port and silently steal half the scrapes; SO_REUSEADDR alone still allows a quick
// restart over TIME_WAIT sockets.
void ReuseAddrOnly(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

Status RunCheck(const std::function<Status()>& check) {
  try {
    return check();
  } catch (const std::exception& e) {  // no exception may escape into httplib's threads
    return Internal(std::string("ready check threw: ") + e.what());
  }
}

void RegisterBuildInfo(prometheus::Registry& registry) {
  try {
    prometheus::BuildGauge()
        .Name("onlineps_build_info")
        .Help("onlineps build metadata; the value is always 1")
        .Register(registry)
        .Add({{"version", kVersion}})
        .Set(1);
  } catch (const std::exception& e) {  // a clashing family already in a shared registry
    spdlog::warn("admin server: cannot register onlineps_build_info: {}", e.what());
  }
}

}  // namespace

class AdminServer::Impl {
 public:
  explicit Impl(std::shared_ptr<prometheus::Registry> registry)
      : registry_(registry ? std::move(registry) : std::make_shared<prometheus::Registry>()) {
    RegisterBuildInfo(*registry_);
    Configure();
  }

  StatusOr<int> Start(const std::string& host, int port);
  void Stop();

  void SetReadyCheck(std::function<Status()> check) {
    std::lock_guard<std::mutex> lock(mu_);
    ready_check_ = std::move(check);
  }

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  void Configure();
  void ServeMetrics(httplib::Response& res) const;
  void ServeReady(httplib::Response& res);

  // Immutable after construction.
  const std::shared_ptr<prometheus::Registry> registry_;
  httplib::Server server_;

  // Owned by the thread calling Start/Stop.
  std::thread thread_;
  bool started_ = false;
  std::atomic<bool> listen_returned_{false};

  std::mutex mu_;
  std::function<Status()> ready_check_;  // guarded by mu_
};

void AdminServer::Impl::Configure() {
  server_.new_task_queue = [] { return new httplib::ThreadPool(kWorkerThreads); };
  server_.set_socket_options(ReuseAddrOnly);
  server_.set_read_timeout(kIoTimeoutSeconds, 0);
  server_.set_write_timeout(kIoTimeoutSeconds, 0);
  server_.set_payload_max_length(kMaxRequestBodyBytes);
  auto ok = [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  };
  server_.Get("/livez", ok);
  server_.Get("/healthz", ok);
  server_.Get("/readyz",
              [this](const httplib::Request&, httplib::Response& res) { ServeReady(res); });
  server_.Get("/metrics",
              [this](const httplib::Request&, httplib::Response& res) { ServeMetrics(res); });
}

void AdminServer::Impl::ServeMetrics(httplib::Response& res) const {
  try {
    res.set_content(prometheus::TextSerializer().Serialize(registry_->Collect()),
                    kMetricsContentType);
  } catch (const std::exception& e) {
    res.status = 500;
    res.set_content(std::string("metrics: ") + e.what() + "\n", "text/plain");
  }
}

void AdminServer::Impl::ServeReady(httplib::Response& res) {
  std::function<Status()> check;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check = ready_check_;  // run it unlocked: a slow check must not block SetReadyCheck
  }
  Status status = check ? RunCheck(check) : Status::Ok();
  if (status.ok()) {
    res.set_content("ready\n", "text/plain");
  } else {
    res.status = 503;
    res.set_content(status.ToString() + "\n", "text/plain");
  }
}

StatusOr<int> AdminServer::Impl::Start(const std::string& host, int port) {
  if (started_) return FailedPrecondition("admin server already started");
  if (port < 0 || port > 65535) {
    return InvalidArgument("admin port must be in [0, 65535], got " + std::to_string(port));
  }
  int bound = port;
  if (port == 0) {
    bound = server_.bind_to_any_port(host);
  } else if (!server_.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return Unavailable("admin server cannot bind " + host + ":" + std::to_string(port));
  }
  started_ = true;
  thread_ = std::thread([this] {
    server_.listen_after_bind();
    listen_returned_ = true;
  });
  // httplib's stop() is a no-op until the accept loop runs; waiting here means a
  // Stop() right after Start() cannot leave the thread listening forever.
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (!server_.is_running() && !listen_returned_) {
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_.is_running()) {
    Stop();
    return Internal("admin server on " + host + ":" + std::to_string(bound) + " did not start");
  }
  return bound;
}

void AdminServer::Impl::Stop() {
  if (!thread_.joinable()) return;
  server_.stop();
  thread_.join();
}

AdminServer::AdminServer(std::shared_ptr<prometheus::Registry> registry)
    : impl_(std::make_unique<Impl>(std::move(registry))) {}

AdminServer::~AdminServer() { Stop(); }

StatusOr<int> AdminServer::Start(const std::string& host, int port) {
  return impl_->Start(host, port);
}

void AdminServer::Stop() { impl_->Stop(); }

void AdminServer::SetReadyCheck(std::function<Status()> check) {
  impl_->SetReadyCheck(std::move(check));
}

const std::shared_ptr<prometheus::Registry>& AdminServer::registry() const {
  return impl_->registry();
}

}  // namespace onlineps
