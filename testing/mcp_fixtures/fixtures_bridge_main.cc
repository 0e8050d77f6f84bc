// onlineps_mcp_bridge_fixtures (tests only, never installed): onlineps_mcp_bridge, same
// flags, that also serves the MCP conformance suite's fixtures (conformance_fixtures.h).
#include <spdlog/spdlog.h>

#include <memory>

#include "mcp_bridge/bridge_app.h"
#include "testing/mcp_fixtures/conformance_fixtures.h"

int main(int argc, char** argv) {
  std::unique_ptr<onlineps::testing::ConformanceFixtures> fixtures;  // outlives the server
  return onlineps::bridge::RunBridge(argc, argv, [&](onlineps::bridge::McpServer* mcp) {
    fixtures = onlineps::testing::ConformanceFixtures::Install(mcp);
    spdlog::warn("serving the MCP conformance fixtures (a test binary)");
  });
}
