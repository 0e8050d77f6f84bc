// RowStore: the rows of one sparse-table stripe. Each row is a fixed-size, 8-byte aligned
// record (its uint64 key, `header_bytes - 8` bytes of the caller's metadata, then
// `floats` floats) in fixed-size chunks, so growth never moves or copies a row and
// memory follows the row count; a large store takes its chunks from slabs whose pages
// the kernel maps in one call. An open-addressing index (linear probing, one 8-byte
// entry per bucket: a hash tag and the slot) finds a key's slot; it is rebuilt
// incrementally (each later call moves a few buckets), so no single call pays for a
// whole rehash. Not thread-safe: one stripe, one lock, held by the caller around every
// call.
#ifndef ONLINEPS_PS_ROW_STORE_H_
#define ONLINEPS_PS_ROW_STORE_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/hash.h"

namespace onlineps::ps {

// Zeroed memory of `bytes`, every page faulted in by the kernel in one call
// (MAP_POPULATE: on this project's VMs ~25x cheaper than faults taken by writes, ~17 us
// each). Throws std::bad_alloc when out of memory. Free with UnmapPopulated.
char* MapPopulated(size_t bytes);
void UnmapPopulated(char* p, size_t bytes);

class RowStore {
 public:
  static constexpr uint32_t kNoSlot = UINT32_MAX;

  // REQUIRES: header_bytes >= 8 and a multiple of 8. `stagger` (0-7) lowers the load
  // at which this store's index is rebuilt by stagger/64 from 3/4: stores of one table
  // given different values grow at different calls, not all in the same one.
  RowStore(size_t header_bytes, size_t floats, uint32_t stagger = 0);
  ~RowStore();
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  // The slot holding key, or kNoSlot. Inline: called per key on every push and pull.
  uint32_t Find(uint64_t key) {
    if (old_.e) return FindMigrating(key);
    const size_t i = Probe(cur_, key, TagOf(key));
    return i == SIZE_MAX ? kNoSlot : static_cast<uint32_t>(cur_.e[i]);
  }
  // REQUIRES: key is absent. The slot of a new record whose key is set; its other bytes
  // are unspecified (a reused slot keeps the old row's bytes).
  uint32_t Insert(uint64_t key);
  // REQUIRES: slot is live. The slot is reused by a later Insert.
  void Erase(uint32_t slot);

  char* Record(uint32_t slot) const {
    return chunks_[slot >> chunk_shift_] + (slot & chunk_mask_) * record_bytes_;
  }
  float* Floats(uint32_t slot) const {
    return reinterpret_cast<float*>(Record(slot) + header_bytes_);
  }
  uint64_t KeyOf(uint32_t slot) const {
    uint64_t key;
    std::memcpy(&key, Record(slot), sizeof key);
    return key;
  }
  // Hints the CPU to load key's first index bucket (a later Find is then cheaper).
  void Prefetch(uint64_t key) const;
  // Hints the CPU to load the record key probably has (the first entry whose hash tag
  // matches, found without reading any record). Best after Prefetch, once the bucket
  // has arrived.
  void PrefetchRecord(uint64_t key) const;

  size_t size() const { return live_; }
  size_t record_bytes() const { return record_bytes_; }
  // Slots ever handed out: every live slot is below this; a slot below it that was
  // erased and not reused is not live.
  uint32_t slot_end() const { return next_slot_; }
  // Bytes this store holds: record chunks, index arrays and the free-slot list.
  size_t memory_bytes() const;

 private:
  struct Buckets {
    struct Release {
      Release() : mapped_bytes(0) {}
      explicit Release(size_t bytes) : mapped_bytes(bytes) {}
      void operator()(uint64_t* p) const;
      size_t mapped_bytes;  // 0: from calloc
    };
    std::unique_ptr<uint64_t[], Release> e;  // 0: empty, 1: deleted, else (tag << 32) | slot
    uint32_t bits = 0;                       // capacity is 1 << bits
    size_t used = 0;                         // live + deleted entries
    size_t capacity() const { return e ? size_t{1} << bits : 0; }
  };

  static constexpr uint64_t kEmpty = 0;
  static constexpr uint64_t kDeleted = 1;

  static uint32_t TagOf(uint64_t key) {
    // Salted so that the index's bits are independent of the stripe and shard choice,
    // which use Mix64(key) itself. The top 31 bits of the mix pick the home bucket (its
    // high bits) and filter false matches (the rest); bit 31 marks the entry as used.
    const uint64_t g = Mix64(key ^ 0x5851f42d4c957f2dULL);
    return static_cast<uint32_t>(g >> 33) | 0x80000000u;
  }
  static size_t HomeOf(uint32_t tag, uint32_t bits) { return (tag & 0x7fffffffu) >> (31 - bits); }
  // The bucket of key in b, or SIZE_MAX.
  size_t Probe(const Buckets& b, uint64_t key, uint32_t tag) const {
    if (!b.e) return SIZE_MAX;
    const size_t mask = b.capacity() - 1;
    for (size_t i = HomeOf(tag, b.bits);; i = (i + 1) & mask) {
      const uint64_t e = b.e[i];
      if (e == kEmpty) return SIZE_MAX;
      if (static_cast<uint32_t>(e >> 32) == tag && KeyOf(static_cast<uint32_t>(e)) == key) return i;
    }
  }
  // Find while a rebuild is under way: moves a few buckets, then looks in both arrays.
  uint32_t FindMigrating(uint64_t key);
  // Places an entry in b at its first free bucket (empty or deleted).
  static void Place(Buckets* b, uint64_t entry);
  // Moves up to a few old buckets into the current array; frees the old array when done.
  void Migrate(size_t buckets);
  void MaybeRebuild();
  uint32_t NewSlot();
  char* NewChunk();

  // Immutable after construction.
  const size_t header_bytes_;
  const size_t record_bytes_;
  const uint32_t chunk_shift_;
  const uint32_t chunk_mask_;
  const uint32_t rebuild_at_64ths_;  // rebuild when used entries exceed this many 64ths

  std::vector<char*> chunks_;
  std::vector<std::unique_ptr<char[]>> heap_chunks_;  // the first chunks
  std::vector<char*> slabs_;  // later chunks are carved from these (kSlabBytes each)
  size_t slab_used_ = 0;      // bytes of the last slab handed out
  std::vector<uint32_t> free_slots_;
  uint32_t next_slot_ = 0;
  size_t live_ = 0;
  Buckets cur_;
  Buckets old_;  // non-empty while a rebuild moves its entries into cur_
  size_t migrate_pos_ = 0;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_ROW_STORE_H_
