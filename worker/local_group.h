// LocalGroup: the CPU GroupReducer, for machines without GPUs and for tests of the
// aggregation logic. On the common transport (common/transport.h) and wire header
// (common/wire.h): rank 0 (the leader) runs a server transport, the other members a
// client transport to it, CURVE included when configured. Each call sends the member's
// buffer to the leader, which reduces in rank order (so every member gets bitwise the
// same floats) and sends the result back. Calls carry (op, sequence number, n): members
// whose calls disagree get kFailedPrecondition instead of a wrong sum. Torch-free.
#ifndef ONLINEPS_WORKER_LOCAL_GROUP_H_
#define ONLINEPS_WORKER_LOCAL_GROUP_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/curve.h"
#include "common/status.h"
#include "worker/group_reducer.h"

namespace onlineps::worker {

struct LocalGroupOptions {
  int rank = 0;  // 0 <= rank < size; rank 0 is the leader
  int size = 1;  // members in the group; 1 makes every call a no-op
  // The leader binds it, the others connect: "ipc:///tmp/x", "tcp://127.0.0.1:PORT", or
  // "inproc://x" / "mem://x" (members in one process). Ignored when size == 1.
  std::string endpoint;
  // Per call: how long a member waits for the others (leader) or the reply (member).
  std::chrono::milliseconds timeout{60000};
  // Largest buffer one call may carry, in bytes; bigger messages are refused.
  uint64_t max_message_bytes = uint64_t{1} << 30;
  // CurveZMQ on tcp:// (common/curve.h). The leader needs its key pair (and, to admit
  // only some members, allowed_clients); members their key pair and server_public_key,
  // the leader's public key. Empty secret_key: CURVE off.
  CurveOptions curve{};
};

// Creates this process's member of the group. The leader binds at once (bind errors are
// returned here); members connect lazily, so members may start before the leader.
// Errors: kInvalidArgument (bad rank, size or endpoint), kAlreadyExists (address in use).
//
// Call errors: kDeadlineExceeded names the ranks that did not call in time (at the
// leader; members relay it, or report that the leader did not answer);
// kFailedPrecondition when members made different calls (op or n) or are out of step.
// A call that failed on one member may have succeeded on others (a member that timed out
// while the leader was still waiting; MayHaveCompleted() says when it may), and a member
// that skips a call stays out of step: after a failed call, recreate the group.
StatusOr<std::unique_ptr<GroupReducer>> NewLocalGroup(const LocalGroupOptions& options);
// NewLocalGroup's checks of `options` alone (rank, size, timeout, endpoint), without
// binding or connecting anything: kInvalidArgument naming the bad one.
Status CheckLocalGroupOptions(const LocalGroupOptions& options);

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_LOCAL_GROUP_H_
