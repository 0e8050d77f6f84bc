// Every decoder of a frame that arrives from the network: the header of every PS and
// worker message (DecodeHeader) and, on a decoded header, what the receivers derive
// from it (the table spec of create_table, the reply status). A header that decodes
// must survive an encode/decode round trip unchanged. The same bytes as a worker body
// (MsgpackToJson, what the worker and the bridge decode bodies with): accepted exactly
// where nlohmann::json::from_msgpack accepts them, as the same value (bodies nested past
// its depth bound excepted: those it must refuse).
#include <nlohmann/json.hpp>
#include <string>

#include "common/json_depth.h"
#include "common/wire.h"
#include "fuzz/fuzz_entries.h"
#include "ps/table_spec.h"
#include "worker/msgpack_json.h"

namespace onlineps::fuzz {
namespace {

// Fields a receiver reads, as one string (for the round-trip comparison).
std::string Fingerprint(const Header& h) {
  std::string s = std::to_string(h.protocol) + "|" + std::to_string(static_cast<int>(h.op)) + "|" +
                  std::to_string(h.request_id) + "|" + std::to_string(h.sender) + "|" +
                  std::to_string(h.seq) + "|" + h.table + "|" + std::to_string(h.base_version) +
                  "|" + std::to_string(h.flags) + "|" + h.message + "|" + std::to_string(h.queued) +
                  "|";
  for (uint64_t d : h.shape) s += std::to_string(d) + ",";
  s += "|";
  for (const auto& [k, v] : h.spec)
    s += std::to_string(k.size()) + k + std::to_string(v.size()) + v;
  if (h.op == Op::kReply) {
    s += "|" + std::to_string(static_cast<int>(h.code)) + "|" + std::to_string(h.version) + "|" +
         std::to_string(h.tau);
  }
  return s;
}

}  // namespace

namespace {

std::string BodyOne(const uint8_t* data, size_t size) {
  constexpr size_t kDepth = 64;
  StatusOr<nlohmann::json> mine = worker::MsgpackToJson(data, size, kDepth);
  if (MsgpackNestsDeeperThan(data, size, kDepth)) {
    return mine.ok() ? "MsgpackToJson accepted a value nested past its bound" : "";
  }
  if (!mine.ok() && mine.status().code() != StatusCode::kMalformed) {
    return "MsgpackToJson failed with another code than MALFORMED: " + mine.status().ToString();
  }
  const nlohmann::json ref = nlohmann::json::from_msgpack(data, data + size, true, false);
  if (mine.ok() == ref.is_discarded()) {
    return std::string("MsgpackToJson ") + (mine.ok() ? "accepted" : "refused") +
           " what from_msgpack " + (mine.ok() ? "refuses" : "accepts");
  }
  const auto dump = [](const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  if (mine.ok() && dump(*mine) != dump(ref)) return "MsgpackToJson and from_msgpack differ";
  return "";
}

}  // namespace

std::string WireOne(const uint8_t* data, size_t size) {
  if (std::string body = BodyOne(data, size); !body.empty()) return body;
  StatusOr<Header> h = DecodeHeader(data, size);
  if (!h.ok()) {
    const StatusCode c = h.status().code();
    if (c != StatusCode::kMalformed && c != StatusCode::kUnsupportedVersion &&
        c != StatusCode::kUnknownOp) {
      return "DecodeHeader failed with an undocumented code: " + h.status().ToString();
    }
    return "";
  }
  const std::string encoded = EncodeHeader(*h);
  StatusOr<Header> again = DecodeHeader(encoded.data(), encoded.size());
  if (!again.ok()) return "re-encoded header does not decode: " + again.status().ToString();
  if (Fingerprint(*again) != Fingerprint(*h))
    return "header changed in an encode/decode round trip";
  (void)ReplyStatus(*h);
  (void)MakeReply(*h, Malformed(h->message));
  // The shard server decodes the spec of every create_table request.
  StatusOr<ps::TableSpec> spec = ps::DecodeSpec(h->spec);
  if (spec.ok()) {
    StatusOr<ps::TableSpec> back = ps::DecodeSpec(ps::EncodeSpec(*spec));
    if (!back.ok()) return "an accepted table spec does not re-decode: " + back.status().ToString();
  }
  return "";
}

}  // namespace onlineps::fuzz
