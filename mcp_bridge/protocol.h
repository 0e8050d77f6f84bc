// The MCP protocol's constants and its one revision rule: the revisions the bridge
// speaks, the JSON-RPC and MCP error codes by name, and ChooseRevision, which both
// transports (HTTP and stdio) call to decide whether a message is served by the
// stateful revisions or statelessly by 2026-07-28, or refused first. Stateless; no I/O.
#ifndef ONLINEPS_MCP_BRIDGE_PROTOCOL_H_
#define ONLINEPS_MCP_BRIDGE_PROTOCOL_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace onlineps::bridge {

inline constexpr char kModernVersion[] = "2026-07-28";
inline constexpr char kLatestLegacyVersion[] = "2025-11-25";
bool IsLegacyVersion(const std::string& v);  // 2025-11-25, 2025-06-18, 2025-03-26
// The one revision with JSON-RPC batches (a receiver MUST take them; 2025-06-18 removed
// them), and the most messages one batch may hold.
inline constexpr char kBatchVersion[] = "2025-03-26";
inline constexpr size_t kMaxBatchMessages = 1024;
nlohmann::json SupportedVersions();  // newest first, as server/discover lists them

// JSON-RPC 2.0 and MCP error codes.
inline constexpr int kParseError = -32700, kInvalidRequest = -32600, kMethodNotFound = -32601,
                     kInvalidParams = -32602, kInternalError = -32603, kServerError = -32000,
                     kSessionNotFound = -32001, kRequestCancelled = -32800,
                     kHeaderMismatch = -32020, kMissingCapability = -32021,
                     kUnsupportedVersion = -32022;

// The _meta keys of revision 2026-07-28.
inline constexpr char kMetaProtocolVersion[] = "io.modelcontextprotocol/protocolVersion";
inline constexpr char kMetaClientCapabilities[] = "io.modelcontextprotocol/clientCapabilities";
inline constexpr char kMetaServerInfo[] = "io.modelcontextprotocol/serverInfo";

nlohmann::json JsonRpcError(const nlohmann::json& id, int code, const std::string& message,
                            const nlohmann::json& data = nullptr);

// What a transport does with one message before the server sees it.
struct RevisionChoice {
  bool stateless = false;  // revision 2026-07-28: no session
  // Set when the transport answers the message itself (HTTP status and body; a null
  // body: no answer, e.g. a notification sent before initialize on stdio).
  std::optional<int> http_status;
  nlohmann::json body;
  bool refused() const { return http_status.has_value(); }
};

enum class TransportKind { kHttp, kStdio };

// The revision rules of both transports. `header_version` is HTTP's MCP-Protocol-Version
// ("" when absent; stdio has none and names 2026-07-28 in _meta); `session_id` the
// Mcp-Session-Id (HTTP) or the process's session ("" before initialize).
RevisionChoice ChooseRevision(const nlohmann::json& message, const std::string& session_id,
                              const std::string& header_version, TransportKind kind);

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_PROTOCOL_H_
