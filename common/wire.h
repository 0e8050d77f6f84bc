// Wire protocol v1: every message is a multipart ZeroMQ message
//   [header: msgpack map] [payload frame 0] [payload frame 1] ...
// Payload frames are raw little-endian arrays (uint64 keys, float32 values), never
// re-encoded. docs/protocol.md is the normative description of every field and op.
#ifndef ONLINEPS_COMMON_WIRE_H_
#define ONLINEPS_COMMON_WIRE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/frame.h"
#include "common/status.h"

namespace onlineps {

inline constexpr uint32_t kProtocolVersion = 1;

// Op codes (stable numbers; append only).
enum class Op : uint8_t {
  kPing = 0,         // liveness/readiness probe; reply carries shard info
  kCreateTable = 1,  // header.spec holds the TableSpec; idempotent for an equal spec
  kPullDense = 2,    // reply frames: [values]; reply.version
  kPushDense = 3,    // frames: [values]; reply.version, reply.tau
  kPullSparse = 4,   // frames: [keys]; reply frames: [values]
  kPushSparse = 5,   // frames: [keys, values]
  kCheckpoint = 6,   // write a checkpoint now; reply.msg holds the path
  kTableInfo = 7,    // reply.info holds per-table stats
  kReply = 8,        // every reply uses this op; code != 0 means error
  // Worker RPC (docs/protocol.md, "Worker RPC"): frame 1 is a msgpack body map.
  kInfer = 9,
  kLearn = 10,
  kContextSet = 11,
  kContextAppend = 12,
  kContextClear = 13,
  kContextGet = 14,
  kWorkerStats = 15,
  // Shard replication (docs/protocol.md, "Replication"), between replicas of one shard.
  kReplicate = 16,     // primary -> replica: seq = log index, base = epoch of the one before;
                       // frames: [entry header, payload...] (one frame: a heartbeat)
  kReplSnapshot = 17,  // primary -> replica: seq = log index of the state in frame 1
  kReplStatus = 18,    // any -> replica: reply spec holds role, inc, lsn, le (need)
  // Local group (docs/protocol.md, "Local group"), member -> leader: sid = rank, seq = call
  // number, shape = {n}, spec group_size; frame 1: n float32 / uint64 values.
  kGroupSumFloats = 19,
  kGroupMinU64 = 20,
  // Table-change notices (docs/protocol.md, "21 · watch"), worker -> shard: spec names
  // tables and the versions held; answered when one differs, or when the wait ends.
  kWatch = 21,
  // Worker RPC: the model's parameters (trainable tables and frozen ones), its frozen
  // base, and the bytes a learn pushes; body {"verify": true} rehashes the frozen part.
  kModelInfo = 22,
  // Several pushes in one message (docs/protocol.md, "23 · push_batch"): shape = frame
  // count of each sub-push; frames: each sub-push's [header, payload...] in turn. Each is
  // applied as the push it holds (own seq, version, staleness); the reply carries one
  // [header, values...] per sub-push, counted the same way in its shape.
  kPushBatch = 23,
};

inline constexpr Op kLastOp = Op::kPushBatch;
// True for the ops a worker serves (a PS shard answers them with UNKNOWN_OP).
inline bool IsWorkerOp(Op op) {
  return (op >= Op::kInfer && op <= Op::kWorkerStats) || op == Op::kModelInfo;
}

std::string_view OpName(Op op);

// Header flag bits.
inline constexpr uint32_t kFlagDelta = 1u << 0;  // push carries a parameter delta, not a gradient
inline constexpr uint32_t kFlagAveraged = 1u << 1;      // pull the Polyak-averaged copy
inline constexpr uint32_t kFlagNoBackup = 1u << 2;      // pull without recording a DC-ASGD backup
inline constexpr uint32_t kFlagGroupAck = 1u << 3;      // local group: member got the result of seq
inline constexpr uint32_t kFlagReturnValues = 1u << 4;  // push: reply carries the values after it
// push with DELTA: the delta sets a table's initial values (a model file's weights): not
// clipped by the table's clip_norm, which bounds gradients and training deltas.
inline constexpr uint32_t kFlagSeed = 1u << 5;

// A decoded header. Fields not meaningful for an op keep their defaults and are
// omitted on encode. Keys on the wire are the short names in the comments.
struct Header {
  uint32_t protocol = kProtocolVersion;  // "v"
  Op op = Op::kPing;                     // "op"
  uint32_t request_id = 0;               // "rid": echoed in the reply
  uint64_t sender = 0;                   // "sid": stable id of the client process
  uint64_t seq = 0;                      // "seq": per-sender push sequence (exactly-once)
  std::string table;                     // "tbl"
  std::vector<uint64_t> shape;           // "shape": element counts of payload frames
  uint64_t base_version = 0;             // "base": version the gradient was computed from
  uint32_t flags = 0;                    // "flags"
  uint64_t epoch = 0;                    // "ep": replication epoch known to the sender
  // Reply-only fields.
  StatusCode code = StatusCode::kOk;  // "code"
  std::string message;                // "msg"
  uint64_t version = 0;               // "ver": table version at this shard after the op
  uint64_t tau = 0;                   // "tau": staleness of the applied push
  bool queued = false;                // "queued": push accumulated, not yet applied
  // "pri": with NOT_PRIMARY, the index of the replica the answering one knows as its
  // group's primary (in --replicas order); absent when it knows none. Older peers
  // neither send nor read it.
  std::optional<uint32_t> primary;
  // Free-form maps: table spec on create, stats on info (string -> string).
  std::map<std::string, std::string> spec;  // "spec"
};

// Encodes `h` as a msgpack map. Never fails.
std::string EncodeHeader(const Header& h);

// Decodes a header frame. Errors: kMalformed (not a map, wrong types, missing "v" or
// "op"), kUnsupportedVersion, kUnknownOp. Never throws.
StatusOr<Header> DecodeHeader(const void* data, size_t size);

// Reply header for `req` with status `st` (request id and op echoed).
Header MakeReply(const Header& req, const Status& st);

// Status carried by a reply header.
Status ReplyStatus(const Header& reply);

// push_batch's layout: the frames after the header (frames[0]) split into consecutive
// groups of counts[i] frames. kMalformed when a count is 0 or the counts do not add up to
// frames.size() - 1. The frames are shared, not copied.
StatusOr<std::vector<Frames>> SplitFrameGroups(const std::vector<uint64_t>& counts,
                                               const Frames& frames);

// A `spec` value holding an unsigned decimal (digits only, at most 2^64 - 1); nullopt
// for anything else.
std::optional<uint64_t> ParseSpecU64(const std::string& s);

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_WIRE_H_
