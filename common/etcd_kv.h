// EtcdKv: KvStore over etcd's v3 JSON gateway (etcd 3.4+: POST /v3/lease/grant,
// /v3/lease/keepalive, /v3/lease/revoke, /v3/kv/range, /v3/kv/txn; keys and values
// base64). One thread sends the calls in order, trying the next endpoint when one
// cannot be reached; every call has a deadline. Plain HTTP: run etcd on a trusted
// network (loopback, or a cluster network closed by policy); docs/reliability.md.
// Thread-safe. The destructor fails the calls still queued with kCancelled.
#ifndef ONLINEPS_COMMON_ETCD_KV_H_
#define ONLINEPS_COMMON_ETCD_KV_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/kv_store.h"

namespace onlineps {

struct EtcdKvOptions {
  // http://HOST:PORT of each etcd member (a bare HOST:PORT means http://).
  std::vector<std::string> endpoints;
  std::chrono::milliseconds timeout{1000};  // per HTTP call, connect included
  size_t max_queued = 1024;                 // calls waiting; beyond, refused at once
};

// Checks the endpoint list (non-empty, each http://HOST:PORT or HOST:PORT with a port
// in range); errors name the bad entry.
Status ValidateEtcdEndpoints(const std::vector<std::string>& endpoints);

std::unique_ptr<KvStore> NewEtcdKv(EtcdKvOptions options);

// Base64 (RFC 4648, with padding), as etcd's JSON gateway encodes bytes. Exposed for tests.
std::string Base64Encode(const std::string& bytes);
StatusOr<std::string> Base64Decode(const std::string& text);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_ETCD_KV_H_
