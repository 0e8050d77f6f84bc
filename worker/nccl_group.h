// NcclGroup: the GPU GroupReducer. Each member process drives one CUDA device; calls
// copy the host buffer to the device, all-reduce it with NCCL and copy it back. Built
// only when CUDA and NCCL are found (ONLINEPS_HAVE_NCCL in "worker/gpu_config.h",
// target onlineps_worker_nccl); needs a GPU at run time. Torch-free.
#ifndef ONLINEPS_WORKER_NCCL_GROUP_H_
#define ONLINEPS_WORKER_NCCL_GROUP_H_

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/group_reducer.h"

namespace onlineps::worker {

struct NcclGroupOptions {
  int rank;        // 0 <= rank < size; rank 0 creates the NCCL id
  int size;        // members (processes) in the group, one device each
  int device = 0;  // CUDA device index of this member
  // Rendezvous file on a file system all members see: rank 0 writes the NCCL unique id
  // (atomically) and removes it once the group is formed; the others poll for it. Use a
  // fresh path per group: a stale file from an earlier run would be read as the id.
  // May be empty when size == 1.
  std::string id_file;
  // Bounds the rendezvous, the communicator setup and each call; on expiry the NCCL
  // communicator is aborted and later calls fail with kFailedPrecondition.
  std::chrono::milliseconds timeout{60000};
};

// Forms the group; blocks until every member has joined or the timeout expires.
// Errors: kInvalidArgument (bad rank, size, device or timeout), kUnavailable (no CUDA
// device or driver), kDeadlineExceeded (no id file, or members missing, in time),
// kDataLoss / kFailedPrecondition (corrupt id file, or one written for another size),
// kInternal (a CUDA or NCCL failure).
//
// NCCL cannot tell mismatched calls apart: members that pass different n or call
// different ops hang until the timeout (kDeadlineExceeded) or get garbage.
// Calls after any error other than kInvalidArgument fail with kFailedPrecondition: the
// communicator is aborted, recreate the group.
StatusOr<std::unique_ptr<GroupReducer>> NewNcclGroup(const NcclGroupOptions& options);

// Number of CUDA devices this process sees; kUnavailable with the CUDA runtime's reason
// when there is none (no driver, no device). Initializes the CUDA runtime: do not fork()
// afterwards.
StatusOr<int> CudaDeviceCount();

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_NCCL_GROUP_H_
