// Test-only: the tools, resources, prompts and completions that the MCP conformance suite
// (npm @modelcontextprotocol/conformance) calls by fixed names (test_simple_text,
// test://static-text, ...), and the server-to-client requests (sampling, elicitation)
// some of them make. Installed on an McpServer through its extension points; never
// linked into the product bridge (onlineps_mcp_bridge_fixtures serves them).
#ifndef ONLINEPS_TESTING_MCP_FIXTURES_CONFORMANCE_FIXTURES_H_
#define ONLINEPS_TESTING_MCP_FIXTURES_CONFORMANCE_FIXTURES_H_

#include <memory>

#include "mcp_bridge/mcp_server.h"

namespace onlineps::testing {

class ClientRequests;

// Owns what the fixtures need while the server serves them: keep it alive as long as
// the server. Thread-safe.
class ConformanceFixtures {
 public:
  ~ConformanceFixtures();
  ConformanceFixtures(const ConformanceFixtures&) = delete;
  ConformanceFixtures& operator=(const ConformanceFixtures&) = delete;

  // Registers the fixture tools, methods and capabilities on `server`, and a handler of
  // the client's responses. Call before the server serves.
  static std::unique_ptr<ConformanceFixtures> Install(bridge::McpServer* server);

 private:
  ConformanceFixtures();
  std::unique_ptr<ClientRequests> asks_;
};

}  // namespace onlineps::testing

#endif  // ONLINEPS_TESTING_MCP_FIXTURES_CONFORMANCE_FIXTURES_H_
