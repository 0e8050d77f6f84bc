// CurveZMQ (ZeroMQ's built-in CURVE: Curve25519 key exchange, encrypted and
// authenticated) for every tcp:// link between PS clients, shards, workers and the
// bridge. Keys are Z85 text (40 characters) in files, e.g. Kubernetes secrets:
//   a certificate (--curve-cert): this process's key pair, written by
//     `onlineps_ps_cli curve-keygen FILE` (FILE, mode 0600) with its public half in FILE.pub
//   a public key file (--curve-server-key): the key of the servers this process calls
//   an allow list (--curve-allow): client public keys a server accepts, one per line
// Any of these files may hold `public-key = "..."` / `secret-key = "..."` lines (the
// CZMQ zcert layout) or a bare key per line; '#' starts a comment. docs/security.md.
#ifndef ONLINEPS_COMMON_CURVE_H_
#define ONLINEPS_COMMON_CURVE_H_

#include <string>
#include <vector>

#include "common/status.h"

namespace onlineps {

struct CurveOptions {
  std::string public_key, secret_key;  // this process's key pair; empty: CURVE off
  std::string server_public_key;       // client side: the key of the servers it connects to
  // Server side: the client keys accepted; empty: any client that knows the server's
  // public key (the handshake still fails for every other peer).
  std::vector<std::string> allowed_clients;
  bool enabled() const { return !secret_key.empty(); }
};

struct CurveKeyPair {
  std::string public_key, secret_key;
};

// A new key pair (zmq_curve_keypair). kFailedPrecondition when libzmq has no CURVE.
StatusOr<CurveKeyPair> NewCurveKeyPair();
// Writes `path` (both keys, mode 0600) and `path`.pub (the public key only). Refuses to
// overwrite either (kAlreadyExists).
Status WriteCurveCert(const std::string& path, const CurveKeyPair& keys);
// Reads a certificate: both keys must be present and valid; the public key must belong
// to the secret one. Errors name the file and line.
StatusOr<CurveKeyPair> ReadCurveCert(const std::string& path);
// Reads public keys (one or more): a .pub, a certificate (its public key) or a list.
StatusOr<std::vector<std::string>> ReadCurvePublicKeys(const std::string& path);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_CURVE_H_
