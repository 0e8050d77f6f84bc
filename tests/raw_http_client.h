// RawClient: a loopback TCP client that sends exactly the bytes a test gives it (a probe,
// a slow or hostile client, an idle connection) and reads HTTP/1.x responses back.
#ifndef ONLINEPS_TESTS_RAW_HTTP_CLIENT_H_
#define ONLINEPS_TESTS_RAW_HTTP_CLIENT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace onlineps::testing {

// One HTTP response as a raw client saw it.
struct Reply {
  int status = 0;
  std::string version;                         // "HTTP/1.1" or "HTTP/1.0"
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;

  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

// A loopback TCP client that sends exactly the bytes a test gives it: a probe, a
// scraper, or a slow or hostile client.
class RawClient {
 public:
  using Clock = std::chrono::steady_clock;
  using milliseconds = std::chrono::milliseconds;
  static constexpr char kHost[] = "127.0.0.1";

  // Connected to kHost:port from `source` (any 127/8 address; null: the default), with
  // SO_RCVBUF set to `rcvbuf` first when > 0. Null when the connect fails.
  static std::unique_ptr<RawClient> Connect(int port, const char* source = nullptr,
                                            int rcvbuf = 0) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return nullptr;
    auto client = std::unique_ptr<RawClient>(new RawClient(fd));
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    if (source != nullptr) {
      inet_pton(AF_INET, source, &addr.sin_addr);
      if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return nullptr;
    }
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, kHost, &addr.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return nullptr;
    return client;
  }
  ~RawClient() { close(fd_); }
  int fd() const { return fd_; }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // The next response (for HEAD: without a body), or nullopt when none is complete
  // within `timeout` or the connection ends first.
  std::optional<Reply> Read(milliseconds timeout, bool head = false) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (std::optional<Reply> reply = Take(head)) return reply;
      if (Fill(deadline) != kData) return std::nullopt;
    }
  }

  // True when the server closes the connection (EOF or reset) within `timeout`; what
  // arrives before is discarded.
  bool WaitClosed(milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      buffer_.clear();
      FillResult result = Fill(deadline);
      if (result != kData) return result == kClosed;
    }
  }

 private:
  enum FillResult { kData, kClosed, kTimeout };

  explicit RawClient(int fd) : fd_(fd) {}

  FillResult Fill(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0))) <= 0) return kTimeout;
    char buf[65536];
    ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return kClosed;
    buffer_.append(buf, static_cast<size_t>(n));
    return kData;
  }

  std::optional<Reply> Take(bool head) {
    size_t end = buffer_.find("\r\n\r\n");
    if (end == std::string::npos ||
        (buffer_.compare(0, 9, "HTTP/1.1 ") != 0 && buffer_.compare(0, 9, "HTTP/1.0 ") != 0)) {
      return std::nullopt;
    }
    Reply reply;
    reply.version = buffer_.substr(0, 8);
    reply.status = std::stoi(buffer_.substr(9, 3));
    for (size_t pos = buffer_.find("\r\n") + 2; pos < end;) {
      size_t eol = buffer_.find("\r\n", pos);
      std::string line = buffer_.substr(pos, eol - pos);
      std::string name = line.substr(0, line.find(':'));
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      reply.headers[name] = line.substr(std::min(line.find(':') + 2, line.size()));
      pos = eol + 2;
    }
    const std::string content_length = reply.Header("content-length");
    size_t length = head || content_length.empty() ? 0 : std::stoul(content_length);
    if (buffer_.size() < end + 4 + length) return std::nullopt;
    reply.body = buffer_.substr(end + 4, length);
    buffer_.erase(0, end + 4 + length);
    return reply;
  }

  const int fd_;
  std::string buffer_;  // received, not yet taken
};

}  // namespace onlineps::testing

#endif  // ONLINEPS_TESTS_RAW_HTTP_CLIENT_H_
