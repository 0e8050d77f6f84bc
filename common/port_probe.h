// ProbeTcpBind: whether a TCP port can be bound now, checked at a process's start so
// that a port taken by another process is reported at once, not after the process has
// waited for its peers (shards, workers) and only then opened its socket.
#ifndef ONLINEPS_COMMON_PORT_PROBE_H_
#define ONLINEPS_COMMON_PORT_PROBE_H_

#include <string>

#include "common/status.h"

namespace onlineps {

// Binds a TCP socket to host:port (SO_REUSEADDR, as the real listeners do) and closes it.
// kUnavailable with the system's reason ("Address already in use") when the bind fails.
// Ok for port 0 (any free port), and for a host that does not resolve as an address (a
// ZeroMQ interface name: its own bind reports it).
Status ProbeTcpBind(const std::string& host, int port);

// The same for a ZeroMQ endpoint: "tcp://HOST:PORT" ("*" or "[v6]" hosts included); Ok
// for any other transport.
Status ProbeEndpointBind(const std::string& endpoint);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_PORT_PROBE_H_
