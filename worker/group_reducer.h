// GroupReducer: a local group of worker processes that sum their dense gradients before
// one of them (the leader) pushes, so the PS sees one push per group per round instead
// of one per worker (hierarchical aggregation, as in BytePS). Collective: every member
// must make the same calls in the same order; each call blocks until all members made
// it. The NCCL implementation (worker/nccl_group.h) needs CUDA and NCCL at build time
// and a GPU at run time. Not thread-safe: one thread per member drives the collective.
#ifndef ONLINEPS_WORKER_GROUP_REDUCER_H_
#define ONLINEPS_WORKER_GROUP_REDUCER_H_

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace onlineps::worker {

class GroupReducer {
 public:
  virtual ~GroupReducer() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  bool leader() const { return rank() == 0; }
  // In place: data[i] = sum over members of their data[i].
  virtual Status SumFloats(float* data, size_t n) = 0;
  // In place: data[i] = min over members of their data[i].
  virtual Status MinU64(uint64_t* data, size_t n) = 0;
  // After a call failed: whether it may still have completed at the other members (this
  // member gave up before the group answered it: a timeout, a lost or garbled reply), so
  // that its outcome is unknown. false: it completed at no member.
  virtual bool MayHaveCompleted() const { return true; }
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_GROUP_REDUCER_H_
