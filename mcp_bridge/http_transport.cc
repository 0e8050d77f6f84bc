#include "mcp_bridge/http_transport.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "common/file_io.h"
#include "common/mutex.h"
#include "common/strings.h"

namespace onlineps::bridge {

using nlohmann::json;

namespace {

constexpr char kJson[] = "application/json";
constexpr char kSse[] = "text/event-stream";

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// "Application/JSON; charset=utf-8" -> "application/json".
std::string MediaType(const std::string& value) {
  return Trim(Lower(value.substr(0, value.find(';'))));
}

// Whether an Accept value takes `type`: listed, or covered by "major/*" or "*/*", with a
// weight above 0 (RFC 9110 12.5.1: q=0 means "not acceptable").
bool Accepts(const std::string& accept, const std::string& type) {
  const std::string any_subtype = type.substr(0, type.find('/')) + "/*";
  std::istringstream list(accept);
  std::string range;
  while (std::getline(list, range, ',')) {
    const std::string media = MediaType(range);
    if (media != type && media != any_subtype && media != "*/*") continue;
    std::istringstream params(range);
    std::string param;
    std::getline(params, param, ';');  // the media range itself
    bool refused = false;
    while (std::getline(params, param, ';')) {
      param = Trim(Lower(param));
      if (param.rfind("q=", 0) == 0) refused = std::strtod(param.c_str() + 2, nullptr) <= 0;
    }
    if (!refused) return true;
  }
  return false;
}

// "example.com:8080" -> "example.com"; "[::1]:80" -> "[::1]".
std::string HostName(const std::string& host) {
  if (!host.empty() && host[0] == '[') return Lower(host.substr(0, host.find(']') + 1));
  return Lower(host.substr(0, host.find(':')));
}

bool IsLoopbackName(const std::string& h) {
  return h == "localhost" || h == "127.0.0.1" || h == "[::1]";
}

// "http://localhost:3000" -> host "localhost".
std::string OriginHost(const std::string& origin) {
  const size_t p = origin.find("://");
  if (p == std::string::npos) return "";
  return HostName(origin.substr(p + 3));
}

std::string OriginNoPort(const std::string& origin) {
  const size_t p = origin.find("://");
  if (p == std::string::npos) return origin;
  const std::string rest = origin.substr(p + 3);
  if (!rest.empty() && rest[0] == '[')
    return Lower(origin.substr(0, p + 3) + rest.substr(0, rest.find(']') + 1));
  return Lower(origin.substr(0, p + 3) + rest.substr(0, rest.find(':')));
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using HttpRequest = http::request<http::string_body>;

// The authority of an absolute-form target ("http://localhost:8080/mcp"), which a server
// must accept and judge instead of the Host header (RFC 9112 3.2.2); "" for origin-form.
std::string TargetAuthority(beast::string_view target) {
  const size_t p = target.find("://");
  if (target.empty() || target[0] == '/' || p == beast::string_view::npos) return "";
  const std::string scheme = Lower(std::string(target.substr(0, p)));
  if (scheme != "http" && scheme != "https") return "";
  const beast::string_view rest = target.substr(p + 3);
  return std::string(rest.substr(0, rest.find_first_of("/?#")));
}

// "/mcp?x" and "http://localhost/mcp?x" -> "/mcp".
std::string TargetPath(beast::string_view target) {
  if (!TargetAuthority(target).empty()) {
    target.remove_prefix(target.find("://") + 3);
    const size_t end = target.find_first_of("/?#");
    target = end == beast::string_view::npos || target[end] != '/' ? beast::string_view("/")
                                                                   : target.substr(end);
  }
  return std::string(target.substr(0, target.find_first_of("?#")));
}

// What the MCP rules answer to one HTTP request, before it is framed.
struct Answer {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;
  std::string body;
};

// Set while an I/O thread runs a request itself (HttpTransport::Impl::Dispatch); and
// whether that request may block it (another I/O thread is free to serve the sockets).
thread_local bool t_inline = false;
thread_local bool t_may_block = false;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SendError(Answer& res, int status, int code, const std::string& message,
               const json& id = nullptr, const json& data = nullptr) {
  res.status = status;
  // Messages may quote header values: never let a bad byte turn a 4xx into a 500.
  res.body = Dump(JsonRpcError(id, code, message, data));
  res.content_type = kJson;
}

std::string Header(const HttpRequest& req, beast::string_view name) {
  const auto it = req.find(name);
  return it == req.end() ? std::string() : std::string(it->value());
}

bool Has(const HttpRequest& req, beast::string_view name) { return req.find(name) != req.end(); }

// The first transfer coding of `req` other than chunked (the only one served), lower-cased
// without its parameters; "" when there is none.
std::string UnknownTransferCoding(const HttpRequest& req) {
  const auto fields = req.equal_range(http::field::transfer_encoding);
  for (auto field = fields.first; field != fields.second; ++field) {
    std::istringstream list{std::string(field->value())};
    std::string coding;
    while (std::getline(list, coding, ',')) {
      coding = Lower(coding.substr(0, coding.find(';')));
      const size_t first = coding.find_first_not_of(" \t");
      if (first == std::string::npos) continue;  // an empty element (RFC 9110 5.6.1)
      coding = coding.substr(first, coding.find_last_not_of(" \t") + 1 - first);
      if (coding != "chunked") return coding;
    }
  }
  return "";
}

// The status line and headers of a response; `length` nullopt: chunked (HTTP/1.1) or
// until close (HTTP/1.0).
std::string Head(const Answer& a, unsigned version, bool keep_alive, std::optional<size_t> length) {
  std::string out = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  out += std::to_string(a.status);
  out += ' ';
  out += std::string(http::obsolete_reason(static_cast<http::status>(a.status)));
  out += "\r\n";
  for (const auto& [name, value] : a.headers) out += name + ": " + value + "\r\n";
  if (!a.content_type.empty()) out += "Content-Type: " + a.content_type + "\r\n";
  if (length) {
    out += "Content-Length: " + std::to_string(*length) + "\r\n";
  } else if (version != 10) {
    out += "Transfer-Encoding: chunked\r\n";
  }
  if (!keep_alive) {
    out += "Connection: close\r\n";
  } else if (version == 10) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  return out;
}

std::string Frame(const Answer& a, unsigned version, bool keep_alive) {
  return Head(a, version, keep_alive, a.body.size()) + a.body;
}

// Per-address caps count an IPv6 client by its /64: one host usually owns a whole one.
std::string ClientKey(const tcp::endpoint& peer) {
  const asio::ip::address a = peer.address();
  if (a.is_v4()) return a.to_string();
  asio::ip::address_v6 v6 = a.to_v6();
  if (v6.is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, v6).to_string();
  if (v6.is_loopback()) return "::1";
  auto bytes = v6.to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), 0);
  return asio::ip::address_v6(bytes).to_string() + "/64";
}

// Mcp-Param-* values that are not plain ASCII arrive as =?base64?...?= (padded base64);
// nullopt for a malformed encoding.
std::optional<std::string> DecodeHeaderValue(const std::string& v) {
  if (v.size() < 11 || v.rfind("=?base64?", 0) != 0 || v.substr(v.size() - 2) != "?=") return v;
  const std::string b64 = v.substr(9, v.size() - 11);
  if (b64.size() % 4 != 0) return std::nullopt;
  static const std::string kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (size_t i = 0; i < b64.size(); ++i) {
    if (b64[i] == '=') {
      if (i + 2 < b64.size() || b64.find_first_not_of('=', i) != std::string::npos) {
        return std::nullopt;
      }
      break;
    }
    const size_t pos = kAlphabet.find(b64[i]);
    if (pos == std::string::npos) return std::nullopt;
    val = ((val << 6) + static_cast<int>(pos)) & 0xffffff;
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xff));
      bits -= 8;
    }
  }
  return out;
}

}  // namespace

StatusOr<std::map<std::string, std::string>> LoadTokens(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("--tokens-file " + path + ": cannot open");
  WarnIfOpenToOthers(path, "--tokens-file");
  std::map<std::string, std::string> tokens;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string identity, token, extra;
    ls >> identity >> token >> extra;
    const std::string where = path + ":" + std::to_string(n) + ": ";
    if (identity.empty() || token.empty() || !extra.empty()) {
      return InvalidArgument(where + "expected 'identity token'");
    }
    if (identity.size() > 64 ||
        identity.find_first_not_of(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
            std::string::npos) {
      return InvalidArgument(where + "identity must be 1-64 of [A-Za-z0-9._-]");
    }
    if (token.size() < 16) return InvalidArgument(where + "token is shorter than 16 characters");
    if (!tokens.emplace(token, identity).second) return InvalidArgument(where + "duplicate token");
  }
  if (tokens.empty()) return InvalidArgument("--tokens-file " + path + ": no tokens");
  return tokens;
}

// Bodies larger than this are read only after the request's Host, Origin and token
// checks pass.
constexpr uint64_t kAdmitBeforeBodyBytes = 64 << 10;
// How long a connection refused at the caps is drained before it closes, and how many
// are drained at once (each holds a file descriptor meanwhile).
constexpr auto kLingerRefused = std::chrono::seconds(1);
constexpr int kMaxLingeringRefused = 256;
// Beast reads at most this much at once. Its parser bounds neither a chunk header (its
// extensions) nor the trailers: the input buffer is, to the headers' limit and one read.
constexpr size_t kReadBytes = 64 << 10;

// One accepted connection. Its socket is touched only on its strand: reads, writes and
// timeouts there; a handler thread running the request hands bytes over with Send.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, HttpTransport::Impl* owner, std::string client)
      : stream_(std::move(socket)), owner_(owner), client_(std::move(client)) {}
  ~Connection();

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadHeader(); });
  }
  // From any thread: queues `bytes` of the response in order. `last`: the response ends
  // here; then the next request is read, or the connection closes when `close`.
  void Send(std::string bytes, bool last, bool close) {
    asio::post(stream_.get_executor(),
               [self = shared_from_this(), bytes = std::move(bytes), last, close]() mutable {
                 self->Push(std::move(bytes), last, close);
               });
  }

  // From the request thread, with the whole answer to a request read by this connection
  // (nothing else touches the socket until the next read starts: no hand-off needed).
  // Writes what the socket takes at once and starts reading the next request from here;
  // only the rest of a large answer, or a close, goes through the strand.
  void Finish(std::string bytes, bool close);
  // The peer's address as connections are counted (ClientKey).
  const std::string& client() const { return client_; }
  // Set once a write to the peer failed, or WatchHangUp saw it close: it hung up (or
  // stopped reading).
  const std::shared_ptr<std::atomic<bool>>& hung_up() const { return hung_up_; }
  // From any thread: while a request that writes nothing before its answer runs, looks
  // at the socket every kHangUpCheck, without reading from it, and sets hung_up() once
  // the client closed or reset the connection. Stops once `answered` is set, or at
  // bytes of a next request (pipelined), behind which an end cannot be seen.
  void WatchHangUp(std::shared_ptr<std::atomic<bool>> answered);

 private:
  void ReadHeader();
  void OnHeader(beast::error_code ec);
  void ReadBody();
  void OnBody(beast::error_code ec);
  // A request that cannot be read is answered (status, JSON-RPC error) and the
  // connection closed; a connection that timed out or reset is just closed.
  void Refuse(beast::error_code ec);
  void Push(std::string bytes, bool last, bool close);
  void Flush();
  // Drains until `until` (a second after the answer), however long the client sends.
  void Linger(std::chrono::steady_clock::time_point until);
  void WatchTick(std::shared_ptr<asio::steady_timer> timer,
                 std::shared_ptr<std::atomic<bool>> answered);

  beast::tcp_stream stream_;
  HttpTransport::Impl* const owner_;
  const std::string client_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string pending_, writing_;  // queued bytes; bytes being written
  bool busy_ = false;              // a write is in flight
  bool done_ = false;              // the response is complete once pending_ is written
  bool close_after_ = false;
  size_t served_ = 0;       // requests read on this connection
  bool answering_ = false;  // a request was read and its answer is not all written
  std::array<char, 4096> discard_;
  const std::shared_ptr<std::atomic<bool>> hung_up_ = std::make_shared<std::atomic<bool>>(false);
};

class HttpTransport::Impl {
 public:
  Impl(HttpTransportOptions options, McpServer* server)
      : options_(std::move(options)), mcp_(server), ioc_(std::max(1, options_.io_threads)) {}
  ~Impl() { Stop(); }
  StatusOr<int> Start();
  void Stop();

  const HttpTransportOptions& options() const { return options_; }
  // The Host, Origin and token checks of a request whose body is not read yet: false
  // (with `res` the refusal) when they refuse it.
  bool AdmitHeader(const HttpRequest& req, Answer& res) {
    std::string principal;
    return Admit(req, res, &principal);
  }
  // A complete request from `conn`, on the I/O thread that read it: runs it right here
  // while another I/O thread is free to serve the sockets, else on a request thread.
  void Dispatch(std::shared_ptr<Connection> conn, HttpRequest req);
  void Release(const std::string& client);
  // A request's answer is all written (or its connection is gone).
  void Answered() { answering_.fetch_sub(1, std::memory_order_acq_rel); }
  void TimedOut() { timed_out_.fetch_add(1, std::memory_order_relaxed); }
  // A response with this HTTP status is going out.
  void Responded(int status) {
    if (status >= 100 && status < 600) {
      responses_[status - 100].fetch_add(1, std::memory_order_relaxed);
    }
  }
  HttpTransportStats stats() const;
  // Stop() has begun: answers still go out, then their connections close.
  bool draining() const { return draining_.load(std::memory_order_acquire); }

 private:
  struct Work {
    std::shared_ptr<Connection> conn;
    HttpRequest req;
  };
  void Accept();
  void OnAccept(beast::error_code ec, tcp::socket socket);
  // "" when `client` may open one more connection (then counted); else why not.
  std::string Admit(const std::string& client);
  // Closes a connection refused at the caps (its 503 written) without a reset: shuts
  // down the sending side and drains it for at most kLingerRefused.
  void CloseRefused(tcp::socket socket);
  void DrainRefused(std::shared_ptr<beast::tcp_stream> stream,
                    std::shared_ptr<std::array<char, 4096>> buffer);
  void RunRequests();
  // Answers `req` on `conn`; false, having done nothing, for a request that would stream
  // while running on an I/O thread (its events must not wait for this handler to return).
  bool Serve(const std::shared_ptr<Connection>& conn, const HttpRequest& req);

  // Host, Origin and token checks shared by every method. Sets `principal`.
  bool Admit(const HttpRequest& req, Answer& res, std::string* principal);
  void Post(const HttpRequest& req, Answer& res, const std::shared_ptr<Connection>& conn,
            bool keep_alive);
  void Delete(const HttpRequest& req, Answer& res);
  // Revision 2026-07-28 header rules; false with the error set.
  bool CheckModernHeaders(const HttpRequest& req, const json& m, Answer& res);
  static void Respond(Answer& res, const Reply& r);

  const HttpTransportOptions options_;
  McpServer* const mcp_;

  mutable Mutex conn_mu_;
  std::map<std::string, size_t> open_per_client_ GUARDED_BY(conn_mu_);
  size_t open_ GUARDED_BY(conn_mu_) = 0;
  std::atomic<uint64_t> refused_per_address_{0}, refused_total_{0}, timed_out_{0};
  std::array<std::atomic<uint64_t>, 500> responses_{};  // by status - 100
  std::atomic<int64_t> answering_{0};  // requests read whose answers are not all written
  std::atomic<bool> draining_{false};
  std::atomic<int> inline_running_{0};     // requests running on I/O threads
  std::atomic<int> lingering_refused_{0};  // refused connections being drained (CloseRefused)

  Mutex work_mu_;
  CondVar work_cv_;
  std::deque<Work> work_ GUARDED_BY(work_mu_);
  bool closing_ GUARDED_BY(work_mu_) = false;

  // Declared after everything a Connection's destructor or handler uses: destroyed first.
  asio::io_context ioc_;
  // Keeps run() going while no socket operation is pending (every connection's request
  // on a request thread, the acceptor closed by a drain): their answers are still posted.
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> keep_running_;
  std::optional<asio::steady_timer> accept_retry_;
  std::optional<tcp::acceptor> acceptor_;
  std::vector<std::thread> io_threads_, request_threads_;
  bool started_ = false;
};

Connection::~Connection() {
  if (answering_) owner_->Answered();
  owner_->Release(client_);
}

void Connection::ReadHeader() {
  const HttpTransportOptions& o = owner_->options();
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(o.max_header_bytes));
  parser_->body_limit(o.max_request_bytes);
  buffer_.max_size(o.max_header_bytes + kReadBytes);
  // The first request must arrive soon after the connect; later ones may idle for the
  // keep-alive time. Either way the wait holds no thread.
  stream_.expires_after(served_ == 0 ? o.first_request_timeout
                                     : std::chrono::seconds(o.keep_alive_s));
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

void Connection::OnHeader(beast::error_code ec) {
  if (ec) return Refuse(ec);
  // RFC 9112 6.3: a request whose Transfer-Encoding does not end in chunked has no length
  // to read. Taken as bodiless, its body would run as a second (smuggled) request.
  // RFC 9112 3.2: one Host, or --allowed-hosts may judge another than a proxy routed by.
  const HttpRequest& head = parser_->get();
  const char* malformed = nullptr;
  if (head.count(http::field::transfer_encoding) > 0 && !parser_->chunked()) {
    malformed = "a Transfer-Encoding must end with chunked";
  } else if (head.count(http::field::host) > 1) {
    malformed = "more than one Host header";
  }
  if (malformed != nullptr) {
    Answer a;
    SendError(a, 400, kInvalidRequest,
              std::string("Bad Request: malformed HTTP (") + malformed + ")");
    owner_->Responded(a.status);
    return Push(Frame(a, parser_->get().version(), false), true, true);
  }
  // RFC 9112 6.1: a transfer coding the server does not know (gzip before the chunked)
  // is answered 501, never read as chunked alone and its coded body taken for the body.
  if (const std::string coding = UnknownTransferCoding(head); !coding.empty()) {
    Answer a;
    SendError(a, 501, kInvalidRequest,
              "Not Implemented: Transfer-Encoding '" + coding +
                  "' is not supported; send the body with chunked alone, or Content-Length");
    owner_->Responded(a.status);
    return Push(Frame(a, head.version(), false), true, true);
  }
  // A large body is read only for a caller the checks admit: up to --max-request-bytes
  // (and about twice that to parse) is otherwise anyone's to make the bridge hold. Small
  // ones are checked with the rest of the request, once.
  const auto length = parser_->content_length();
  if (parser_->chunked() || (length && *length > kAdmitBeforeBodyBytes)) {
    Answer a;
    if (!owner_->AdmitHeader(parser_->get(), a)) {
      owner_->Responded(a.status);
      return Push(Frame(a, parser_->get().version(), false), true, true);
    }
  }
  if (parser_->get().version() != 10 &&
      beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
    // curl and others wait for this before a larger body.
    writing_ = "HTTP/1.1 100 Continue\r\n\r\n";
    stream_.expires_after(owner_->options().write_timeout);
    asio::async_write(stream_, asio::buffer(writing_),
                      [self = shared_from_this()](beast::error_code wec, size_t) {
                        self->writing_.clear();
                        if (wec) return self->stream_.socket().close(wec);
                        self->ReadBody();
                      });
    return;
  }
  ReadBody();
}

void Connection::ReadBody() {
  stream_.expires_after(owner_->options().read_timeout);
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
}

void Connection::OnBody(beast::error_code ec) {
  if (ec) return Refuse(ec);
  ++served_;
  if (served_ >= owner_->options().keep_alive_requests) parser_->get().keep_alive(false);
  stream_.expires_never();  // the request may take as long as its tool call
  answering_ = true;
  owner_->Dispatch(shared_from_this(), parser_->release());
}

void Connection::Refuse(beast::error_code ec) {
  Answer a;
  if (ec == http::error::body_limit) {
    SendError(a, 413, kInvalidRequest, "request body is larger than --max-request-bytes");
  } else if (ec == http::error::header_limit) {
    SendError(a, 431, kInvalidRequest,
              "request line and headers are larger than " +
                  std::to_string(owner_->options().max_header_bytes) + " bytes");
  } else if (ec == http::error::buffer_overflow) {
    SendError(a, 400, kInvalidRequest,
              "Bad Request: a chunk header or the trailers are larger than " +
                  std::to_string(owner_->options().max_header_bytes) + " bytes");
  } else if (ec.category() == beast::error_code(http::error::end_of_stream).category() &&
             ec != http::error::end_of_stream && ec != http::error::partial_message) {
    SendError(a, 400, kInvalidRequest, "Bad Request: malformed HTTP (" + ec.message() + ")");
  } else {
    // Closed by the client, timed out (first request, keep-alive or body), reset.
    if (ec == beast::error::timeout) owner_->TimedOut();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    return;
  }
  owner_->Responded(a.status);
  Push(Frame(a, 11, false), true, true);
}

void Connection::Finish(std::string bytes, bool close) {
  if (!close && !owner_->draining()) {
    beast::error_code ec;
    tcp::socket& socket = stream_.socket();
    socket.non_blocking(true, ec);
    const size_t n = ec ? 0 : socket.write_some(asio::buffer(bytes), ec);
    if (!ec && n == bytes.size()) {
      answering_ = false;
      owner_->Answered();
      ReadHeader();
      return;
    }
    if (!ec) bytes.erase(0, n);
  }
  Send(std::move(bytes), true, close);  // the rest, or a close, through the strand
}

void Connection::Push(std::string bytes, bool last, bool close) {
  pending_ += bytes;
  if (last) {
    done_ = true;
    close_after_ = close;
  }
  Flush();
}

void Connection::Flush() {
  if (busy_) return;
  if (pending_.empty()) {
    if (!done_) return;
    done_ = false;
    if (answering_) {
      answering_ = false;
      owner_->Answered();
    }
    if (close_after_ || owner_->draining()) {
      return Linger(std::chrono::steady_clock::now() + std::chrono::seconds(1));
    }
    return ReadHeader();
  }
  busy_ = true;
  writing_.swap(pending_);
  pending_.clear();
  stream_.expires_after(owner_->options().write_timeout);
  asio::async_write(stream_, asio::buffer(writing_),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      self->busy_ = false;
                      self->writing_.clear();
                      if (ec) {
                        self->hung_up_->store(true);
                        if (ec == beast::error::timeout) self->owner_->TimedOut();
                        beast::error_code ignored;
                        self->stream_.socket().close(ignored);
                        return;
                      }
                      self->Flush();
                    });
}

// Closes after the response: stops sending, then reads (and drops) what the client still
// sends for up to a second, so that unread request bytes do not turn the close into a
// reset that destroys the response before the client has read it.
void Connection::Linger(std::chrono::steady_clock::time_point until) {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream_.expires_at(until);
  stream_.async_read_some(asio::buffer(discard_),
                          [self = shared_from_this(), until](beast::error_code ec, size_t) {
                            if (!ec) return self->Linger(until);
                            beast::error_code ignored;
                            self->stream_.socket().close(ignored);
                          });
}

// How often a running request's socket is looked at for a client that hung up.
constexpr auto kHangUpCheck = std::chrono::milliseconds(100);

void Connection::WatchHangUp(std::shared_ptr<std::atomic<bool>> answered) {
  auto timer = std::make_shared<asio::steady_timer>(stream_.get_executor());
  WatchTick(std::move(timer), std::move(answered));
}

void Connection::WatchTick(std::shared_ptr<asio::steady_timer> timer,
                           std::shared_ptr<std::atomic<bool>> answered) {
  timer->expires_after(kHangUpCheck);
  timer->async_wait([self = shared_from_this(), timer, answered](beast::error_code ec) {
    if (ec || answered->load() || !self->stream_.socket().is_open()) return;
    // A peek: whatever is there stays for the next request's read.
    char byte;
    const ssize_t n =
        ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      self->hung_up_->store(true);  // end of stream, or reset
      return;
    }
    if (n > 0) return;  // a next request (pipelined)
    self->WatchTick(timer, answered);
  });
}

HttpTransportStats HttpTransport::Impl::stats() const {
  HttpTransportStats s;
  {
    MutexLock lock(&conn_mu_);
    s.open = open_;
  }
  s.refused_per_address = refused_per_address_.load(std::memory_order_relaxed);
  s.refused_total = refused_total_.load(std::memory_order_relaxed);
  s.timed_out = timed_out_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < responses_.size(); ++i) {
    const uint64_t n = responses_[i].load(std::memory_order_relaxed);
    if (n > 0) s.responses[static_cast<int>(i) + 100] = n;
  }
  return s;
}

void HttpTransport::Impl::Release(const std::string& client) {
  MutexLock lock(&conn_mu_);
  --open_;
  auto it = open_per_client_.find(client);
  if (it != open_per_client_.end() && --it->second == 0) open_per_client_.erase(it);
}

std::string HttpTransport::Impl::Admit(const std::string& client) {
  MutexLock lock(&conn_mu_);
  size_t& n = open_per_client_[client];
  // 127.0.0.1 and ::1 are where a local proxy or sidecar (or a load test on the host)
  // connects from on behalf of every client: the total cap alone applies to them.
  const bool local = client == "127.0.0.1" || client == "::1";
  if (!local && n >= options_.max_connections_per_address) {
    refused_per_address_.fetch_add(1, std::memory_order_relaxed);
    return std::to_string(n) + " connections are open from " + client +
           " (--max-connections-per-address " +
           std::to_string(options_.max_connections_per_address) + ")";
  }
  if (open_ >= options_.max_connections) {
    refused_total_.fetch_add(1, std::memory_order_relaxed);
    if (n == 0) open_per_client_.erase(client);
    return std::to_string(open_) + " connections are open (--max-connections " +
           std::to_string(options_.max_connections) + ")";
  }
  ++n;
  ++open_;
  return "";
}

void HttpTransport::Impl::Accept() {
  acceptor_->async_accept(asio::make_strand(ioc_), [this](beast::error_code ec, tcp::socket s) {
    OnAccept(ec, std::move(s));
  });
}

void HttpTransport::Impl::OnAccept(beast::error_code ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !acceptor_->is_open()) return;
  if (ec) {
    // Out of file descriptors (or memory): leave the connection in the backlog and try
    // again shortly instead of spinning.
    spdlog::warn("bridge HTTP: accept failed: {}; retrying in 50 ms", ec.message());
    accept_retry_->expires_after(std::chrono::milliseconds(50));
    accept_retry_->async_wait([this](beast::error_code wec) {
      if (!wec) Accept();
    });
    return;
  }
  beast::error_code peer_ec;
  const tcp::endpoint peer = socket.remote_endpoint(peer_ec);
  if (!peer_ec) {
    const std::string client = ClientKey(peer);
    const std::string why = Admit(client);
    if (why.empty()) {
      socket.set_option(tcp::no_delay(true), peer_ec);  // headers and body in one write anyway
      std::make_shared<Connection>(std::move(socket), this, client)->Start();
    } else {
      // Answered at once (the socket's buffer takes a few hundred bytes) and closed.
      if ((refused_per_address_.load() + refused_total_.load()) % 1000 == 1) {
        spdlog::warn("bridge HTTP: refused a connection: {}", why);
      }
      Answer a;
      SendError(a, 503, kServerError, "Service Unavailable: " + why);
      Responded(a.status);
      const std::string bytes = Frame(a, 11, false);
      socket.non_blocking(true, peer_ec);
      socket.send(asio::buffer(bytes), 0, peer_ec);
      CloseRefused(std::move(socket));
    }
  }
  Accept();
}

void HttpTransport::Impl::CloseRefused(tcp::socket socket) {
  beast::error_code ec;
  socket.shutdown(tcp::socket::shutdown_send, ec);
  // Closed with the client's request unread, the socket would answer it with a reset,
  // which can destroy the 503 before the client reads it (or fail the client's write
  // of its body first): read and drop what it sends for up to kLingerRefused, as a
  // Connection does after an answer that closes. Past kMaxLingeringRefused at once (a
  // flood), the rest are closed at once.
  if (lingering_refused_.fetch_add(1, std::memory_order_relaxed) >= kMaxLingeringRefused) {
    lingering_refused_.fetch_sub(1, std::memory_order_relaxed);
    socket.close(ec);
    return;
  }
  auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
  stream->expires_after(kLingerRefused);
  DrainRefused(std::move(stream), std::make_shared<std::array<char, 4096>>());
}

void HttpTransport::Impl::DrainRefused(std::shared_ptr<beast::tcp_stream> stream,
                                       std::shared_ptr<std::array<char, 4096>> buffer) {
  stream->async_read_some(asio::buffer(*buffer),
                          [this, stream, buffer](beast::error_code ec, size_t) mutable {
                            if (!ec) return DrainRefused(std::move(stream), std::move(buffer));
                            beast::error_code ignored;
                            stream->socket().close(ignored);
                            lingering_refused_.fetch_sub(1, std::memory_order_relaxed);
                          });
}

void HttpTransport::Impl::Dispatch(std::shared_ptr<Connection> conn, HttpRequest req) {
  answering_.fetch_add(1, std::memory_order_acq_rel);
  // Requests that cannot block (a tool call with an asynchronous form) run here always;
  // the others only while another I/O thread is free to serve the sockets.
  t_may_block = inline_running_.fetch_add(1) < options_.io_threads - 1;
  t_inline = true;
  const bool answered = Serve(conn, req);
  t_inline = t_may_block = false;
  inline_running_.fetch_sub(1);
  if (answered) return;
  {
    MutexLock lock(&work_mu_);
    // Bounded: a connection has at most one request here, and connections are capped.
    work_.push_back(Work{std::move(conn), std::move(req)});
  }
  work_cv_.Signal();
}

void HttpTransport::Impl::RunRequests() {
  for (;;) {
    Work w;
    {
      MutexLock lock(&work_mu_);
      work_cv_.Wait(&work_mu_, [this]() REQUIRES(work_mu_) { return closing_ || !work_.empty(); });
      if (closing_) return;
      w = std::move(work_.front());
      work_.pop_front();
    }
    Serve(w.conn, w.req);
  }
}

bool HttpTransport::Impl::Serve(const std::shared_ptr<Connection>& conn, const HttpRequest& req) {
  // DELETE ends a session, which talks to its worker.
  if (t_inline && !t_may_block && req.method() != http::verb::post) return false;
  const bool keep_alive = req.keep_alive();
  Answer res;
  try {
    if (TargetPath(req.target()) != options_.path) {
      SendError(res, 404, kServerError, "no such path: MCP is served on the configured --path");
    } else if (req.method() == http::verb::post) {
      Post(req, res, conn, keep_alive);
      if (res.status == 0) return true;  // answered (streamed, or when the server is done)
      if (res.status < 0) return false;  // to stream or to block: not on an I/O thread
    } else if (req.method() == http::verb::delete_) {
      Delete(req, res);
    } else {
      std::string principal;
      if (Admit(req, res, &principal)) {
        res.headers.emplace_back("Allow", "POST, DELETE");
        SendError(res, 405, kServerError,
                  req.method() == http::verb::get
                      ? "Method Not Allowed: this server offers no standalone SSE stream; POST "
                        "requests"
                      : "Method Not Allowed: use POST (or DELETE to end a session)");
      }
    }
  } catch (const std::exception& e) {
    res = Answer();
    SendError(res, 500, kInternalError, std::string("internal error: ") + e.what());
  }
  Responded(res.status);
  std::string bytes = Frame(res, req.version(), keep_alive);
  // A HEAD answer ends with its headers (RFC 9110 9.3.2): a body would be read as the
  // start of the next response.
  if (req.method() == http::verb::head) bytes.resize(bytes.size() - res.body.size());
  conn->Finish(std::move(bytes), !keep_alive);
  return true;
}

bool HttpTransport::Impl::Admit(const HttpRequest& req, Answer& res, std::string* principal) {
  const std::string authority = TargetAuthority(req.target());
  const std::string host = HostName(authority.empty() ? Header(req, "Host") : authority);
  if (!options_.allowed_hosts.empty() &&
      std::find(options_.allowed_hosts.begin(), options_.allowed_hosts.end(), host) ==
          options_.allowed_hosts.end()) {
    SendError(res, 403, kServerError,
              "Forbidden: Host '" + host +
                  "' is not allowed (--allowed-hosts; DNS-rebinding "
                  "protection)");
    return false;
  }
  if (Has(req, "Origin")) {
    const std::string origin = Lower(Header(req, "Origin"));
    bool ok;
    if (options_.allowed_origins.empty()) {
      ok = IsLoopbackName(OriginHost(origin));
    } else {
      ok = std::find(options_.allowed_origins.begin(), options_.allowed_origins.end(), origin) !=
               options_.allowed_origins.end() ||
           std::find(options_.allowed_origins.begin(), options_.allowed_origins.end(),
                     OriginNoPort(origin)) != options_.allowed_origins.end();
    }
    if (!ok) {
      SendError(res, 403, kServerError,
                "Forbidden: Origin '" + origin + "' is not allowed (--allowed-origins)");
      return false;
    }
  }
  if (!options_.tokens.empty()) {
    const std::string auth = Header(req, "Authorization");
    std::string token =
        auth.size() > 7 && Lower(auth.substr(0, 7)) == "bearer " ? auth.substr(7) : "";
    for (const auto& [t, identity] : options_.tokens) {
      if (ConstantTimeEquals(t, token)) *principal = identity;
    }
    if (principal->empty()) {
      res.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"onlineps\"");
      SendError(res, 401, kServerError,
                token.empty() ? "Unauthorized: send Authorization: Bearer <token>"
                              : "Unauthorized: the bearer token is not valid");
      return false;
    }
  }
  return true;
}

bool HttpTransport::Impl::CheckModernHeaders(const HttpRequest& req, const json& m, Answer& res) {
  const json id = m.contains("id") ? m["id"] : json();
  auto mismatch = [&](const std::string& what) {
    SendError(res, 400, kHeaderMismatch, "Header mismatch: " + what, id);
    return false;
  };
  const std::string method = m.value("method", json("")).is_string() ? m.value("method", "") : "";
  if (!Has(req, "Mcp-Method")) return mismatch("the Mcp-Method header is required");
  if (Header(req, "Mcp-Method") != method) {
    return mismatch("Mcp-Method '" + Header(req, "Mcp-Method") + "' != body method '" + method +
                    "'");
  }
  const json params = m.value("params", json::object());
  const json meta = params.is_object() ? params.value("_meta", json::object()) : json::object();
  if (meta.is_object() && meta.contains("io.modelcontextprotocol/protocolVersion") &&
      meta["io.modelcontextprotocol/protocolVersion"] != Header(req, "MCP-Protocol-Version")) {
    return mismatch("MCP-Protocol-Version header != params._meta protocolVersion");
  }
  if (method == "tools/call" || method == "resources/read" || method == "prompts/get") {
    const std::string key = method == "resources/read" ? "uri" : "name";
    const json name = params.is_object() ? params.value(key, json()) : json();
    if (!Has(req, "Mcp-Name")) return mismatch("the Mcp-Name header is required");
    const auto header_name = DecodeHeaderValue(Header(req, "Mcp-Name"));
    if (!header_name) return mismatch("Mcp-Name is not valid =?base64?...?= encoding");
    if (!name.is_string() || *header_name != name.get<std::string>()) {
      return mismatch("Mcp-Name header != params." + key);
    }
  }
  if (method == "tools/call") {
    const json args = params.value("arguments", json::object());
    const bool in_body = args.is_object() && args.contains("session");
    const bool in_header = Has(req, "Mcp-Param-Session");
    if (in_body && !in_header) {
      return mismatch("arguments.session is set but the Mcp-Param-Session header is missing");
    }
    if (in_header && !in_body) {
      return mismatch("the Mcp-Param-Session header is set but arguments.session is not");
    }
    const auto header_session = DecodeHeaderValue(Header(req, "Mcp-Param-Session"));
    if (in_header && !header_session) {
      return mismatch("Mcp-Param-Session is not valid =?base64?...?= encoding");
    }
    if (in_body &&
        (!args["session"].is_string() || *header_session != args["session"].get<std::string>())) {
      return mismatch("the Mcp-Param-Session header and arguments.session differ");
    }
  }
  return true;
}

void HttpTransport::Impl::Respond(Answer& res, const Reply& r) {
  res.status = r.http_status;
  if (!r.new_session_id.empty()) res.headers.emplace_back("Mcp-Session-Id", r.new_session_id);
  if (r.cancelled()) {  // notifications/cancelled, or a 2026-07-28 client that hung up
    // The spec: no response to a cancelled request. A request's POST must still be
    // answered with JSON or an event stream: an empty stream, which a client reads as
    // ending without a response (a JSON error would reach it as a response to an id it
    // has forgotten: the TypeScript SDK reports "unknown message ID").
    res.status = 200;
    res.content_type = kSse;
    res.headers.emplace_back("Cache-Control", "no-cache");
    return;
  }
  if (r.has_body()) {
    res.body = r.Text();
    res.content_type = kJson;
  }
}

void HttpTransport::Impl::Post(const HttpRequest& req, Answer& res,
                               const std::shared_ptr<Connection>& conn, bool keep_alive) {
  std::string principal;
  if (!Admit(req, res, &principal)) return;
  if (MediaType(Header(req, "Content-Type")) != kJson) {
    SendError(res, 415, kServerError,
              "Unsupported Media Type: Content-Type must be application/json");
    return;
  }
  // Media types, not substrings: application/json-seq is not application/json, and a
  // type weighted q=0 is one the client refuses.
  const std::string accept = Header(req, "Accept");
  if (!Accepts(accept, kJson) || !Accepts(accept, kSse)) {
    SendError(res, 406, kServerError,
              "Not Acceptable: Accept must list both application/json and text/event-stream");
    return;
  }
  if (NestsDeeperThan(req.body(), kMaxJsonDepth)) {
    SendError(res, 400, kInvalidRequest,
              "Invalid Request: the body nests arrays or objects deeper than " +
                  std::to_string(kMaxJsonDepth) + " levels");
    return;
  }
  json m = json::parse(req.body(), nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded()) {
    SendError(res, 400, kParseError, "Parse error: the body is not valid JSON");
    return;
  }
  Request r;
  r.principal = principal;
  r.client_address = conn->client();
  r.session_id = Header(req, "Mcp-Session-Id");
  r.http = true;
  r.header_version = Header(req, "MCP-Protocol-Version");
  const RevisionChoice revision =
      ChooseRevision(m, r.session_id, r.header_version, TransportKind::kHttp);
  if (revision.refused()) {
    res.status = *revision.http_status;
    res.body = Dump(revision.body);
    res.content_type = kJson;
    return;
  }
  r.stateless = revision.stateless;
  if (r.stateless) r.session_id.clear();  // ignored by 2026-07-28, never echoed
  if (r.stateless && m.is_object() && !CheckModernHeaders(req, m, res)) return;
  const bool stream =
      mcp_->WantsStream(m) && (r.stateless || mcp_->HasSession(r.session_id, r.principal));
  if (!stream) {
    if (t_inline && !t_may_block && mcp_->Blocks(m)) {
      res.status = -1;  // a request thread runs it (Dispatch queues it)
      return;
    }
    // 2026-07-28 cancels a request by closing its connection: a tool call that writes
    // nothing before its answer is watched for that, as a streamed one's writes are.
    auto answered = std::make_shared<std::atomic<bool>>(false);
    if (r.stateless && m.is_object() && m.value("method", json()) == "tools/call") {
      r.cancelled = conn->hung_up();
      conn->WatchHangUp(answered);
    }
    r.message = std::move(m);
    const unsigned version = req.version();
    mcp_->HandleAsync(std::move(r), [this, conn, version, keep_alive, answered](Reply reply) {
      answered->store(true);
      Answer a;
      Respond(a, reply);
      Responded(a.status);
      conn->Finish(Frame(a, version, keep_alive), !keep_alive);
    });
    res.status = 0;  // answered, or will be
    return;
  }
  if (t_inline) {
    res.status = -1;  // a request thread streams it (Dispatch queues it)
    return;
  }
  // Streamed: progress notifications, then the response, as SSE events in chunks
  // (HTTP/1.0: until the connection closes). The SSE head goes out with the first
  // notification: a call refused before it runs (the rate limit, a bad `_meta`, a reused
  // request id) is answered as it would be without a stream, with its own status code.
  r.message = std::move(m);
  const unsigned version = req.version();
  const bool chunked = version != 10;
  const bool keep = keep_alive && chunked;
  Mutex stream_mu;
  bool streaming = false;  // guarded by stream_mu
  auto send_text = [&](const std::string& text) {
    std::string event = "event: message\ndata: " + text + "\n\n";
    if (chunked) {
      char size[24];
      snprintf(size, sizeof(size), "%zx\r\n", event.size());
      event = size + event + "\r\n";
    }
    MutexLock lock(&stream_mu);
    if (!streaming) {
      streaming = true;
      res.content_type = kSse;
      res.headers.emplace_back("Cache-Control", "no-cache");
      Responded(res.status);
      conn->Send(Head(res, version, keep, std::nullopt), false, false);
    }
    conn->Send(std::move(event), false, false);
  };
  auto send = [&](const json& msg) { send_text(Dump(msg)); };
  r.notify = send;
  // 2026-07-28 cancels a request by closing its response stream.
  if (r.stateless) r.cancelled = conn->hung_up();
  Reply reply = mcp_->Handle(r);
  bool streamed = false;
  {
    MutexLock lock(&stream_mu);
    streamed = streaming;
  }
  if (!streamed) {
    Answer a;
    Respond(a, reply);
    Responded(a.status);
    conn->Finish(Frame(a, version, keep_alive), !keep_alive);
    res.status = 0;  // answered
    return;
  }
  if (reply.has_body() && !reply.cancelled()) send_text(reply.Text());
  conn->Send(chunked ? "0\r\n\r\n" : "", true, !keep);
  res.status = 0;  // answered
}

void HttpTransport::Impl::Delete(const HttpRequest& req, Answer& res) {
  std::string principal;
  if (!Admit(req, res, &principal)) return;
  // Checked before anything ends, as a POST's: an unsupported revision is a 400
  // (2025-06-18), and 2026-07-28, which has no sessions, ignores the session id.
  const std::string version = Header(req, "MCP-Protocol-Version");
  if (version == kModernVersion) {
    res.headers.emplace_back("Allow", "POST");
    SendError(res, 405, kServerError,
              std::string("Method Not Allowed: revision ") + kModernVersion +
                  " has no sessions to end; DELETE ends a session of an earlier revision");
    return;
  }
  if (!version.empty() && !IsLegacyVersion(version)) {
    SendError(res, 400, kServerError, "Bad Request: unsupported MCP-Protocol-Version: " + version);
    return;
  }
  const std::string sid = Header(req, "Mcp-Session-Id");
  if (sid.empty()) {
    SendError(res, 400, kServerError, "Bad Request: Mcp-Session-Id header is required");
    return;
  }
  if (!mcp_->EndSession(sid, principal)) {
    SendError(res, 404, kSessionNotFound, "Session not found");
    return;
  }
  res.status = 200;
}

StatusOr<int> HttpTransport::Impl::Start() {
  const HttpTransportOptions& o = options_;
  if (o.max_connections == 0 || o.max_connections_per_address == 0 || o.threads < 1 ||
      o.io_threads < 1 || o.max_header_bytes == 0) {
    return InvalidArgument(
        "HTTP transport: connection caps, --http-threads, --http-io-threads and the header "
        "limit must be > 0");
  }
  // Each connection is a file descriptor: take the hard limit, and say so when the
  // connection cap cannot be reached.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY &&
      nofile.rlim_cur < o.max_connections + 256) {
    spdlog::warn(
        "bridge HTTP: the open-file limit ({}) is below --max-connections ({}) + 256: past "
        "it, new connections wait in the listen backlog",
        static_cast<uint64_t>(nofile.rlim_cur), o.max_connections);
  }
  const std::string where = o.host + ":" + std::to_string(o.port);
  beast::error_code ec;
  tcp::resolver resolver(ioc_);
  const auto results = resolver.resolve(o.host, std::to_string(o.port), tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    return Unavailable("cannot bind " + where + ": " + (ec ? ec.message() : "no address"));
  }
  const tcp::endpoint endpoint = *results.begin();
  acceptor_.emplace(asio::make_strand(ioc_));
  accept_retry_.emplace(acceptor_->get_executor());
  acceptor_->open(endpoint.protocol(), ec);
  // SO_REUSEADDR for a quick restart over TIME_WAIT; never SO_REUSEPORT.
  if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(endpoint, ec);
  if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    acceptor_.reset();
    return Unavailable("cannot bind " + where + ": " + ec.message());
  }
  const int port = acceptor_->local_endpoint().port();
  started_ = true;
  keep_running_.emplace(ioc_.get_executor());
  Accept();
  for (int i = 0; i < o.threads; ++i) request_threads_.emplace_back([this] { RunRequests(); });
  for (int i = 0; i < o.io_threads; ++i) io_threads_.emplace_back([this] { ioc_.run(); });
  return port;
}

void HttpTransport::Impl::Stop() {
  if (!started_) return;
  started_ = false;
  // Drain: no new connections; every request already read is answered (up to
  // drain_timeout), and each connection closes after its answer.
  draining_ = true;
  asio::post(acceptor_->get_executor(), [this] {
    beast::error_code ignored;
    acceptor_->close(ignored);
    accept_retry_->cancel();
  });
  const auto deadline = std::chrono::steady_clock::now() + options_.drain_timeout;
  while (answering_.load(std::memory_order_acquire) > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (answering_.load() > 0) {
    spdlog::warn("bridge HTTP: {} requests still unanswered after the {} ms drain",
                 answering_.load(), options_.drain_timeout.count());
  }
  keep_running_.reset();
  ioc_.stop();
  for (auto& t : io_threads_) t.join();
  io_threads_.clear();
  // Requests already running finish (their answers are dropped); queued ones are not run.
  {
    MutexLock lock(&work_mu_);
    closing_ = true;
  }
  work_cv_.SignalAll();
  for (auto& t : request_threads_) t.join();
  request_threads_.clear();
  std::deque<Work> dropped;
  {
    MutexLock lock(&work_mu_);
    dropped.swap(work_);
  }
}

HttpTransport::HttpTransport(HttpTransportOptions options, McpServer* server)
    : impl_(std::make_unique<Impl>(std::move(options), server)) {}
HttpTransport::~HttpTransport() { Stop(); }
StatusOr<int> HttpTransport::Start() { return impl_->Start(); }
void HttpTransport::Stop() { impl_->Stop(); }
HttpTransportStats HttpTransport::stats() const { return impl_->stats(); }

}  // namespace onlineps::bridge
