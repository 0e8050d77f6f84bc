// Test-only: requests the server sends to the client on a request's stream
// (sampling/createMessage, elicitation/create) and the wait for their responses, which
// arrive as separate messages on the same session. At most 1024 pending. Thread-safe;
// Ask blocks up to 30 s.
#ifndef ONLINEPS_TESTING_MCP_FIXTURES_CLIENT_REQUESTS_H_
#define ONLINEPS_TESTING_MCP_FIXTURES_CLIENT_REQUESTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "mcp_bridge/mcp_server.h"

namespace onlineps::testing {

class ClientRequests {
 public:
  // Sends `method` on `req`'s stream and waits for the client's response. Errors:
  // kUnavailable (no stream, or stateless), kResourceExhausted, kDeadlineExceeded, or
  // kFailedPrecondition with the client's error.
  StatusOr<nlohmann::json> Ask(const bridge::Request& req, const std::string& method,
                               const nlohmann::json& params);
  // A response from the client on `session_id` (McpServer::SetResponseHandler); false
  // when no request of that session waits for it.
  bool Deliver(const nlohmann::json& response, const std::string& session_id);

 private:
  struct Pending {
    Mutex mu;
    CondVar cv;
    bool done GUARDED_BY(mu) = false;
    nlohmann::json response GUARDED_BY(mu);
    std::string session_id;  // immutable: only that session may answer
  };

  Mutex mu_;
  std::map<std::string, std::shared_ptr<Pending>> pending_ GUARDED_BY(mu_);
  uint64_t next_ GUARDED_BY(mu_) = 1;
};

}  // namespace onlineps::testing

#endif  // ONLINEPS_TESTING_MCP_FIXTURES_CLIENT_REQUESTS_H_
