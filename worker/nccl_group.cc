#include "worker/nccl_group.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "onlineps_worker_nccl needs NCCL >= 2.14 (nonblocking communicators)"
#endif

namespace onlineps::worker {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Id file: 8-byte magic, group size (u32 little-endian), the 128-byte ncclUniqueId.
constexpr char kIdMagic[8] = {'O', 'P', 'S', 'N', 'C', 'C', 'L', '1'};
constexpr size_t kIdFileBytes = sizeof(kIdMagic) + 4 + NCCL_UNIQUE_ID_BYTES;
constexpr milliseconds kIdPollInterval{20};

std::string Ms(milliseconds d) { return std::to_string(d.count()) + " ms"; }

std::string CudaError(const std::string& what, cudaError_t e) {
  return what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

std::string NcclError(const std::string& what, ncclResult_t r) {
  return what + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")";
}

Status CudaStatus(const std::string& what, cudaError_t e) {
  if (e == cudaSuccess) return Status::Ok();
  if (e == cudaErrorMemoryAllocation) {
    return ResourceExhausted(CudaError(what, e));
  }
  return Internal(CudaError(what, e));
}

// Polling a nonblocking communicator: short sleeps first (a collective usually
// finishes within microseconds of the last member), up to 1 ms.
class Backoff {
 public:
  void Wait() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds delay_{5};
};

Status WriteIdFile(const std::string& path, int size, const ncclUniqueId& id) {
  unsigned char buf[kIdFileBytes];
  std::memcpy(buf, kIdMagic, sizeof(kIdMagic));
  for (int i = 0; i < 4; ++i)
    buf[sizeof(kIdMagic) + i] = static_cast<unsigned char>(size >> (8 * i));
  std::memcpy(buf + sizeof(kIdMagic) + 4, id.internal, NCCL_UNIQUE_ID_BYTES);
  // Write + rename, so a member never reads half a file.
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return Unavailable("NCCL id file " + tmp + ": " + std::strerror(errno));
  bool ok = std::fwrite(buf, 1, sizeof(buf), f) == sizeof(buf);
  ok = std::fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    return Unavailable("NCCL id file " + path + ": " + reason);
  }
  return Status::Ok();
}

Status ParseIdFile(const std::string& path, const unsigned char* buf, size_t bytes, int size,
                   ncclUniqueId* id) {
  if (bytes != kIdFileBytes || std::memcmp(buf, kIdMagic, sizeof(kIdMagic)) != 0) {
    return DataLoss("NCCL id file " + path + " is not one (" + std::to_string(bytes) + " bytes)");
  }
  uint32_t file_size = 0;
  for (int i = 0; i < 4; ++i) file_size |= uint32_t{buf[sizeof(kIdMagic) + i]} << (8 * i);
  if (file_size != static_cast<uint32_t>(size)) {
    return FailedPrecondition("NCCL id file " + path + " is for a group of " +
                              std::to_string(file_size) + ", this member's group has " +
                              std::to_string(size));
  }
  std::memcpy(id->internal, buf + sizeof(kIdMagic) + 4, NCCL_UNIQUE_ID_BYTES);
  return Status::Ok();
}

Status ReadIdFile(const std::string& path, int size, milliseconds timeout, ncclUniqueId* id) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (true) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f != nullptr) {
      unsigned char buf[kIdFileBytes + 1];
      const size_t bytes = std::fread(buf, 1, sizeof(buf), f);
      std::fclose(f);
      return ParseIdFile(path, buf, bytes, size, id);
    }
    if (errno != ENOENT) return Unavailable("NCCL id file " + path + ": " + std::strerror(errno));
    const Clock::duration left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      return DeadlineExceeded("no NCCL id file " + path + " from rank 0 within " + Ms(timeout));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(left, kIdPollInterval));
  }
}

class NcclGroupImpl final : public GroupReducer {
 public:
  explicit NcclGroupImpl(const NcclGroupOptions& options)
      : rank_(options.rank),
        size_(options.size),
        device_(options.device),
        timeout_(options.timeout) {}
  ~NcclGroupImpl() override;

  // Creates the stream and the communicator; blocks until every member joined.
  Status Init(const ncclUniqueId& id);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status SumFloats(float* data, size_t n) override {
    return Run("SumFloats", data, n, sizeof(float), ncclFloat32, ncclSum);
  }
  Status MinU64(uint64_t* data, size_t n) override {
    return Run("MinU64", data, n, sizeof(uint64_t), ncclUint64, ncclMin);
  }

 private:
  Status Run(const char* name, void* data, size_t n, size_t elem, ncclDataType_t type,
             ncclRedOp_t op);
  Status AllReduce(void* data, size_t n, size_t elem, ncclDataType_t type, ncclRedOp_t op);
  Status Reserve(size_t bytes);
  Status WaitComm(const char* what, Clock::time_point deadline);
  Status WaitStream(Clock::time_point deadline);

  // Immutable after construction.
  const int rank_;
  const int size_;
  const int device_;
  const milliseconds timeout_;

  // Used only by the one thread that drives this member.
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* buffer_ = nullptr;  // device memory, grown on demand and kept
  size_t capacity_ = 0;
  Status broken_;  // why comm_ was aborted; OK while it is usable
};

NcclGroupImpl::~NcclGroupImpl() {
  (void)cudaSetDevice(device_);
  if (comm_ != nullptr) {
    // Finalize waits for the other members, so it is bounded like a call; abort if a
    // member is gone.
    const ncclResult_t r = ncclCommFinalize(comm_);
    const bool clean = (r == ncclSuccess || r == ncclInProgress) &&
                       WaitComm("ncclCommFinalize", Clock::now() + timeout_).ok();
    if (clean) {
      (void)ncclCommDestroy(comm_);
    } else {
      (void)ncclCommAbort(comm_);
    }
  }
  if (buffer_ != nullptr) (void)cudaFree(buffer_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Status NcclGroupImpl::Init(const ncclUniqueId& id) {
  ONLINEPS_RETURN_IF_ERROR(
      CudaStatus("cudaSetDevice(" + std::to_string(device_) + ")", cudaSetDevice(device_)));
  ONLINEPS_RETURN_IF_ERROR(CudaStatus("cudaStreamCreateWithFlags",
                                      cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
  // Nonblocking, so that a member that never joins costs a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    return Internal(NcclError("ncclCommInitRankConfig", r));
  }
  Status s = WaitComm("ncclCommInitRankConfig", Clock::now() + timeout_);
  if (!s.ok()) {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    if (s.code() == StatusCode::kDeadlineExceeded) {
      s = DeadlineExceeded("NCCL group of " + std::to_string(size_) +
                           ": not every member joined within " + Ms(timeout_));
    }
  }
  return s;
}

Status NcclGroupImpl::Run(const char* name, void* data, size_t n, size_t elem, ncclDataType_t type,
                          ncclRedOp_t op) {
  if (n > 0 && data == nullptr) return InvalidArgument(std::string(name) + ": null data");
  if (n > SIZE_MAX / elem) return InvalidArgument(std::string(name) + ": n too large");
  if (!broken_.ok()) {
    return FailedPrecondition(std::string(name) + ": the NCCL group was aborted after an " +
                              "earlier error (" + broken_.ToString() + "); create a new group");
  }
  // A group of one still goes through the device: the same path at every size.
  if (n == 0) return Status::Ok();
  Status s = AllReduce(data, n, elem, type, op);
  if (!s.ok()) {
    // After a failed or timed-out collective the communicator's state is unknown.
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    broken_ = s;
    return s.WithContext(name);
  }
  return s;
}

Status NcclGroupImpl::AllReduce(void* data, size_t n, size_t elem, ncclDataType_t type,
                                ncclRedOp_t op) {
  const Clock::time_point deadline = Clock::now() + timeout_;
  const size_t bytes = n * elem;
  // The driving thread need not be the one that created the group.
  ONLINEPS_RETURN_IF_ERROR(CudaStatus("cudaSetDevice", cudaSetDevice(device_)));
  ONLINEPS_RETURN_IF_ERROR(Reserve(bytes));
  ONLINEPS_RETURN_IF_ERROR(
      CudaStatus("cudaMemcpyAsync to device",
                 cudaMemcpyAsync(buffer_, data, bytes, cudaMemcpyHostToDevice, stream_)));
  const ncclResult_t r = ncclAllReduce(buffer_, buffer_, n, type, op, comm_, stream_);
  if (r != ncclSuccess && r != ncclInProgress) return Internal(NcclError("ncclAllReduce", r));
  ONLINEPS_RETURN_IF_ERROR(WaitComm("ncclAllReduce", deadline));
  // Wait before copying back: a copy into pageable memory would block without a bound.
  ONLINEPS_RETURN_IF_ERROR(WaitStream(deadline));
  return CudaStatus("cudaMemcpy to host", cudaMemcpy(data, buffer_, bytes, cudaMemcpyDeviceToHost));
}

Status NcclGroupImpl::Reserve(size_t bytes) {
  if (bytes <= capacity_) return Status::Ok();
  if (buffer_ != nullptr) {
    ONLINEPS_RETURN_IF_ERROR(CudaStatus("cudaFree", cudaFree(buffer_)));
    buffer_ = nullptr;
    capacity_ = 0;
  }
  ONLINEPS_RETURN_IF_ERROR(
      CudaStatus("cudaMalloc(" + std::to_string(bytes) + ")", cudaMalloc(&buffer_, bytes)));
  capacity_ = bytes;
  return Status::Ok();
}

// Until the communicator leaves ncclInProgress (a nonblocking call was issued).
Status NcclGroupImpl::WaitComm(const char* what, Clock::time_point deadline) {
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return Internal(NcclError("ncclCommGetAsyncError", r));
    if (state == ncclSuccess) return Status::Ok();
    if (state != ncclInProgress) return Internal(NcclError(what, state));
    if (Clock::now() >= deadline) {
      return DeadlineExceeded(std::string(what) + ": not done within " + Ms(timeout_));
    }
    backoff.Wait();
  }
}

// Until the stream is idle; NCCL errors (e.g. a member that died) end the wait early.
Status NcclGroupImpl::WaitStream(Clock::time_point deadline) {
  Backoff backoff;
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return CudaStatus("cudaStreamQuery", e);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return Internal(NcclError("ncclCommGetAsyncError", r));
    if (state != ncclSuccess && state != ncclInProgress) {
      return Internal(NcclError("ncclAllReduce", state));
    }
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("ncclAllReduce: not done within " + Ms(timeout_) +
                              " (a member did not make the call, or made a different one)");
    }
    backoff.Wait();
  }
}

Status ValidateOptions(const NcclGroupOptions& o) {
  if (o.size < 1)
    return InvalidArgument("NCCL group: size must be >= 1, got " + std::to_string(o.size));
  if (o.rank < 0 || o.rank >= o.size) {
    return InvalidArgument("NCCL group: rank " + std::to_string(o.rank) + " out of range [0, " +
                           std::to_string(o.size) + ")");
  }
  if (o.device < 0) return InvalidArgument("NCCL group: device " + std::to_string(o.device));
  if (o.timeout.count() <= 0) return InvalidArgument("NCCL group: timeout must be > 0");
  if (o.size > 1 && o.id_file.empty()) {
    return InvalidArgument("NCCL group: id_file is required when size > 1");
  }
  return Status::Ok();
}

// The unique id every member needs: made by rank 0, passed on through the id file.
Status Rendezvous(const NcclGroupOptions& o, ncclUniqueId* id) {
  if (o.rank != 0) return ReadIdFile(o.id_file, o.size, o.timeout, id);
  const ncclResult_t r = ncclGetUniqueId(id);
  if (r != ncclSuccess) return Internal(NcclError("ncclGetUniqueId", r));
  return o.size > 1 ? WriteIdFile(o.id_file, o.size, *id) : Status::Ok();
}

}  // namespace

StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so that later CUDA calls do not report it
    return Unavailable("no CUDA device: " + CudaError("cudaGetDeviceCount", e));
  }
  if (count <= 0) return Unavailable("no CUDA device: cudaGetDeviceCount found 0 devices");
  return count;
}

StatusOr<std::unique_ptr<GroupReducer>> NewNcclGroup(const NcclGroupOptions& options) {
  ONLINEPS_RETURN_IF_ERROR(ValidateOptions(options));
  ONLINEPS_ASSIGN_OR_RETURN(const int devices, CudaDeviceCount());
  if (options.device >= devices) {
    return InvalidArgument("NCCL group: device " + std::to_string(options.device) + ", but only " +
                           std::to_string(devices) + " CUDA device(s) are visible");
  }
  ncclUniqueId id;
  ONLINEPS_RETURN_IF_ERROR(Rendezvous(options, &id));
  auto group = std::make_unique<NcclGroupImpl>(options);
  const Status joined = group->Init(id);
  // Every member has read the id once the group formed (or the group is dead): removing it
  // now, not at destruction, keeps a later group from reading a stale id.
  if (options.rank == 0 && options.size > 1) std::remove(options.id_file.c_str());
  if (!joined.ok()) return joined;
  return std::unique_ptr<GroupReducer>(std::move(group));
}

}  // namespace onlineps::worker
