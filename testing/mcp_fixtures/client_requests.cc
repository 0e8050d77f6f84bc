#include "testing/mcp_fixtures/client_requests.h"

#include <chrono>

namespace onlineps::testing {

using nlohmann::json;

namespace {
constexpr size_t kMaxPending = 1024;
constexpr auto kWait = std::chrono::seconds(30);
}  // namespace

StatusOr<json> ClientRequests::Ask(const bridge::Request& req, const std::string& method,
                                   const json& params) {
  if (!req.notify || req.stateless) return Unavailable("no stream to send " + method + " on");
  auto pending = std::make_shared<Pending>();
  pending->session_id = req.session_id;
  std::string id;
  {
    MutexLock lock(&mu_);
    if (pending_.size() >= kMaxPending) {
      return ResourceExhausted("too many requests to clients pending");
    }
    id = "onlineps-" + std::to_string(next_++);
    pending_[id] = pending;
  }
  req.notify({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
  bool done;
  json response;
  {
    MutexLock lock(&pending->mu);
    done = pending->cv.WaitFor(&pending->mu, kWait,
                               [&]() REQUIRES(pending->mu) { return pending->done; });
    response = pending->response;
  }
  {
    MutexLock lock(&mu_);
    pending_.erase(id);
  }
  if (!done) return DeadlineExceeded("the client did not answer " + method + " within 30 s");
  if (response.contains("error")) {
    return FailedPrecondition("the client answered " + method +
                              " with an error: " + response["error"].dump());
  }
  return response.value("result", json::object());
}

bool ClientRequests::Deliver(const json& response, const std::string& session_id) {
  if (!response["id"].is_string()) return false;
  std::shared_ptr<Pending> pending;
  {
    MutexLock lock(&mu_);
    auto it = pending_.find(response["id"].get<std::string>());
    if (it == pending_.end() || it->second->session_id != session_id) return false;
    pending = it->second;
  }
  {
    MutexLock lock(&pending->mu);
    pending->response = response;
    pending->done = true;
  }
  pending->cv.SignalAll();
  return true;
}

}  // namespace onlineps::testing
