#include "common/port_probe.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace onlineps {

Status ProbeTcpBind(const std::string& host, int port) {
  if (port == 0) return Status::Ok();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const bool any = host.empty() || host == "*";
  if (::getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return Status::Ok();
  }
  const int fd = ::socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  Status result = Status::Ok();
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0) {
      result = Unavailable("cannot bind " + (any ? std::string("*") : host) + ":" + service + ": " +
                           std::strerror(errno));
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return result;
}

Status ProbeEndpointBind(const std::string& endpoint) {
  constexpr char kTcp[] = "tcp://";
  if (endpoint.rfind(kTcp, 0) != 0) return Status::Ok();
  const std::string rest = endpoint.substr(sizeof kTcp - 1);
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return Status::Ok();
  std::string host = rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return Status::Ok();  // the transport's own parse names the problem
  }
  return ProbeTcpBind(host, std::stoi(port));
}

}  // namespace onlineps
