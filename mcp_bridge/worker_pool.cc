#include "mcp_bridge/worker_pool.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <future>
#include <set>

#include "common/await.h"

namespace onlineps::bridge {

using nlohmann::json;

StatusOr<std::vector<std::string>> ResolveWorkers(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size()) {
    return InvalidArgument("--workers-dns '" + host_port + "' is not host:port");
  }
  const std::string host = host_port.substr(0, colon), port = host_port.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgument("--workers-dns '" + host_port + "': port is not a number");
  }
  // As --workers is checked: an endpoint past 65535 would never reach a worker.
  if (port.size() > 5 || std::stoi(port) > 65535) {
    return InvalidArgument("--workers-dns '" + host_port + "': port '" + port +
                           "' is not in 0..65535");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0) {
    return Unavailable("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  std::set<std::string> out;
  for (addrinfo* a = res; a; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof buf);
      out.insert("tcp://" + std::string(buf) + ":" + port);
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, buf, sizeof buf);
      out.insert("tcp://[" + std::string(buf) + "]:" + port);
    }
  }
  freeaddrinfo(res);
  return std::vector<std::string>(out.begin(), out.end());
}

WorkerPool::WorkerPool(WorkerPoolOptions options, Router* router)
    : options_(std::move(options)), router_(router) {}

WorkerPool::~WorkerPool() { Stop(); }

Status WorkerPool::Start() {
  if (options_.endpoints.empty() && options_.dns.empty()) {
    return InvalidArgument("no workers: give --workers and/or --workers-dns");
  }
  {
    MutexLock lock(&mu_);
    for (const std::string& e : options_.endpoints) {
      if (e.rfind("tcp://", 0) != 0 && e.rfind("ipc://", 0) != 0) {
        return InvalidArgument("worker endpoint '" + e + "' is not tcp://host:port");
      }
      workers_[e].info.endpoint = e;
    }
  }
  if (!options_.dns.empty()) {
    Status s = Resolve();
    if (s.code() == StatusCode::kInvalidArgument) return s;
    if (!s.ok())
      spdlog::warn("worker pool: {} (retrying every {} ms)", s.ToString(),
                   options_.dns_interval.count());
  }
  ProbeAll();
  next_dns_ = std::chrono::steady_clock::now() + options_.dns_interval;
  health_.Start(
      options_.health_interval, [this] { HealthTick(); }, /*tick_first=*/false);
  return Status::Ok();
}

void WorkerPool::Stop() {
  health_.Stop();
  std::vector<std::shared_ptr<worker::WorkerClient>> clients;
  {
    MutexLock lock(&mu_);  // with ClientOf's check: no client is made after this
    stopping_.store(true, std::memory_order_release);
    for (auto& [e, entry] : workers_) {
      if (entry.client) clients.push_back(entry.client);
    }
  }
  // A callback that ran before this may have started another call on a client: Shutdown
  // ends those too, refuses the rest, and joins the threads that run callbacks.
  for (auto& c : clients) c->Shutdown("the bridge is stopping");
  DropRetired(/*all=*/true);
}

void WorkerPool::DropRetired(bool all) {
  std::vector<std::shared_ptr<worker::WorkerClient>> done;
  {
    MutexLock lock(&mu_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      if (all || it->use_count() == 1) {
        done.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done) c->Shutdown("the worker left DNS");
}

Status WorkerPool::Resolve() {
  ONLINEPS_ASSIGN_OR_RETURN(std::vector<std::string> found, ResolveWorkers(options_.dns));
  MutexLock membership(&membership_mu_);
  std::vector<std::string> gone;
  std::vector<std::shared_ptr<worker::WorkerClient>> clients;
  {
    MutexLock lock(&mu_);
    for (const std::string& e : found) workers_[e].info.endpoint = e;
    for (const std::string& e : dns_members_) {
      const bool listed = std::count(options_.endpoints.begin(), options_.endpoints.end(), e) > 0;
      if (!listed && std::find(found.begin(), found.end(), e) == found.end()) {
        if (auto it = workers_.find(e); it != workers_.end()) {
          if (it->second.client) {
            clients.push_back(it->second.client);
            retired_.push_back(std::move(it->second.client));
          }
          workers_.erase(it);
        }
        gone.push_back(e);
      }
    }
    dns_members_ = found;
  }
  for (const std::string& e : gone) {
    if (router_->RemoveWorker(e)) spdlog::info("worker pool: {} left DNS; sessions moved", e);
  }
  // Outside the locks: the calls' callbacks may route and call again.
  for (auto& c : clients) c->FailInFlight("the worker left DNS");
  return Status::Ok();
}

std::shared_ptr<worker::WorkerClient> WorkerPool::ClientOf(const std::string& endpoint) {
  MutexLock lock(&mu_);
  if (stopping_.load(std::memory_order_acquire)) return nullptr;  // Stop took them all
  auto it = workers_.find(endpoint);
  if (it == workers_.end()) return nullptr;
  if (!it->second.client) {
    worker::WorkerClientOptions o;
    o.endpoint = endpoint;
    o.transport.curve = options_.curve;
    auto c = worker::WorkerClient::Connect(o);
    if (!c.ok()) {
      it->second.info.last_error = c.status().ToString();
      return nullptr;
    }
    it->second.client = std::move(*c);
  }
  return it->second.client;
}

StatusOr<json> WorkerPool::Call(const std::string& endpoint, Op op, const json& body,
                                std::chrono::milliseconds timeout) {
  auto client = ClientOf(endpoint);
  if (!client) return Unavailable("worker " + endpoint + " is not connected");
  return client->Call(op, body, timeout);
}

void WorkerPool::CallAsync(const std::string& endpoint, Op op, const json& body,
                           std::chrono::milliseconds timeout, worker::WorkerClient::Done done) {
  if (stopping_.load(std::memory_order_acquire)) {
    return done(Unavailable("the bridge is stopping; the call to " + endpoint + " was not sent"));
  }
  auto client = ClientOf(endpoint);
  if (!client) {
    done(Unavailable("worker " + endpoint + " is not connected"));
    return;
  }
  client->CallAsync(op, body, timeout, std::move(done));
}

void WorkerPool::Apply(const std::string& endpoint, const StatusOr<json>& probe) {
  // A reply that decodes but is not worker_stats' map is a failed probe, not a throw
  // (this runs in callbacks, where nothing would catch it).
  const StatusOr<json> reply = probe.ok() && !probe->is_object()
                                   ? StatusOr<json>(Malformed("worker_stats reply is not a map"))
                                   : probe;
  bool left = false;
  {
    // Held across the state change and the router call, so that two probes of one worker
    // (the loop's and a failed call's) cannot leave the ring and the health flag apart.
    MutexLock membership(&membership_mu_);
    bool healthy = false;
    {
      MutexLock lock(&mu_);
      auto it = workers_.find(endpoint);
      if (it == workers_.end()) return;
      Entry& e = it->second;
      if (reply.ok()) {
        const json& id = reply->value("instance", json());
        const std::string instance = id.is_string() ? id.get<std::string>() : std::string();
        if (!e.info.healthy || instance != e.info.instance) {
          e.info.incarnation = next_incarnation_++;  // a new process or back from down
        }
        e.info.healthy = true;
        e.info.instance = instance;
        e.info.stats = *reply;
        const json& labels = reply->value("labels", json::array());
        std::vector<std::string> v;
        if (labels.is_array()) {
          for (const json& l : labels) {
            v.push_back(l.is_string() ? l.get<std::string>()
                                      : l.dump(-1, ' ', false, json::error_handler_t::replace));
          }
        }
        if (!e.labels || *e.labels != v) {
          e.labels = std::make_shared<const std::vector<std::string>>(std::move(v));
        }
        e.info.last_error.clear();
        e.failures = 0;
      } else {
        e.info.last_error = reply.status().ToString();
        if (++e.failures >= options_.failures_to_down) e.info.healthy = false;
      }
      healthy = e.info.healthy;
    }
    // Reconciled on every probe: the ring holds exactly the healthy workers.
    if (healthy && router_->AddWorker(endpoint)) {
      spdlog::info("worker pool: {} is healthy", endpoint);
    }
    left = !healthy && router_->RemoveWorker(endpoint);
  }
  if (left) {
    spdlog::warn("worker pool: {} is down ({}); its sessions moved", endpoint,
                 reply.status().ToString());
    // Nothing it was sent will be answered in time: end those calls now, outside the
    // locks (their callbacks may route and call again).
    if (auto client = ClientOf(endpoint)) {
      client->FailInFlight("the worker left the ring (" + reply.status().ToString() + ")");
    }
  }
}

bool WorkerPool::Probe(const std::string& endpoint) {
  auto client = ClientOf(endpoint);
  StatusOr<json> reply =
      client ? client->Call(Op::kWorkerStats, json::object(), options_.health_timeout)
             : StatusOr<json>(Unavailable("not connected"));
  Apply(endpoint, reply);
  return reply.ok();
}

void WorkerPool::ProbeAll() {
  std::vector<std::string> endpoints;
  {
    MutexLock lock(&mu_);
    for (const auto& [e, entry] : workers_) endpoints.push_back(e);
  }
  std::vector<std::future<bool>> probes;
  for (const std::string& e : endpoints) {
    probes.push_back(std::async(std::launch::async, [this, e] { return Probe(e); }));
  }
  for (auto& p : probes) p.wait();
}

bool WorkerPool::ReportFailure(const std::string& endpoint) {
  return Await<bool>(
      [&](std::function<void(bool)> done) { ReportFailureAsync(endpoint, std::move(done)); });
}

void WorkerPool::ReportFailureAsync(const std::string& endpoint, std::function<void(bool)> done) {
  if (stopping_.load(std::memory_order_acquire)) return done(false);  // no probe, no change
  CallAsync(endpoint, Op::kWorkerStats, json::object(), options_.health_timeout,
            [this, endpoint, done = std::move(done)](StatusOr<json> reply) {
              if (reply.status().code() == StatusCode::kResourceExhausted) {
                // The probe was not sent: calls in flight at the cap. Busy, not gone.
                return done(true);
              }
              if (!reply.ok()) {
                // The call already failed once: one failed probe is enough to leave the ring.
                MutexLock lock(&mu_);
                if (auto it = workers_.find(endpoint); it != workers_.end()) {
                  it->second.failures =
                      std::max(it->second.failures, options_.failures_to_down - 1);
                }
              }
              Apply(endpoint, reply);
              done(reply.ok());
            });
}

void WorkerPool::HealthTick() {
  if (!options_.dns.empty() && std::chrono::steady_clock::now() >= next_dns_) {
    if (Status s = Resolve(); !s.ok()) spdlog::warn("worker pool: {}", s.ToString());
    next_dns_ = std::chrono::steady_clock::now() + options_.dns_interval;
  }
  ProbeAll();
  DropRetired(/*all=*/false);
}

uint64_t WorkerPool::Incarnation(const std::string& endpoint) const {
  MutexLock lock(&mu_);
  auto it = workers_.find(endpoint);
  return it == workers_.end() ? 0 : it->second.info.incarnation;
}

std::shared_ptr<const std::vector<std::string>> WorkerPool::Labels(
    const std::string& endpoint) const {
  MutexLock lock(&mu_);
  auto it = workers_.find(endpoint);
  return it == workers_.end() ? nullptr : it->second.labels;
}

std::vector<WorkerInfo> WorkerPool::Workers() const {
  MutexLock lock(&mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [e, entry] : workers_) out.push_back(entry.info);
  return out;
}

std::pair<size_t, size_t> WorkerPool::Counts() const {
  MutexLock lock(&mu_);
  size_t healthy = 0;
  for (const auto& [e, entry] : workers_) healthy += entry.info.healthy ? 1 : 0;
  return {workers_.size(), healthy};
}

size_t WorkerPool::healthy() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [e, entry] : workers_) n += entry.info.healthy ? 1 : 0;
  return n;
}

}  // namespace onlineps::bridge
