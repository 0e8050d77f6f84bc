// Shard checkpoints. A file holds every table of one shard (spec, version, parameters,
// optimizer and policy state) and the exactly-once dedup windows, followed by a
// checksum of everything before it (CRC-32; files of format 1 end in LegacyChecksum64
// and still load). Written to PATH.tmp, fsynced, then renamed over
// PATH, so a crash leaves either the old or the new file, never a torn one. Files are
// written and read in pieces, never held in memory whole.
// Format: docs/protocol.md#checkpoints. Functions are thread-safe (tables lock).
#ifndef ONLINEPS_PS_CHECKPOINT_H_
#define ONLINEPS_PS_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "ps/dedup.h"
#include "ps/table.h"

namespace onlineps::ps {

struct ShardIdentity {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
};

// Writes tables and dedup state atomically to `path`. Returns bytes written.
StatusOr<uint64_t> WriteCheckpoint(const std::string& path, const ShardIdentity& id,
                                   const std::map<std::string, std::shared_ptr<Table>>& tables,
                                   const Dedup& dedup);

// Reads `path` into fresh tables and `dedup`. Errors: kNotFound (no file), kDataLoss
// (bad magic, checksum mismatch, truncation), kFailedPrecondition (written by another
// shard index or shard count). On error nothing is returned and `dedup` is unchanged.
StatusOr<std::map<std::string, std::shared_ptr<Table>>> ReadCheckpoint(const std::string& path,
                                                                       const ShardIdentity& id,
                                                                       Dedup* dedup);

// The checkpoint format in memory (a replica's snapshot); `path` names it in errors.
std::string SerializeShard(const ShardIdentity& id,
                           const std::map<std::string, std::shared_ptr<Table>>& tables,
                           const Dedup& dedup);
StatusOr<std::map<std::string, std::shared_ptr<Table>>> ParseShard(std::string_view bytes,
                                                                   const std::string& path,
                                                                   const ShardIdentity& id,
                                                                   Dedup* dedup);
// ParseShard of bytes whose magic and checksum were checked; `release` (if set) is
// called every 64 MiB with the first byte not yet read.
StatusOr<std::map<std::string, std::shared_ptr<Table>>> ParseVerified(
    std::string_view bytes, const std::string& path, const ShardIdentity& id, Dedup* dedup,
    std::function<void(const char*)> release);

// A checkpoint written by a forked child process from its copy of the shard: the
// parent is paused only for fork() itself (page tables, not data), then serves updates
// while the child writes, and memory grows only by the pages updates touch meanwhile
// (copy on write). A child whose parent dies is killed before it can rename its file.
class ForkedCheckpoint {
 public:
  // Forks the writer of `tables` and `dedup` as they are now. REQUIRES: no update runs
  // during the call (the caller holds what keeps them out); reads may (their locks are
  // taken around the fork). Errors: kUnavailable if fork() fails (e.g. no memory).
  static StatusOr<std::unique_ptr<ForkedCheckpoint>> Start(
      const std::string& path, const ShardIdentity& id,
      const std::map<std::string, std::shared_ptr<Table>>& tables, const Dedup& dedup);
  // Waits for the child. The bytes written, or why the file was not written.
  StatusOr<uint64_t> Wait();
  ~ForkedCheckpoint();  // waits if Wait was not called

 private:
  ForkedCheckpoint(int pid, int result_fd) : pid_(pid), result_fd_(result_fd) {}
  int pid_;
  int result_fd_;
  bool waited_ = false;
};

// CRC-32 (zlib's, IEEE 802.3): the checksum of format 2, the one written; the file's last
// 8 bytes hold it zero-extended.
uint32_t Crc32(const void* data, size_t size);
// Four-lane FNV-1a, mixed: the checksum of format 1 (read, never written any more).
uint64_t LegacyChecksum64(const void* data, size_t size);

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_CHECKPOINT_H_
