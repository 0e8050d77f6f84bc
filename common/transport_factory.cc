// NewServerTransport / NewClientTransport: the endpoint scheme picks the implementation.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mem_transport.h"
#include "common/transport.h"
#include "common/zmq_transport.h"

namespace onlineps {
namespace {

enum class Family { kZmq, kMem, kUnknown };

Family FamilyOf(const std::string& endpoint) {
  auto starts_with = [&endpoint](const char* prefix) { return endpoint.rfind(prefix, 0) == 0; };
  if (starts_with("mem://")) return Family::kMem;
  if (starts_with("tcp://") || starts_with("ipc://") || starts_with("inproc://")) {
    return Family::kZmq;
  }
  return Family::kUnknown;
}

Status BadScheme(const std::string& endpoint) {
  return InvalidArgument("unsupported endpoint '" + endpoint +
                         "' (want tcp://, ipc://, inproc:// or mem://)");
}

// tcp://HOST:PORT with PORT in 0..65535 or * (ZeroMQ would take 70000 modulo 65536).
Status CheckTcpPort(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return Status::Ok();
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < 6) {
    return InvalidArgument("endpoint '" + endpoint + "' has no port (want tcp://HOST:PORT)");
  }
  const std::string port = endpoint.substr(colon + 1);
  if (colon == 6) {
    return InvalidArgument("endpoint '" + endpoint + "' has no host (want tcp://HOST:PORT)");
  }
  if (port == "*") return Status::Ok();
  const bool digits = !port.empty() && port.size() <= 5 &&
                      port.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoi(port) > 65535) {
    return InvalidArgument("endpoint '" + endpoint + "': port '" + port +
                           "' is not in 0..65535 (want tcp://HOST:PORT)");
  }
  return Status::Ok();
}

// Stands in for a transport that cannot exist, so the factories can keep returning a
// plain unique_ptr: the error surfaces from Start/Connect like any other.
class InvalidServerTransport final : public ServerTransport {
 public:
  explicit InvalidServerTransport(Status status) : status_(std::move(status)) {}
  StatusOr<std::string> Start(const std::string&, Handler) override { return status_; }
  Status Send(const std::string&, Frames) override { return Unavailable(status_.message()); }
  void Stop() override {}

 private:
  const Status status_;
};

class InvalidClientTransport final : public ClientTransport {
 public:
  explicit InvalidClientTransport(Status status) : status_(std::move(status)) {}
  Status Connect(const std::vector<std::string>&, Handler) override { return status_; }
  Status Send(size_t, Frames) override { return Unavailable(status_.message()); }
  void Close() override {}

 private:
  const Status status_;
};

}  // namespace

Status CheckEndpoint(const std::string& endpoint) {
  if (FamilyOf(endpoint) == Family::kUnknown) return BadScheme(endpoint);
  return CheckTcpPort(endpoint);
}

std::unique_ptr<ServerTransport> NewServerTransport(const std::string& endpoint,
                                                    const TransportOptions& options) {
  if (Status st = CheckEndpoint(endpoint); !st.ok()) {
    return std::make_unique<InvalidServerTransport>(st);
  }
  switch (FamilyOf(endpoint)) {
    case Family::kZmq:
      return std::make_unique<ZmqServerTransport>(options);
    case Family::kMem:
      return std::make_unique<MemServerTransport>(options);
    case Family::kUnknown:  // refused by CheckEndpoint
      break;
  }
  return std::make_unique<InvalidServerTransport>(BadScheme(endpoint));
}

// One client speaks to all its servers through one implementation, so the endpoints
// must all be of one family.
std::unique_ptr<ClientTransport> NewClientTransport(const std::vector<std::string>& endpoints,
                                                    const TransportOptions& options) {
  if (endpoints.empty()) {
    return std::make_unique<InvalidClientTransport>(InvalidArgument("no server endpoints"));
  }
  const Family family = FamilyOf(endpoints[0]);
  for (const std::string& endpoint : endpoints) {
    if (Status st = CheckEndpoint(endpoint); !st.ok()) {
      return std::make_unique<InvalidClientTransport>(st);
    }
    if (FamilyOf(endpoint) != family) {
      return std::make_unique<InvalidClientTransport>(InvalidArgument(
          "cannot mix mem:// and ZeroMQ endpoints: '" + endpoints[0] + "', '" + endpoint + "'"));
    }
  }
  std::unique_ptr<ClientTransport> transport;
  if (family == Family::kMem) {
    transport = std::make_unique<MemClientTransport>(options);
  } else {
    transport = std::make_unique<ZmqClientTransport>(options);
  }
  if (!options.decorate) return transport;
  return options.decorate(std::move(transport));
}

}  // namespace onlineps
