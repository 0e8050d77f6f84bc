#include "common/flags.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace onlineps {

void AddLoggingFlags(CLI::App& app, LogOptions* options) {
  // Empty is accepted and means "not given", so a dumped config reads back.
  auto valid_level = [](const std::string& name) -> std::string {
    return name.empty() ? "" : ParseLogLevel(name).status().message();
  };
  app.add_option("--log-level", options->level,
                 "trace|debug|info|warn|error|critical|off (default: SPDLOG_LEVEL, else info)")
      ->check(CLI::Validator(valid_level, "LEVEL"));
  app.add_option("--log-format", options->format, "Log line format")
      ->check(CLI::IsMember({"text", "json"}));
}

CLI::Validator NumberIn(double lo, double hi) {
  auto g = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const std::string want =
      std::isinf(hi) ? "a number >= " + g(lo) : "a number from " + g(lo) + " to " + g(hi);
  return CLI::Validator(
      [lo, hi, want](std::string& v) -> std::string {
        char* end = nullptr;
        const double d = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0' || !(d >= lo && d <= hi)) {
          return "must be " + want + ", not '" + v + "'";
        }
        return std::string();
      },
      std::isinf(hi) ? ">= " + g(lo) : "in [" + g(lo) + ", " + g(hi) + "]");
}

void AddCurveFlags(CLI::App& app, CurveFlags* f, bool server, bool client) {
  app.add_option("--curve-cert", f->cert,
                 "CURVE certificate of this process (both keys; enables encrypted, "
                 "authenticated ZeroMQ links; docs/security.md)");
  if (client) {
    app.add_option("--curve-server-key", f->server_key,
                   "Public key of the servers this process connects to (needs --curve-cert)");
  }
  if (server) {
    app.add_option("--curve-allow", f->allow,
                   "Client public keys accepted, one per line (default: any client holding "
                   "this server's public key)");
  }
}

StatusOr<CurveOptions> LoadCurve(const CurveFlags& f) {
  CurveOptions o;
  if (f.cert.empty()) {
    if (!f.server_key.empty() || !f.allow.empty()) {
      return InvalidArgument("--curve-server-key and --curve-allow need --curve-cert");
    }
    return o;
  }
  auto cert = ReadCurveCert(f.cert);
  if (!cert.ok()) return cert.status().WithContext("--curve-cert");
  const CurveKeyPair& k = *cert;
  o.public_key = k.public_key;
  o.secret_key = k.secret_key;
  if (!f.server_key.empty()) {
    auto keys = ReadCurvePublicKeys(f.server_key);
    if (!keys.ok()) return keys.status().WithContext("--curve-server-key");
    if (keys->size() != 1) {
      return InvalidArgument(f.server_key + ": holds " + std::to_string(keys->size()) +
                             " public keys; --curve-server-key needs exactly one");
    }
    o.server_public_key = (*keys)[0];
  }
  if (!f.allow.empty()) {
    auto allowed = ReadCurvePublicKeys(f.allow);
    if (!allowed.ok()) return allowed.status().WithContext("--curve-allow");
    o.allowed_clients = std::move(*allowed);
  }
  return o;
}

}  // namespace onlineps
