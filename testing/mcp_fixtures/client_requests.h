// Test-only: requests the server sends to the client on a request's stream
// (sampling/createMessage, elicitation/create) and the wait for their responses, which
// arrive as separate messages on the same session. At most 1024 pending. Thread-safe;
// Ask blocks up to 30 s.
#ifndef ONLINEPS_TESTING_MCP_FIXTURES_CLIENT_REQUESTS_H_
#define ONLINEPS_TESTING_MCP_FIXTURES_CLIENT_REQUESTS_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

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
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;        // guarded by mu
    nlohmann::json response;  // guarded by mu
    std::string session_id;   // immutable: only that session may answer
  };

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Pending>> pending_;  // guarded by mu_
  uint64_t next_ = 1;                                        // guarded by mu_
};

}  // namespace onlineps::testing

#endif  // ONLINEPS_TESTING_MCP_FIXTURES_CLIENT_REQUESTS_H_
