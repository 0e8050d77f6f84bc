// Fixtures: test-only tools, resources, prompts and completions that the MCP
// conformance suite (npm @modelcontextprotocol/conformance) calls by fixed names
// (test_simple_text, test://static-text, ...). Served only with --test-fixtures; the
// production tools never depend on them. The McpServer calls these hooks; an
// implementation must be thread-safe.
#ifndef ONLINEPS_MCP_BRIDGE_FIXTURES_H_
#define ONLINEPS_MCP_BRIDGE_FIXTURES_H_

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"

namespace onlineps::bridge {

struct FixtureContext {
  // Sends a notification on this request's stream (null when it has none).
  std::function<void(const nlohmann::json&)> notify;
  nlohmann::json progress_token;       // null when the request asked for no progress
  std::string log_level;               // the session's logging/setLevel level; "" when unset
  nlohmann::json client_capabilities;  // from initialize (legacy) or _meta (stateless)
  // Sends a request to the client on this request's stream and waits for its response
  // (sampling/createMessage, elicitation/create). Errors: kUnavailable (no stream),
  // kDeadlineExceeded, or the client's error.
  std::function<StatusOr<nlohmann::json>(const std::string& method, const nlohmann::json& params)>
      ask_client;
};

// A JSON-RPC outcome of a fixture method: a result, or an error code and message.
struct FixtureReply {
  nlohmann::json result;
  int error_code = 0;  // 0: result
  std::string error_message;
  nlohmann::json error_data;  // the error's "data"; null for none
};

class Fixtures {
 public:
  virtual ~Fixtures() = default;
  // Tools appended to tools/list.
  virtual nlohmann::json Tools() const = 0;
  virtual bool HasTool(const std::string& name) const = 0;
  // Whether a call of this tool needs a streamed (SSE) response: it sends
  // notifications or asks the client something.
  virtual bool ToolStreams(const std::string& name) const = 0;
  // The CallToolResult of a fixture tool.
  virtual nlohmann::json CallTool(const std::string& name, const nlohmann::json& arguments,
                                  const FixtureContext& ctx) = 0;
  // resources/*, prompts/*, completion/complete: nullopt when `method` is not one.
  virtual std::optional<FixtureReply> Handle(const std::string& method,
                                             const nlohmann::json& params) = 0;
  // Merged into the server capabilities (e.g. resources, prompts, completions).
  virtual nlohmann::json Capabilities() const = 0;
};

// The conformance fixtures (fixtures.cc).
std::unique_ptr<Fixtures> NewConformanceFixtures();

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_FIXTURES_H_
