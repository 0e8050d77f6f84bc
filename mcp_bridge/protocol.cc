#include "mcp_bridge/protocol.h"

namespace onlineps::bridge {

using nlohmann::json;

namespace {

RevisionChoice Refuse(int http_status, json body) {
  RevisionChoice c;
  c.http_status = http_status;
  c.body = std::move(body);
  return c;
}

json IdOf(const json& m) { return m.is_object() ? m.value("id", json()) : json(); }

// The params._meta of a message; an empty object when it has none.
json MetaOf(const json& m) {
  if (!m.is_object()) return json::object();
  const json p = m.value("params", json::object());
  const json meta = p.is_object() ? p.value("_meta", json::object()) : json::object();
  return meta.is_object() ? meta : json::object();
}

// HTTP names the revision in the MCP-Protocol-Version header, and a message without a
// session must name a known one there. A 2026-07-28 request is stateless whatever
// Mcp-Session-Id it carries: that revision ignores the header (a client that moved up
// from a legacy session may still send it).
RevisionChoice ChooseHttp(const json& m, const std::string& session_id,
                          const std::string& header_version, bool is_init) {
  RevisionChoice c;
  const bool modern = header_version == kModernVersion;
  c.stateless = modern && !is_init;
  if (modern && is_init) {
    return Refuse(404, JsonRpcError(IdOf(m), kMethodNotFound,
                                    "Method not found: initialize is not part of revision "
                                    "2026-07-28 (use server/discover)"));
  }
  if (is_init || !session_id.empty()) return c;
  if (!header_version.empty() && header_version != kModernVersion &&
      !IsLegacyVersion(header_version)) {
    return Refuse(
        400, JsonRpcError(IdOf(m), kUnsupportedVersion,
                          "Unsupported protocol version: " + header_version,
                          {{"supported", SupportedVersions()}, {"requested", header_version}}));
  }
  // A modern request without the version header still announces itself in _meta.
  if (header_version.empty() && MetaOf(m).contains(kMetaProtocolVersion)) {
    return Refuse(400,
                  JsonRpcError(IdOf(m), kHeaderMismatch,
                               "Header mismatch: the MCP-Protocol-Version header is required"));
  }
  return c;
}

// stdio has no headers: a request of 2026-07-28 names it in its _meta. Before
// initialize only a well-formed ping is answered.
RevisionChoice ChooseStdio(const json& m, const std::string& session_id, bool is_init) {
  RevisionChoice c;
  c.stateless = !is_init && session_id.empty() &&
                MetaOf(m).value(kMetaProtocolVersion, json()) == kModernVersion;
  if (is_init || c.stateless || !session_id.empty() || !m.is_object() || !m.contains("method")) {
    return c;
  }
  if (!m.contains("id")) return Refuse(200, json());
  // A malformed request is refused by McpServer's checks, as after initialize.
  const json& id = m["id"];
  const auto params = m.find("params");
  if ((!id.is_string() && !id.is_number_integer()) || m.value("jsonrpc", json()) != "2.0" ||
      !m["method"].is_string() || (params != m.end() && !params->is_object())) {
    return c;
  }
  if (m.value("method", json()) == "ping") {
    return Refuse(200, {{"jsonrpc", "2.0"}, {"id", m["id"]}, {"result", json::object()}});
  }
  return Refuse(
      200, JsonRpcError(m["id"], kInvalidRequest, "Server not initialized: send initialize first"));
}

}  // namespace

json SupportedVersions() { return {kModernVersion, "2025-11-25", "2025-06-18", "2025-03-26"}; }

bool IsLegacyVersion(const std::string& v) {
  return v == "2025-11-25" || v == "2025-06-18" || v == "2025-03-26";
}

json JsonRpcError(const json& id, int code, const std::string& message, const json& data) {
  json e = {{"code", code}, {"message", message}};
  if (!data.is_null()) e["data"] = data;
  json m = {{"jsonrpc", "2.0"}, {"error", e}};
  if (!id.is_null()) m["id"] = id;
  return m;
}

RevisionChoice ChooseRevision(const json& message, const std::string& session_id,
                              const std::string& header_version, TransportKind kind) {
  const bool is_init = message.is_object() && message.value("method", json()) == "initialize";
  return kind == TransportKind::kHttp ? ChooseHttp(message, session_id, header_version, is_init)
                                      : ChooseStdio(message, session_id, is_init);
}

}  // namespace onlineps::bridge
