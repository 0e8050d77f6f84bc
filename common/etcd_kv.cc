#include "common/etcd_kv.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <deque>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/mutex.h"

namespace onlineps {

namespace {

using nlohmann::json;

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

struct Endpoint {
  std::string host;
  int port = 0;
};

StatusOr<Endpoint> ParseEndpoint(const std::string& text) {
  std::string rest = text;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  if (rest.rfind("https://", 0) == 0) {
    return InvalidArgument("etcd endpoint '" + text + "': https is not supported; use http://");
  }
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgument("etcd endpoint '" + text + "': expected http://HOST:PORT");
  }
  Endpoint e;
  e.host = rest.substr(0, colon);
  try {
    size_t used = 0;
    e.port = std::stoi(rest.substr(colon + 1), &used);
    if (used != rest.size() - colon - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    return InvalidArgument("etcd endpoint '" + text + "': the port is not a number");
  }
  if (e.port < 1 || e.port > 65535) {
    return InvalidArgument("etcd endpoint '" + text + "': port out of range 1-65535");
  }
  return e;
}

// etcd's JSON gateway writes 64-bit integers as strings and omits zero values.
template <typename T>
T Int(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const json& v = j[key];
  if (v.is_string()) {
    try {
      return static_cast<T>(std::stoll(v.get<std::string>()));
    } catch (const std::exception&) {
      return 0;
    }
  }
  return v.is_number() ? v.get<T>() : 0;
}
uint64_t U64(const json& j, const char* key) { return Int<uint64_t>(j, key); }
int64_t I64(const json& j, const char* key) { return Int<int64_t>(j, key); }

// The end of a prefix range: the prefix with its last byte incremented.
std::string RangeEnd(std::string prefix) {
  while (!prefix.empty()) {
    unsigned char c = static_cast<unsigned char>(prefix.back());
    if (c < 0xff) {
      prefix.back() = static_cast<char>(c + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

StatusOr<std::vector<KvEntry>> ParseKvs(const json& kvs) {
  std::vector<KvEntry> out;
  if (!kvs.is_array()) return out;
  for (const json& kv : kvs) {
    KvEntry e;
    auto key = Base64Decode(kv.value("key", std::string()));
    auto value = Base64Decode(kv.value("value", std::string()));
    if (!key.ok()) return key.status();
    if (!value.ok()) return value.status();
    e.key = *key;
    e.value = *value;
    e.create_revision = U64(kv, "create_revision");
    e.mod_revision = U64(kv, "mod_revision");
    e.lease = U64(kv, "lease");
    out.push_back(std::move(e));
  }
  return out;
}

class EtcdKv final : public KvStore {
 public:
  EtcdKv(EtcdKvOptions options, std::vector<Endpoint> endpoints)
      : options_(std::move(options)), endpoints_(std::move(endpoints)) {
    thread_ = std::thread([this] { Loop(); });
    watchdog_ = std::thread([this] { Watchdog(); });
  }

  ~EtcdKv() override {
    {
      MutexLock lock(&watch_mu_);
      watch_stop_ = true;
    }
    watch_cv_.SignalAll();
    watchdog_.join();
    std::deque<Call> left;
    {
      MutexLock lock(&mu_);
      stop_ = true;
      left.swap(queue_);
      for (Call& c : urgent_) left.push_back(std::move(c));
      urgent_.clear();
    }
    cv_.SignalAll();
    thread_.join();
    for (Call& c : left) {
      KvResult r;
      r.status = Cancelled("etcd client shutting down");
      c.done(std::move(r));
    }
  }

  void Grant(int64_t ttl_s, Callback done) override {
    Enqueue("/v3/lease/grant", json{{"TTL", std::to_string(ttl_s)}}, std::move(done), false,
            [](const json& j, KvResult* r) {
              r->lease = U64(j, "ID");
              r->ttl_s = I64(j, "TTL");
              if (r->lease == 0) r->status = Unavailable("etcd granted no lease");
            });
  }

  void KeepAlive(uint64_t lease, Callback done) override {
    Enqueue("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}, std::move(done), true,
            [](const json& j, KvResult* r) {
              // A stream of one message: {"result": {...}}; TTL absent or <= 0 when expired.
              const json& res = j.contains("result") ? j["result"] : j;
              r->lease = U64(res, "ID");
              r->ttl_s = I64(res, "TTL");
            });
  }

  void Revoke(uint64_t lease, Callback done) override {
    Enqueue("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}, std::move(done), true,
            [](const json&, KvResult*) {});
  }

  void Range(const std::string& prefix, Callback done) override {
    Enqueue("/v3/kv/range", RangeJson(prefix), std::move(done), false,
            [](const json& j, KvResult* r) {
              auto kvs = ParseKvs(j.value("kvs", json::array()));
              if (!kvs.ok()) {
                r->status = kvs.status();
                return;
              }
              r->entries = std::move(kvs).value();
            });
  }

  void Txn(KvTxn txn, Callback done) override {
    json body = {
        {"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
    for (const auto& c : txn.compares) {
      const bool create = c.target == KvTxn::Compare::Target::kCreateRevision;
      body["compare"].push_back(
          {{"key", Base64Encode(c.key)},
           {"result", "EQUAL"},
           {"target", create ? "CREATE" : "MOD"},
           {create ? "create_revision" : "mod_revision", std::to_string(c.revision)}});
    }
    for (const auto& p : txn.puts) {
      json put = {{"key", Base64Encode(p.key)}, {"value", Base64Encode(p.value)}};
      if (p.lease != 0) put["lease"] = std::to_string(p.lease);
      body["success"].push_back({{"request_put", put}});
    }
    for (const auto& d : txn.deletes) {
      body["success"].push_back({{"request_delete_range", {{"key", Base64Encode(d)}}}});
    }
    if (!txn.read_prefix.empty()) {
      body["success"].push_back({{"request_range", RangeJson(txn.read_prefix)}});
      body["failure"].push_back({{"request_range", RangeJson(txn.read_prefix)}});
    }
    Enqueue("/v3/kv/txn", body, std::move(done), false, [](const json& j, KvResult* r) {
      r->succeeded = j.value("succeeded", false);
      for (const json& resp : j.value("responses", json::array())) {
        if (!resp.contains("response_range")) continue;
        auto kvs = ParseKvs(resp["response_range"].value("kvs", json::array()));
        if (!kvs.ok()) {
          r->status = kvs.status();
          return;
        }
        r->entries = std::move(kvs).value();
      }
    });
  }

 private:
  using Parse = std::function<void(const json&, KvResult*)>;
  struct Call {
    std::string path;
    std::string body;
    Callback done;
    Parse parse;
  };

  static json RangeJson(const std::string& prefix) {
    return json{{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(RangeEnd(prefix))}};
  }

  // `urgent` calls (lease renewals and revocations) go before the others: a renewal
  // queued behind slow reads would let a healthy primary's lease run out.
  void Enqueue(std::string path, const json& body, Callback done, bool urgent, Parse parse) {
    {
      MutexLock lock(&mu_);
      if (!stop_ && queue_.size() + urgent_.size() < options_.max_queued) {
        (urgent ? urgent_ : queue_)
            .push_back(Call{std::move(path), body.dump(), std::move(done), std::move(parse)});
        cv_.Signal();
        return;
      }
    }
    KvResult r;
    r.status = ResourceExhausted("more than " + std::to_string(options_.max_queued) +
                                 " etcd calls queued");
    done(std::move(r));
  }

  void Loop() {
    MutexLock lock(&mu_);
    while (true) {
      cv_.Wait(&mu_,
               [this]() REQUIRES(mu_) { return stop_ || !queue_.empty() || !urgent_.empty(); });
      if (stop_) return;
      auto& from = urgent_.empty() ? queue_ : urgent_;
      Call call = std::move(from.front());
      from.pop_front();
      lock.Unlock();
      KvResult r = Execute(call);
      call.done(std::move(r));
      lock.Lock();
    }
  }

  KvResult Execute(const Call& call) {
    KvResult r;
    std::string last_error;
    for (size_t attempt = 0; attempt < endpoints_.size(); ++attempt) {
      const size_t e = (current_ + attempt) % endpoints_.size();
      auto& client = Client(e);
      // etcd's gateway ends error answers with HTTP trailers, which this HTTP client
      // cannot read: the body is collected as it arrives, so the error still shows.
      httplib::Request req;
      req.method = "POST";
      req.path = call.path;
      req.body = call.body;
      req.set_header("Content-Type", "application/json");
      std::string body;
      req.content_receiver = [&body](const char* data, size_t n, uint64_t, uint64_t) {
        body.append(data, n);
        return body.size() < (size_t{64} << 20);
      };
      httplib::Response res;
      httplib::Error err = httplib::Error::Success;
      // The client's timeouts bound each read, not the call: a member that sends a byte
      // now and then would hold this thread (and the lease renewals behind it) forever.
      // The watchdog stops the client at the deadline, whatever it waits for (a connect,
      // headers, the body).
      const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
      Watch(&client, deadline);
      const bool sent = client.send(req, res, err);
      Watch(nullptr, deadline);
      json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
      if (!sent && (res.status <= 0 || !j.is_object())) {
        last_error = endpoints_[e].host + ":" + std::to_string(endpoints_[e].port) + ": " +
                     httplib::to_string(err);
        client.stop();
        continue;
      }
      if (!sent) client.stop();  // the connection is in an unknown state
      if (res.status >= 500 || (res.status != 200 && !j.is_object())) {
        // This member cannot serve (no quorum, shutting down): try the next one.
        last_error = endpoints_[e].host + ":" + std::to_string(endpoints_[e].port) + ": HTTP " +
                     std::to_string(res.status) + ": " +
                     (j.is_object() ? j.value("message", std::string()) : body.substr(0, 200));
        client.stop();
        continue;
      }
      if (res.status != 200 || !j.is_object()) {
        const std::string msg =
            j.is_object() ? j.value("message", j.value("error", body)) : body.substr(0, 200);
        r.status =
            Unavailable("etcd " + call.path + ": HTTP " + std::to_string(res.status) + ": " + msg);
        return r;
      }
      current_ = e;
      r.revision = j.contains("header") ? U64(j["header"], "revision") : 0;
      if (j.contains("result") && j["result"].contains("header")) {
        r.revision = U64(j["result"]["header"], "revision");
      }
      try {
        call.parse(j, &r);
      } catch (const json::exception& ex) {
        r.status =
            Unavailable(std::string("etcd ") + call.path + ": unexpected answer: " + ex.what());
      }
      return r;
    }
    r.status = Unavailable("etcd unreachable (" + last_error + ")");
    return r;
  }

  // The client of the call in progress is stopped once `deadline` passes (null: none).
  void Watch(httplib::Client* client, std::chrono::steady_clock::time_point deadline) {
    {
      MutexLock lock(&watch_mu_);
      watched_ = client;
      watch_until_ = deadline;
    }
    watch_cv_.Signal();
  }

  void Watchdog() {
    MutexLock lock(&watch_mu_);
    while (!watch_stop_) {
      if (watched_ == nullptr) {
        watch_cv_.Wait(&watch_mu_);
      } else if (std::chrono::steady_clock::now() >= watch_until_) {
        watched_->stop();  // the call's send returns with an error
        watched_ = nullptr;
      } else {
        watch_cv_.WaitUntil(&watch_mu_, watch_until_);
      }
    }
  }

  httplib::Client& Client(size_t e) {
    if (clients_.size() != endpoints_.size()) clients_.resize(endpoints_.size());
    if (!clients_[e]) {
      clients_[e] = std::make_unique<httplib::Client>(endpoints_[e].host, endpoints_[e].port);
      const auto t = options_.timeout;
      const auto s = std::chrono::duration_cast<std::chrono::seconds>(t);
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t - s);
      clients_[e]->set_connection_timeout(s.count(), us.count());
      clients_[e]->set_read_timeout(s.count(), us.count());
      clients_[e]->set_write_timeout(s.count(), us.count());
      clients_[e]->set_keep_alive(true);
    }
    return *clients_[e];
  }

  // Immutable after construction.
  const EtcdKvOptions options_;
  const std::vector<Endpoint> endpoints_;

  Mutex mu_;
  CondVar cv_;
  std::deque<Call> queue_ GUARDED_BY(mu_), urgent_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  // Used by the loop thread only.
  std::vector<std::unique_ptr<httplib::Client>> clients_;
  size_t current_ = 0;
  std::thread thread_;
  Mutex watch_mu_;
  CondVar watch_cv_;
  httplib::Client* watched_ GUARDED_BY(watch_mu_) = nullptr;
  std::chrono::steady_clock::time_point watch_until_ GUARDED_BY(watch_mu_);
  bool watch_stop_ GUARDED_BY(watch_mu_) = false;
  std::thread watchdog_;
};

}  // namespace

Status ValidateEtcdEndpoints(const std::vector<std::string>& endpoints) {
  if (endpoints.empty()) return InvalidArgument("no etcd endpoint given");
  for (const std::string& e : endpoints) {
    auto parsed = ParseEndpoint(e);
    if (!parsed.ok()) return parsed.status();
  }
  return Status::Ok();
}

std::unique_ptr<KvStore> NewEtcdKv(EtcdKvOptions options) {
  std::vector<Endpoint> endpoints;
  for (const std::string& e : options.endpoints) {
    auto parsed = ParseEndpoint(e);
    if (parsed.ok()) endpoints.push_back(*parsed);
  }
  if (endpoints.empty()) endpoints.push_back(Endpoint{"127.0.0.1", 2379});
  return std::make_unique<EtcdKv>(std::move(options), std::move(endpoints));
}

std::string Base64Encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (static_cast<unsigned char>(bytes[i]) << 16) |
                       (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  const size_t left = bytes.size() - i;
  if (left > 0) {
    uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (left == 2) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += left == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

StatusOr<std::string> Base64Decode(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) return Malformed("invalid base64 character in an etcd answer");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

}  // namespace onlineps
