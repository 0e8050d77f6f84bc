#include "common/wire.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <msgpack.hpp>

#include "common/json_depth.h"

namespace onlineps {

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kPing:
      return "ping";
    case Op::kCreateTable:
      return "create_table";
    case Op::kPullDense:
      return "pull_dense";
    case Op::kPushDense:
      return "push_dense";
    case Op::kPullSparse:
      return "pull_sparse";
    case Op::kPushSparse:
      return "push_sparse";
    case Op::kCheckpoint:
      return "checkpoint";
    case Op::kTableInfo:
      return "table_info";
    case Op::kReply:
      return "reply";
    case Op::kInfer:
      return "infer";
    case Op::kLearn:
      return "learn";
    case Op::kContextSet:
      return "context_set";
    case Op::kContextAppend:
      return "context_append";
    case Op::kContextClear:
      return "context_clear";
    case Op::kContextGet:
      return "context_get";
    case Op::kWorkerStats:
      return "worker_stats";
    case Op::kReplicate:
      return "replicate";
    case Op::kReplSnapshot:
      return "repl_snapshot";
    case Op::kReplStatus:
      return "repl_status";
    case Op::kGroupSumFloats:
      return "group_sum_floats";
    case Op::kGroupMinU64:
      return "group_min_u64";
    case Op::kWatch:
      return "watch";
    case Op::kModelInfo:
      return "model_info";
    case Op::kPushBatch:
      return "push_batch";
  }
  return "unknown";
}

namespace {

constexpr uint8_t kMaxOp = static_cast<uint8_t>(kLastOp);
constexpr uint8_t kMaxCode = static_cast<uint8_t>(StatusCode::kNotPrimary);
constexpr size_t kMaxHeaderDepth = 16;

template <typename Packer>
void PackKey(Packer& pk, const char* key) {
  pk.pack_str(static_cast<uint32_t>(std::strlen(key)));
  pk.pack_str_body(key, static_cast<uint32_t>(std::strlen(key)));
}

template <typename Packer>
void PackStr(Packer& pk, const std::string& s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// Reads an unsigned integer field; false when the type is wrong.
bool GetUint(const msgpack::object& o, uint64_t* out) {
  if (o.type != msgpack::type::POSITIVE_INTEGER) return false;
  *out = o.via.u64;
  return true;
}

bool GetStr(const msgpack::object& o, std::string* out) {
  if (o.type != msgpack::type::STR) return false;
  out->assign(o.via.str.ptr, o.via.str.size);
  return true;
}

Status FieldError(std::string_view field, std::string_view want) {
  return Malformed("header field '" + std::string(field) + "' must be " + std::string(want));
}

Status DecodeField(const msgpack::object& key, const msgpack::object& val, Header* h, bool* saw_v,
                   bool* saw_op) {
  uint64_t u = 0;
  std::string_view k(key.via.str.ptr, key.via.str.size);
  if (k == "v") {
    if (!GetUint(val, &u) || u > UINT32_MAX) return FieldError(k, "an unsigned 32-bit integer");
    h->protocol = static_cast<uint32_t>(u);
    *saw_v = true;
  } else if (k == "op") {
    if (!GetUint(val, &u) || u > 255) return FieldError(k, "an unsigned 8-bit integer");
    if (u > kMaxOp) return UnknownOp("unknown op " + std::to_string(u));
    h->op = static_cast<Op>(u);
    *saw_op = true;
  } else if (k == "rid") {
    if (!GetUint(val, &u) || u > UINT32_MAX) return FieldError(k, "an unsigned 32-bit integer");
    h->request_id = static_cast<uint32_t>(u);
  } else if (k == "sid") {
    if (!GetUint(val, &h->sender)) return FieldError(k, "an unsigned integer");
  } else if (k == "seq") {
    if (!GetUint(val, &h->seq)) return FieldError(k, "an unsigned integer");
  } else if (k == "tbl") {
    if (!GetStr(val, &h->table)) return FieldError(k, "a string");
  } else if (k == "shape") {
    if (val.type != msgpack::type::ARRAY) return FieldError(k, "an array of unsigned integers");
    h->shape.clear();
    for (uint32_t i = 0; i < val.via.array.size; ++i) {
      if (!GetUint(val.via.array.ptr[i], &u)) return FieldError(k, "an array of unsigned integers");
      h->shape.push_back(u);
    }
  } else if (k == "base") {
    if (!GetUint(val, &h->base_version)) return FieldError(k, "an unsigned integer");
  } else if (k == "ep") {
    if (!GetUint(val, &h->epoch)) return FieldError(k, "an unsigned integer");
  } else if (k == "flags") {
    if (!GetUint(val, &u) || u > UINT32_MAX) return FieldError(k, "an unsigned 32-bit integer");
    h->flags = static_cast<uint32_t>(u);
  } else if (k == "code") {
    if (!GetUint(val, &u) || u > kMaxCode) return FieldError(k, "a known status code");
    h->code = static_cast<StatusCode>(u);
  } else if (k == "msg") {
    if (!GetStr(val, &h->message)) return FieldError(k, "a string");
  } else if (k == "ver") {
    if (!GetUint(val, &h->version)) return FieldError(k, "an unsigned integer");
  } else if (k == "tau") {
    if (!GetUint(val, &h->tau)) return FieldError(k, "an unsigned integer");
  } else if (k == "pri") {
    if (!GetUint(val, &u) || u > UINT32_MAX) return FieldError(k, "an unsigned 32-bit integer");
    h->primary = static_cast<uint32_t>(u);
  } else if (k == "queued") {
    if (val.type != msgpack::type::BOOLEAN) return FieldError(k, "a boolean");
    h->queued = val.via.boolean;
  } else if (k == "spec") {
    if (val.type != msgpack::type::MAP) return FieldError(k, "a map of string to string");
    for (uint32_t i = 0; i < val.via.map.size; ++i) {
      std::string sk, sv;
      if (!GetStr(val.via.map.ptr[i].key, &sk) || !GetStr(val.via.map.ptr[i].val, &sv)) {
        return FieldError(k, "a map of string to string");
      }
      h->spec[sk] = sv;
    }
  }
  // Unknown keys are ignored so that newer peers may add optional fields.
  return Status::Ok();
}

}  // namespace

std::string EncodeHeader(const Header& h) {
  msgpack::sbuffer buf(128);
  msgpack::packer<msgpack::sbuffer> pk(buf);
  uint32_t n = 3;  // v, op, rid
  const bool reply = h.op == Op::kReply;
  n += h.sender != 0;
  n += h.seq != 0;
  n += !h.table.empty();
  n += !h.shape.empty();
  n += h.base_version != 0;
  n += h.flags != 0;
  n += h.epoch != 0;
  n += reply ? 3 : 0;  // code, ver, tau
  n += !h.message.empty();
  n += h.queued;
  n += h.primary.has_value();
  n += !h.spec.empty();
  pk.pack_map(n);
  PackKey(pk, "v");
  pk.pack_uint32(h.protocol);
  PackKey(pk, "op");
  pk.pack_uint8(static_cast<uint8_t>(h.op));
  PackKey(pk, "rid");
  pk.pack_uint32(h.request_id);
  if (h.sender != 0) {
    PackKey(pk, "sid");
    pk.pack_uint64(h.sender);
  }
  if (h.seq != 0) {
    PackKey(pk, "seq");
    pk.pack_uint64(h.seq);
  }
  if (!h.table.empty()) {
    PackKey(pk, "tbl");
    PackStr(pk, h.table);
  }
  if (!h.shape.empty()) {
    PackKey(pk, "shape");
    pk.pack_array(static_cast<uint32_t>(h.shape.size()));
    for (uint64_t d : h.shape) pk.pack_uint64(d);
  }
  if (h.base_version != 0) {
    PackKey(pk, "base");
    pk.pack_uint64(h.base_version);
  }
  if (h.flags != 0) {
    PackKey(pk, "flags");
    pk.pack_uint32(h.flags);
  }
  if (h.epoch != 0) {
    PackKey(pk, "ep");
    pk.pack_uint64(h.epoch);
  }
  if (reply) {
    PackKey(pk, "code");
    pk.pack_uint8(static_cast<uint8_t>(h.code));
    PackKey(pk, "ver");
    pk.pack_uint64(h.version);
    PackKey(pk, "tau");
    pk.pack_uint64(h.tau);
  }
  if (!h.message.empty()) {
    PackKey(pk, "msg");
    PackStr(pk, h.message);
  }
  if (h.queued) {
    PackKey(pk, "queued");
    pk.pack_true();
  }
  if (h.primary) {
    PackKey(pk, "pri");
    pk.pack_uint32(*h.primary);
  }
  if (!h.spec.empty()) {
    PackKey(pk, "spec");
    pk.pack_map(static_cast<uint32_t>(h.spec.size()));
    for (const auto& [k, v] : h.spec) {
      PackStr(pk, k);
      PackStr(pk, v);
    }
  }
  return std::string(buf.data(), buf.size());
}

StatusOr<Header> DecodeHeader(const void* data, size_t size) {
  Header h;
  // A header nests 2 levels (spec, shape); the rest leaves newer peers room. msgpack
  // allocates every open array's claimed elements at once: nested arrays each claiming
  // the bytes left after them held 24 bytes per frame byte per level (a 1 MiB frame:
  // +827 MiB), before the bad byte that ended them was read.
  // Within that depth, containers that each claim the bytes left after them still sum
  // to depth x size elements, which msgpack would allocate too: refused as well.
  switch (ScanMsgpack(static_cast<const uint8_t*>(data), size, kMaxHeaderDepth)) {
    case MsgpackScan::kTooDeep:
      return Malformed("header frame nests deeper than " + std::to_string(kMaxHeaderDepth) +
                       " levels");
    case MsgpackScan::kOverclaims:
      return Malformed("header frame's arrays and maps claim more elements than its " +
                       std::to_string(size) + " bytes can hold");
    case MsgpackScan::kOk:
      break;
  }
  try {
    // msgpack allocates a map's or array's elements as soon as it reads the count, so a
    // 5-byte frame could claim billions of them. Every element takes at least one byte:
    // no valid frame has a count above its size.
    const msgpack::unpack_limit limit(size, size, size, size, size);
    msgpack::object_handle oh =
        msgpack::unpack(static_cast<const char*>(data), size, nullptr, nullptr, limit);
    const msgpack::object& o = oh.get();
    if (o.type != msgpack::type::MAP) return Malformed("header frame is not a msgpack map");
    bool saw_v = false, saw_op = false;
    for (uint32_t i = 0; i < o.via.map.size; ++i) {
      const auto& kv = o.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) return Malformed("header map key is not a string");
      ONLINEPS_RETURN_IF_ERROR(DecodeField(kv.key, kv.val, &h, &saw_v, &saw_op));
    }
    if (!saw_v) return Malformed("header has no protocol version field 'v'");
    if (h.protocol != kProtocolVersion) {
      return UnsupportedVersion("protocol version " + std::to_string(h.protocol) +
                                " not supported (this peer speaks " +
                                std::to_string(kProtocolVersion) + ")");
    }
    if (!saw_op) return Malformed("header has no 'op' field");
  } catch (const std::exception& e) {
    return Malformed(std::string("header frame is not valid msgpack: ") + e.what());
  }
  return h;
}

Header MakeReply(const Header& req, const Status& st) {
  Header r;
  r.op = Op::kReply;
  r.request_id = req.request_id;
  r.table = req.table;
  r.code = st.code();
  r.message = st.message();
  return r;
}

Status ReplyStatus(const Header& reply) {
  if (reply.code == StatusCode::kOk) return Status::Ok();
  return Status(reply.code, reply.message);
}

std::optional<uint64_t> ParseSpecU64(const std::string& s) {
  if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return v;
}

StatusOr<std::vector<Frames>> SplitFrameGroups(const std::vector<uint64_t>& counts,
                                               const Frames& frames) {
  uint64_t total = 0;  // saturating: counts near 2^64 must not wrap to a match
  for (uint64_t k : counts) {
    if (k == 0) return Malformed("shape counts a group of 0 frames");
    total = k > UINT64_MAX - total ? UINT64_MAX : total + k;
  }
  if (frames.empty() || total != frames.size() - 1) {
    return Malformed("shape counts " + std::to_string(total) +
                     " frames after the header, the message has " +
                     std::to_string(frames.empty() ? 0 : frames.size() - 1));
  }
  std::vector<Frames> groups;
  groups.reserve(counts.size());
  auto at = frames.begin() + 1;
  for (uint64_t k : counts) {
    groups.emplace_back(at, at + static_cast<ptrdiff_t>(k));
    at += static_cast<ptrdiff_t>(k);
  }
  return groups;
}

}  // namespace onlineps
