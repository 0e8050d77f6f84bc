#include "ps/row_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>
#include <stdexcept>

#include "common/hash.h"

namespace onlineps::ps {

namespace {
// Buckets moved per Find, Insert and Erase while a rebuild is under way. A rebuild makes
// an array at least as large as the old one and at most half full, and the next one
// starts at 41/64 full at the earliest (the most staggered store): more than a seventh
// of its capacity in inserts and erases later, by which time 16 per call have moved the
// whole old array.
constexpr size_t kMigrateStep = 16;
constexpr uint32_t kMinBits = 4;
// A chunk of records is about this size: small enough that a small table stays small,
// large enough that the chunk list of a 10M-row table is short.
constexpr size_t kChunkBytes = 16 << 10;
// Fresh memory is faulted in by the kernel in one call (MAP_POPULATE) where it is large:
// on this project's VMs a page fault taken by a write costs ~17 us, populating ~0.7 us
// a page. Index arrays of a page or more (mapped, so that the pages of the array a rebuild
// replaces go back to the kernel at once: an allocator would keep them); row chunks, once
// a store holds kHeapBytes of them, from slabs of kSlabBytes (a store wastes at most one
// slab's tail).
constexpr size_t kMapBytes = 4096;
constexpr size_t kHeapBytes = 1 << 20;
constexpr size_t kSlabBytes = 128 << 10;

// Bits needed to write x (0 for 0): floor(log2(x)) + 1.
uint32_t BitWidth(uint64_t x) {
  return x == 0 ? 0 : 64 - static_cast<uint32_t>(__builtin_clzll(x));
}

uint32_t ChunkShift(size_t record_bytes) {
  const size_t rows = std::max<size_t>(1, kChunkBytes / record_bytes);
  return BitWidth(rows) - 1;  // floor(log2(rows))
}

}  // namespace

char* MapPopulated(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return static_cast<char*>(p);
}

void UnmapPopulated(char* p, size_t bytes) { ::munmap(p, bytes); }

RowStore::RowStore(size_t header_bytes, size_t floats, uint32_t stagger)
    : header_bytes_(header_bytes),
      // Rounded up to 8 bytes, so that every record's key and metadata are aligned.
      record_bytes_((header_bytes + floats * sizeof(float) + 7) & ~size_t{7}),
      chunk_shift_(ChunkShift(record_bytes_)),
      chunk_mask_((uint32_t{1} << chunk_shift_) - 1),
      rebuild_at_64ths_(48 - std::min<uint32_t>(stagger, 7)) {}

void RowStore::Place(Buckets* b, uint64_t entry) {
  const size_t mask = b->capacity() - 1;
  size_t i = HomeOf(static_cast<uint32_t>(entry >> 32), b->bits);
  while (b->e[i] > kDeleted) i = (i + 1) & mask;
  if (b->e[i] == kEmpty) ++b->used;
  b->e[i] = entry;
}

void RowStore::Migrate(size_t buckets) {
  if (!old_.e) return;
  // Home buckets come from the top bits of the tag, so entries leave the old array in
  // the order they land in the new one: the move is a streaming merge.
  const size_t end = std::min(old_.capacity(), migrate_pos_ + std::min(buckets, old_.capacity()));
  for (size_t i = migrate_pos_; i < end; ++i) {
    if (old_.e[i] > kDeleted) Place(&cur_, old_.e[i]);
  }
  migrate_pos_ = end;
  if (migrate_pos_ == old_.capacity()) old_ = Buckets{};
}

void RowStore::MaybeRebuild() {
  if ((cur_.used + 1) * 64 <= cur_.capacity() * rebuild_at_64ths_) return;
  Migrate(SIZE_MAX);  // never under way by now (see kMigrateStep); kept for safety
  // At most half full afterwards, and deleted entries are dropped. Never smaller than the
  // array it replaces, which is what bounds the move (see kMigrateStep).
  const uint32_t for_live = BitWidth(2 * (live_ + 1) - 1);
  const uint32_t bits = std::clamp<uint32_t>(std::max(for_live, cur_.bits), kMinBits, 31);
  Buckets fresh;
  const size_t bytes = sizeof(uint64_t) << bits;
  if (bytes >= kMapBytes) {
    // Populated now: random inserts would otherwise fault its pages in one by one.
    fresh.e = std::unique_ptr<uint64_t[], Buckets::Release>(
        reinterpret_cast<uint64_t*>(MapPopulated(bytes)), Buckets::Release{bytes});
  } else {
    fresh.e.reset(static_cast<uint64_t*>(std::calloc(size_t{1} << bits, sizeof(uint64_t))));
    if (!fresh.e) throw std::bad_alloc();
  }
  fresh.bits = bits;
  old_ = std::move(cur_);
  cur_ = std::move(fresh);
  migrate_pos_ = 0;
  Migrate(kMigrateStep);
}

void RowStore::Buckets::Release::operator()(uint64_t* p) const {
  if (mapped_bytes != 0) {
    UnmapPopulated(reinterpret_cast<char*>(p), mapped_bytes);
  } else {
    std::free(p);
  }
}

RowStore::~RowStore() {
  for (char* slab : slabs_) UnmapPopulated(slab, kSlabBytes);
}

char* RowStore::NewChunk() {
  const size_t bytes = record_bytes_ << chunk_shift_;
  if (heap_chunks_.size() * bytes < kHeapBytes || bytes > kSlabBytes) {
    heap_chunks_.emplace_back(new char[bytes]);
    return heap_chunks_.back().get();
  }
  if (slabs_.empty() || slab_used_ + bytes > kSlabBytes) {
    slabs_.push_back(MapPopulated(kSlabBytes));
    slab_used_ = 0;
  }
  char* chunk = slabs_.back() + slab_used_;
  slab_used_ += bytes;
  return chunk;
}

uint32_t RowStore::NewSlot() {
  if (!free_slots_.empty()) {
    const uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  if (next_slot_ == kNoSlot) throw std::length_error("RowStore: 2^32 - 1 rows in one stripe");
  if ((next_slot_ >> chunk_shift_) == chunks_.size()) {
    chunks_.push_back(NewChunk());
  }
  return next_slot_++;
}

uint32_t RowStore::FindMigrating(uint64_t key) {
  Migrate(kMigrateStep);
  // The old array first: it still holds every key the store had when the rebuild began
  // (a moved entry keeps its slot, and Erase marks both arrays), which is nearly every
  // key a call looks up; only keys inserted since are in the current array alone.
  const uint32_t tag = TagOf(key);
  size_t i = Probe(old_, key, tag);
  if (i != SIZE_MAX) return static_cast<uint32_t>(old_.e[i]);
  i = Probe(cur_, key, tag);
  return i == SIZE_MAX ? kNoSlot : static_cast<uint32_t>(cur_.e[i]);
}

uint32_t RowStore::Insert(uint64_t key) {
  Migrate(kMigrateStep);
  MaybeRebuild();
  const uint32_t slot = NewSlot();
  std::memcpy(Record(slot), &key, sizeof key);
  Place(&cur_, (uint64_t{TagOf(key)} << 32) | slot);
  ++live_;
  return slot;
}

void RowStore::Erase(uint32_t slot) {
  Migrate(kMigrateStep);
  const uint64_t key = KeyOf(slot);
  const uint32_t tag = TagOf(key);
  // A deleted mark, not a backward shift: the old array must keep every probe chain
  // intact while it is being moved, and the next rebuild drops the marks. Marked in both
  // arrays: an entry already moved is still in the old one, where a later Find would
  // otherwise find the freed slot (its record still holds the key until the slot is
  // reused): an evicted row read, and written, as if it were still in the table.
  for (Buckets* b : {&cur_, &old_}) {
    if (const size_t i = Probe(*b, key, tag); i != SIZE_MAX) b->e[i] = kDeleted;
  }
  --live_;
  free_slots_.push_back(slot);
}

void RowStore::Prefetch(uint64_t key) const {
  const Buckets& b = old_.e ? old_ : cur_;  // where Find looks first
  if (b.e) __builtin_prefetch(&b.e[HomeOf(TagOf(key), b.bits)]);
}

void RowStore::PrefetchRecord(uint64_t key) const {
  const uint32_t tag = TagOf(key);
  for (const Buckets* b : {&old_, &cur_}) {
    if (!b->e) continue;
    const size_t mask = b->capacity() - 1;
    for (size_t i = HomeOf(tag, b->bits);; i = (i + 1) & mask) {
      const uint64_t e = b->e[i];
      if (e == kEmpty) break;
      if (static_cast<uint32_t>(e >> 32) == tag) {
        // Every line of the record: a 64-float row spans five, and the apply reads and
        // writes them all.
        const char* r = Record(static_cast<uint32_t>(e));
        for (size_t off = 0; off < record_bytes_; off += 64) __builtin_prefetch(r + off, 1);
        return;
      }
    }
  }
}

size_t RowStore::memory_bytes() const {
  return heap_chunks_.size() * (record_bytes_ << chunk_shift_) + slabs_.size() * kSlabBytes +
         chunks_.capacity() * sizeof(chunks_[0]) +
         (cur_.capacity() + old_.capacity()) * sizeof(uint64_t) +
         free_slots_.capacity() * sizeof(uint32_t);
}

}  // namespace onlineps::ps
