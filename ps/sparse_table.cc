#include "ps/sparse_table.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "common/clock.h"
#include "common/partition.h"
#include "ps/apply_helper.h"
#include "ps/optimizers.h"

namespace onlineps::ps {

namespace {
constexpr uint32_t kNil = UINT32_MAX;
constexpr size_t kMaxStripes = 16;
constexpr size_t kBackupRowsPerWorker = 4096;
constexpr size_t kMaxAdmissionCandidates = 1 << 20;
// The bytes of one admission candidate (LruMap<uint64_t, uint32_t>): a list node (48 as
// glibc allocates it), a hash node (32) and its share of the buckets (8-16), measured.
constexpr uint64_t kCandidateBytes = 96;
// Least bound on an accumulated sum's pending values (SparseTable::PendingBytesCap), so
// that a small row cap still lets a sum of K pushes build up.
constexpr uint64_t kMinPendingCapBytes = uint64_t{16} << 20;
// Keys from which a call's stripes are applied on two threads (ApplyHelper): below it the
// hand-off (a wake-up, tens of microseconds here) costs more than half the apply saves.
constexpr size_t kParallelKeys = 2048;
// A stripe whose records take less than this is in the core's caches after a few calls:
// the prefetch passes over its keys (each a probe of the index) would only cost time.
constexpr size_t kPrefetchBytes = 256 << 10;
// Stripes from which a checkpoint maps its copy-on-write maps before the cut
// (SparseTable::PrepareSnapshot): a smaller stripe's map is under 64 KiB.
constexpr size_t kPrepareSlots = 16384;

// Where a push repeats keys: earlier[i] when keys[i] occurs before i too, later[i] when it
// occurs after i. Both empty when no key repeats (or n < 2): one hash pass over the keys.
struct Repeats {
  std::vector<bool> earlier, later;
};
Repeats RepeatsOf(const uint64_t* keys, size_t n) {
  Repeats r;
  if (n < 2) return r;
  std::unordered_map<uint64_t, uint32_t> last;  // key -> its latest index so far
  last.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto [it, first] = last.try_emplace(keys[i], static_cast<uint32_t>(i));
    if (first) continue;
    if (r.earlier.empty()) {
      r.earlier.assign(n, false);
      r.later.assign(n, false);
    }
    r.earlier[i] = true;
    r.later[it->second] = true;
    it->second = static_cast<uint32_t>(i);
  }
  return r;
}
}  // namespace

// The LRU list of a capped or TTL table, in each record after the key.
struct LruLinks {
  uint64_t last_ms = 0;
  uint32_t prev = kNil, next = kNil;  // head = most recent
};

struct SparseTable::Stripe {
  Stripe(const Layout& layout, size_t floats, size_t index, size_t backup_rows, size_t candidates)
      : layout(layout),
        rows(layout.header_bytes, floats, static_cast<uint32_t>(index % 8)),
        backups(backup_rows),
        admission(candidates) {}
  ~Stripe() {
    EndSnapshot();
    DropReady();
  }

  const Layout layout;
  Mutex mu;
  RowStore rows;
  uint32_t head = kNil, tail = kNil;
  uint64_t evicted = 0;
  LruMap<BackupKey, std::vector<float>, BackupHash> backups;
  LruMap<uint64_t, uint32_t> admission;  // touches of rows not yet admitted
  std::vector<float> scratch;
  // Incremental checkpoints: a bit per slot for the rows changed (pushed to or created)
  // since the last snapshot's cut, and the keys of rows dropped since (evicted or
  // expired; a dropped row's bit is cleared, so every bit set is a live row). Past
  // max(4096, rows / 4) dropped keys the list is given up (`dropped_overflow`): the next
  // checkpoint must be full.
  std::vector<uint64_t> changed;
  std::vector<uint64_t> dropped;
  bool dropped_overflow = false;

  static uint64_t Ones(const std::vector<uint64_t>& bits) {
    uint64_t n = 0;
    for (uint64_t w : bits) n += static_cast<uint64_t>(__builtin_popcountll(w));
    return n;
  }
  static bool Bit(const std::vector<uint64_t>& bits, uint32_t slot) {
    const size_t w = slot >> 6;
    return w < bits.size() && (bits[w] >> (slot & 63) & 1) != 0;
  }
  void MarkChanged(uint32_t slot) {
    const size_t w = slot >> 6;
    if (w >= changed.size()) changed.resize(std::max(w + 1, changed.size() * 2));
    changed[w] |= uint64_t{1} << (slot & 63);
  }
  void NoteDropped(uint32_t slot) {
    if (Bit(changed, slot)) changed[slot >> 6] &= ~(uint64_t{1} << (slot & 63));
    if (dropped_overflow) return;
    if (dropped.size() >= std::max<size_t>(4096, rows.size() / 4)) {
      dropped_overflow = true;
      dropped = {};
      return;
    }
    dropped.push_back(rows.KeyOf(slot));
  }
  // Starts a new change set; the last one's bits and dropped keys go to the caller.
  void TakeChanges(std::vector<uint64_t>* bits, std::vector<uint64_t>* keys) {
    *bits = std::move(changed);
    *keys = std::move(dropped);
    changed.assign((size_t{rows.slot_end()} + 63) / 64, 0);
    dropped.clear();
    dropped_overflow = false;
  }

  // While a snapshot (SparseSnapshot) writes this stripe, it keeps copies of the
  // records of rows it has still to write as they were at the cut, for the rows an
  // update changed since. Rows still to write: without an LRU list, slots
  // [snap_cursor, snap_end); with one, the rows not marked in snap_written, written in
  // the cut's LRU order from snap_next (the links of the cut are in the copies, or in
  // the records not changed since). Copies go to blocks of records (a copy is one
  // memcpy, no allocation per row); snap_copy_at maps a slot to 1 + its copy's index. Both
  // are populated mappings: the first push after a cut copies rows in every stripe, and
  // page faults taken one by one there cost it 60-150 ms at 4-10M rows. A delta snapshot
  // (snap_delta) writes, in slot order from snap_cursor, only the rows of snap_changed,
  // after the keys of snap_dropped.
  bool snap_active = false;
  bool snap_delta = false;
  std::vector<uint64_t> snap_changed, snap_dropped;
  uint32_t snap_cursor = 0, snap_end = 0;
  uint32_t snap_next = kNil;
  std::vector<bool> snap_written;
  uint32_t* snap_copy_at = nullptr;  // snap_end entries or more, mapped at the first copy
  size_t snap_copy_at_bytes = 0;
  std::vector<char*> snap_copy_blocks;   // kCopyBlockBytes each
  std::vector<char*> snap_spare_blocks;  // mapped ahead, not used yet
  uint32_t snap_copies = 0;
  // Mapped by SparseTable::PrepareSnapshot before the cut (outside the apply gate and
  // this lock), taken by the cut: the first pushes after it then copy rows without
  // mapping and populating a slot map first (~10 ms per checkpoint at 10M rows).
  uint32_t* ready_copy_at = nullptr;
  size_t ready_copy_at_bytes = 0;
  std::vector<char*> ready_blocks;

  static constexpr size_t kCopyBlockBytes = 256 << 10;
  size_t CopyAtBytes() const { return std::max<size_t>(snap_end, 1) * sizeof(uint32_t); }
  // At the cut: the maps made ready for it, if large enough.
  void TakeReady() {
    if (ready_copy_at != nullptr && ready_copy_at_bytes >= CopyAtBytes()) {
      snap_copy_at = ready_copy_at;
      snap_copy_at_bytes = ready_copy_at_bytes;
      ready_copy_at = nullptr;
    }
    snap_spare_blocks = std::move(ready_blocks);
    ready_blocks.clear();
    DropReady();  // a map too small for the rows created since it was made
  }
  void DropReady() {
    if (ready_copy_at != nullptr)
      UnmapPopulated(reinterpret_cast<char*>(ready_copy_at), ready_copy_at_bytes);
    ready_copy_at = nullptr;
    for (char* b : ready_blocks) UnmapPopulated(b, kCopyBlockBytes);
    ready_blocks.clear();
  }
  size_t CopiesPerBlock() const {
    return std::max<size_t>(1, kCopyBlockBytes / rows.record_bytes());
  }
  // The record of slot as it was at the cut, if an update changed it since; else null.
  const char* CopyOf(uint32_t slot) const {
    if (snap_copy_at == nullptr || snap_copy_at[slot] == 0) return nullptr;
    const size_t i = snap_copy_at[slot] - 1, per = CopiesPerBlock();
    return snap_copy_blocks[i / per] + (i % per) * rows.record_bytes();
  }
  void EndSnapshot() {
    snap_active = false;
    snap_delta = false;
    snap_written = {};
    snap_changed = {};
    snap_dropped = {};
    if (snap_copy_at != nullptr)
      UnmapPopulated(reinterpret_cast<char*>(snap_copy_at), snap_copy_at_bytes);
    snap_copy_at = nullptr;
    for (char* b : snap_copy_blocks) UnmapPopulated(b, kCopyBlockBytes);
    snap_copy_blocks.clear();
    for (char* b : snap_spare_blocks) UnmapPopulated(b, kCopyBlockBytes);
    snap_spare_blocks.clear();
    snap_copies = 0;
  }

  // Called before an update changes the record at slot (its row or its LRU links).
  void Preserve(uint32_t slot) {
    if (!snap_active || slot >= snap_end) return;
    if (snap_delta) {
      if (slot < snap_cursor || !Bit(snap_changed, slot)) return;
    } else if (layout.lru ? static_cast<bool>(snap_written[slot]) : slot < snap_cursor) {
      return;
    }
    if (snap_copy_at == nullptr) {
      snap_copy_at_bytes = CopyAtBytes();
      snap_copy_at = reinterpret_cast<uint32_t*>(MapPopulated(snap_copy_at_bytes));
    }
    uint32_t& at = snap_copy_at[slot];
    if (at != 0) return;
    const size_t i = snap_copies++, per = CopiesPerBlock();
    if (i / per == snap_copy_blocks.size()) {
      if (snap_spare_blocks.empty()) {
        snap_copy_blocks.push_back(MapPopulated(kCopyBlockBytes));
      } else {
        snap_copy_blocks.push_back(snap_spare_blocks.back());
        snap_spare_blocks.pop_back();
      }
    }
    std::memcpy(snap_copy_blocks[i / per] + (i % per) * rows.record_bytes(), rows.Record(slot),
                rows.record_bytes());
    at = static_cast<uint32_t>(i + 1);
  }
  LruLinks& MutableLinks(uint32_t i) {
    Preserve(i);
    return Links(i);
  }

  LruLinks& Links(uint32_t i) const {
    return *std::launder(reinterpret_cast<LruLinks*>(rows.Record(i) + sizeof(uint64_t)));
  }
  uint32_t& AvgCount(uint32_t i) const {
    return *std::launder(reinterpret_cast<uint32_t*>(rows.Record(i) + layout.avg_count_offset));
  }
  void Unlink(uint32_t i) {
    LruLinks& m = MutableLinks(i);
    (m.prev == kNil ? head : MutableLinks(m.prev).next) = m.next;
    (m.next == kNil ? tail : MutableLinks(m.next).prev) = m.prev;
    m.prev = m.next = kNil;
  }
  void PushFront(uint32_t i) {
    MutableLinks(i).next = head;
    Links(i).prev = kNil;
    if (head != kNil) MutableLinks(head).prev = i;
    head = i;
    if (tail == kNil) tail = i;
  }
  void Touch(uint32_t i, uint64_t now_ms) {
    if (!layout.lru) return;
    MutableLinks(i).last_ms = now_ms;
    if (head == i) return;
    Unlink(i);
    PushFront(i);
  }
  // A new record's metadata: constructed in place, at the head of the LRU list.
  void InitMeta(uint32_t i, uint64_t now_ms, uint32_t avg_count) {
    Preserve(i);  // a reused slot: its old row was copied when it was evicted
    if (layout.lru) {
      new (rows.Record(i) + sizeof(uint64_t)) LruLinks{now_ms, kNil, kNil};
      PushFront(i);
    }
    if (layout.avg_count_offset != 0)
      new (rows.Record(i) + layout.avg_count_offset) uint32_t{avg_count};
  }
  void Evict(uint32_t i) {
    NoteDropped(i);
    Unlink(i);
    rows.Erase(i);
    ++evicted;
  }
};

SparseTable::Layout SparseTable::LayoutOf(const TableSpec& spec) {
  // Only tables that can drop rows (a row cap or a TTL) pay for the LRU list.
  Layout l;
  l.lru = spec.max_rows != 0 || spec.ttl_ms != 0;
  l.header_bytes = sizeof(uint64_t) + (l.lru ? sizeof(LruLinks) : 0);
  if (spec.polyak) {
    l.avg_count_offset = l.header_bytes;
    l.header_bytes += sizeof(uint64_t);
  }
  return l;
}

size_t SparseTable::BackupHash::operator()(const BackupKey& k) const {
  return Mix64(k.key ^ Mix64(k.sender));
}

SparseTable::SparseTable(const TableSpec& spec, RuleSet rules)
    : spec_(spec),
      rules_(std::move(rules)),
      dim_(spec.dim),
      row_floats_(dim_ *
                  (1 + rules_.optimizer_slots() + rules_.policy_slots() + (spec.polyak ? 1 : 0))),
      // A row cap is enforced per stripe, so small caps use fewer stripes to stay exact.
      num_stripes_(spec.max_rows == 0 ? kMaxStripes
                                      : std::clamp<size_t>(spec.max_rows / 1024, 1, kMaxStripes)),
      rows_per_stripe_(spec.max_rows / num_stripes_ + (spec.max_rows % num_stripes_ != 0)),
      layout_(LayoutOf(spec)) {
  const size_t backups =
      std::max<size_t>(1024, spec.dc_max_backups * kBackupRowsPerWorker / num_stripes_);
  for (size_t i = 0; i < num_stripes_; ++i) {
    stripes_.push_back(std::make_unique<Stripe>(layout_, row_floats_, i, backups,
                                                kMaxAdmissionCandidates / num_stripes_));
  }
  if (HoldsReplies(spec_)) {
    ssp_.emplace(static_cast<uint64_t>(spec_.max_staleness), spec_.block_timeout_ms);
  }
}

SparseTable::~SparseTable() = default;

bool SparseTable::TryLockStripes(const bool* touched) const NO_THREAD_SAFETY_ANALYSIS {
  for (size_t si = 0; si < num_stripes_; ++si) {
    if (!touched[si] || stripes_[si]->mu.TryLock()) continue;
    for (size_t back = 0; back < si; ++back) {
      if (touched[back]) stripes_[back]->mu.Unlock();
    }
    return false;
  }
  return true;
}

void SparseTable::UnlockStripes(const bool* touched) const NO_THREAD_SAFETY_ANALYSIS {
  for (size_t si = 0; si < num_stripes_; ++si) {
    if (touched[si]) stripes_[si]->mu.Unlock();
  }
}

template <typename Fn, typename Then>
bool SparseTable::ForEachKeyByStripe(const uint64_t* keys, size_t n, Fn fn, bool no_wait, Then then,
                                     bool parallel) const {
  constexpr bool kThen = !std::is_same_v<Then, NoThen>;
  if (no_wait && n == 1) {
    Stripe& s = StripeOf(keys[0]);
    if (!s.mu.TryLock()) return false;
    fn(s, 0);
    if constexpr (kThen) then(s, 0);
    s.mu.Unlock();
    return true;
  }
  if (n == 1 || (num_stripes_ == 1 && !no_wait)) {
    for (size_t i = 0; i < n; ++i) {
      Stripe& s = StripeOf(keys[i]);
      MutexLock lock(&s.mu);
      fn(s, static_cast<uint32_t>(i));
      if constexpr (kThen) {
        if (n == 1) then(s, 0);
      }
    }
    if constexpr (kThen) {
      for (size_t i = 0; n > 1 && i < n; ++i) {
        Stripe& s = StripeOf(keys[i]);
        MutexLock lock(&s.mu);
        then(s, static_cast<uint32_t>(i));
      }
    }
    return true;
  }
  // Keys grouped by stripe with a counting sort into per-thread buffers (no allocation
  // once warm), each stripe locked once, in key order within a stripe.
  thread_local std::vector<uint8_t> stripe_of;
  thread_local std::vector<uint32_t> order;
  stripe_of.resize(n);
  order.resize(n);
  size_t start[kMaxStripes + 1] = {};
  for (size_t i = 0; i < n; ++i) {
    stripe_of[i] = static_cast<uint8_t>(StripeIndex(keys[i]));
    ++start[stripe_of[i] + 1];
  }
  bool touched[kMaxStripes] = {};
  for (size_t si = 0; si < num_stripes_; ++si) touched[si] = start[si + 1] != 0;
  for (size_t si = 0; si < num_stripes_; ++si) start[si + 1] += start[si];
  size_t fill[kMaxStripes];
  std::copy(start, start + num_stripes_, fill);
  for (size_t i = 0; i < n; ++i) order[fill[stripe_of[i]]++] = static_cast<uint32_t>(i);
  // no_wait: all or nothing, so that a refused call has changed nothing.
  if (no_wait && !TryLockStripes(touched)) return false;
  const uint32_t* ord = order.data();  // thread_local: the helper must not name it
  auto run_stripe = [&, ord](size_t si) {
    Stripe& s = *stripes_[si];
    std::optional<MutexLock> lock;
    if (!no_wait) lock.emplace(&s.mu);
    // Three passes over the stripe's keys (a few hundred in a large push): the loads of
    // every index bucket, then of every record, are issued before any is waited for,
    // so their cache misses overlap instead of following one another.
    if (s.rows.slot_end() * s.rows.record_bytes() >= kPrefetchBytes) {
      for (size_t j = start[si]; j < start[si + 1]; ++j) s.rows.Prefetch(keys[ord[j]]);
      for (size_t j = start[si]; j < start[si + 1]; ++j) s.rows.PrefetchRecord(keys[ord[j]]);
    }
    for (size_t j = start[si]; j < start[si + 1]; ++j) fn(s, ord[j]);
    if constexpr (kThen) {
      for (size_t j = start[si]; j < start[si + 1]; ++j) then(s, ord[j]);
    }
  };
  ApplyHelper* helper = nullptr;
  if (parallel && !no_wait && n >= kParallelKeys) helper = ApplyHelper::Get();
  if (helper == nullptr) {
    for (size_t si = 0; si < num_stripes_; ++si) {
      if (start[si] != start[si + 1]) run_stripe(si);
    }
  } else {
    // (What a stripe throws, std::bad_alloc, is answered by the shard as
    // RESOURCE_EXHAUSTED.)
    helper->Share(num_stripes_, [&](size_t si) {
      if (start[si] != start[si + 1]) run_stripe(si);
    });
  }
  if (no_wait) UnlockStripes(touched);
  return true;
}

StatusOr<PullResult> SparseTable::Pull(const PullRequest& req) {
  if (req.averaged && !spec_.polyak) {
    return InvalidArgument("table '" + spec_.name +
                           "' keeps no Polyak average; create it with polyak=true");
  }
  if (ssp_) ssp_->Touch(req.sender, req.now_ms);
  PullResult out;
  out.version = version_.load();
  out.values.resize(req.num_keys * dim_);
  const bool backup = rules_.needs_backup() && req.record_backup && !req.averaged;
  const size_t avg_off = dim_ * (1 + rules_.optimizer_slots() + rules_.policy_slots());
  const bool done = ForEachKeyByStripe(
      req.keys, req.num_keys,
      [&](Stripe& s, uint32_t i) {
        float* dst = out.values.data() + size_t{i} * dim_;
        const uint32_t slot = s.rows.Find(req.keys[i]);
        if (slot == RowStore::kNoSlot) {
          // Unknown rows read as their initializer; nothing is stored for a read.
          InitValues(spec_, req.keys[i], dst, dim_, /*sparse_row=*/true);
        } else {
          const float* row = s.rows.Floats(slot);
          std::memcpy(dst, req.averaged ? row + avg_off : row, dim_ * sizeof(float));
          s.Touch(slot, req.now_ms);
        }
        if (backup) s.backups.Put({req.sender, req.keys[i]}, std::vector<float>(dst, dst + dim_));
      },
      req.no_wait, NoThen{}, /*parallel=*/true);
  if (!done) {
    out.values.clear();
    out.would_block = true;
  }
  return out;
}

void SparseTable::CountTouch(Stripe& s, uint64_t key) {
  if (s.rows.Find(key) != RowStore::kNoSlot) return;
  const uint32_t* count = s.admission.Find(key);
  const uint32_t touches = count ? *count : 0;
  if (touches < spec_.admit_after) s.admission.Put(key, touches + 1);
}

int64_t SparseTable::FindOrCreate(Stripe& s, uint64_t key, uint64_t now_ms,
                                  std::vector<uint64_t>* evicted, Touch touch) {
  if (const uint32_t slot = s.rows.Find(key); slot != RowStore::kNoSlot) {
    s.Touch(slot, now_ms);
    return slot;
  }
  if (spec_.admit_after > 1) {
    // The push's first occurrence of the key was not admitted: neither is this one.
    if (touch == Touch::kNone) return -1;
    uint32_t* count = s.admission.Find(key);
    const uint32_t touches = (count ? *count : 0) + (touch == Touch::kCount ? 1 : 0);
    if (touches < spec_.admit_after) {
      if (touch == Touch::kCount) s.admission.Put(key, touches);
      return -1;
    }
    s.admission.Erase(key);
  }
  if (rows_per_stripe_ != 0 && s.rows.size() >= rows_per_stripe_) {
    evicted->push_back(s.rows.KeyOf(s.tail));
    s.Evict(s.tail);
  }
  const uint32_t slot = s.rows.Insert(key);
  s.MarkChanged(slot);
  float* row = s.rows.Floats(slot);
  InitValues(spec_, key, row, dim_, /*sparse_row=*/true);
  for (int k = 0; k < rules_.optimizer_slots(); ++k) {
    std::fill(row + dim_ * (1 + k), row + dim_ * (2 + k), rules_.InitialState(k));
  }
  const size_t pol_off = dim_ * (1 + rules_.optimizer_slots());
  std::fill(row + pol_off, row + row_floats_, 0.0f);
  if (spec_.polyak) std::memcpy(row + row_floats_ - dim_, row, dim_ * sizeof(float));
  s.InitMeta(slot, now_ms, 0);
  return slot;
}

void SparseTable::ApplyRow(Stripe& s, uint32_t slot, uint64_t sender, const float* g, bool delta,
                           float lr_scale, uint64_t step, bool compensate, bool step_average) {
  s.Preserve(slot);
  s.MarkChanged(slot);
  float* row = s.rows.Floats(slot);
  if (delta) {
    const float scale = internal::SaturateToFloat(spec_.delta_scale);
    for (uint32_t j = 0; j < dim_; ++j) row[j] = internal::Saturate(row[j] + scale * g[j]);
  } else {
    float* opt[4];
    float* pol[4];
    for (int k = 0; k < rules_.optimizer_slots(); ++k) opt[k] = row + dim_ * (1 + k);
    const size_t pol_off = dim_ * (1 + rules_.optimizer_slots());
    for (int k = 0; k < rules_.policy_slots(); ++k) pol[k] = row + pol_off + dim_ * k;
    const float* w_bak = nullptr;
    if (rules_.needs_backup() && compensate) {
      auto* b = s.backups.Find({sender, s.rows.KeyOf(slot)});
      if (b != nullptr)
        w_bak = b->data();
      else
        backup_misses_.fetch_add(1);
    }
    rules_.Apply(row, opt, pol, g, w_bak, dim_, lr_scale, step, &s.scratch);
  }
  if (spec_.polyak && step > spec_.polyak_start) {
    if (step_average) {
      PolyakStep(row + row_floats_ - dim_, row, dim_, ++s.AvgCount(slot) + spec_.polyak_start,
                 spec_.polyak_start);
    }
  } else if (spec_.polyak) {
    std::memcpy(row + row_floats_ - dim_, row, dim_ * sizeof(float));
  }
}

StatusOr<PushResult> SparseTable::Push(const PushRequest& req) {
  if (req.num_values != req.num_keys * dim_) {
    return ShapeMismatch("table '" + spec_.name + "': " + std::to_string(req.num_keys) +
                         " keys need " + std::to_string(req.num_keys * dim_) + " values (dim " +
                         std::to_string(dim_) + "), the push carries " +
                         std::to_string(req.num_values));
  }
  if (!AllFinite(req.values, req.num_values)) {
    return NonFinite("table '" + spec_.name + "': push contains NaN or Inf; nothing applied");
  }
  std::vector<float> clipped_values;
  bool clipped = false;
  PushRequest clipped_req = req;
  clipped_req.values = ClipToNorm(req.values, req.num_values, req.seed ? 0.0 : spec_.clip_norm,
                                  &clipped_values, &clipped);
  StatusOr<PushResult> res = PushChecked(clipped_req);
  if (clipped && !(res.ok() && res->would_block)) clipped_pushes_.fetch_add(1);
  return res;
}

StatusOr<PushResult> SparseTable::PushChecked(const PushRequest& req) {
  const uint64_t v = version_.load();
  const uint64_t tau = v >= req.base_version ? v - req.base_version : 0;
  ONLINEPS_RETURN_IF_ERROR(rules_.CheckBound(spec_.name, tau));
  PushResult res;
  if (spec_.accumulate > 1 && !req.delta) {
    if (!req.no_wait) return Accumulate(req, tau);
    res.would_block = true;  // the sum's lock and DC rewrites: left to a handler thread
    return res;
  }
  const float lr_scale = rules_.policy().LrScale(tau);
  const uint64_t step = v + 1;
  // A row's Polyak average takes one step per push, after the push's last occurrence of
  // its key (a stripe's keys are applied in push order): the weights between two
  // occurrences are never seen by a pull, so they are not averaged in. Admission counts
  // one touch per push for a key the push repeats (docs/protocol.md).
  const Repeats repeats =
      spec_.polyak || spec_.admit_after > 1 ? RepeatsOf(req.keys, req.num_keys) : Repeats{};
  auto apply = [&](Stripe& s, uint32_t i) {
    int64_t slot =
        FindOrCreate(s, req.keys[i], req.now_ms, &res.evicted,
                     repeats.earlier.empty() || !repeats.earlier[i] ? Touch::kCount : Touch::kNone);
    if (slot < 0) return;  // not admitted yet: the touch is counted, the gradient dropped
    ApplyRow(s, static_cast<uint32_t>(slot), req.sender, req.values + size_t{i} * dim_, req.delta,
             lr_scale, step, /*compensate=*/true,
             /*step_average=*/repeats.later.empty() || !repeats.later[i]);
  };
  // RETURN_VALUES: read after every key of the stripe, so a key pushed twice reads as
  // both left it. Without it no second pass at all.
  auto read_after = [&](Stripe& s, uint32_t i) {
    float* after = req.values_after + size_t{i} * dim_;
    const uint32_t slot = s.rows.Find(req.keys[i]);
    if (slot == RowStore::kNoSlot) {  // not admitted: reads as a new row, as a pull does
      InitValues(spec_, req.keys[i], after, dim_, /*sparse_row=*/true);
    } else {
      std::memcpy(after, s.rows.Floats(slot), dim_ * sizeof(float));
    }
  };
  // In parallel unless a row cap may evict (res.evicted is shared by all stripes).
  const bool parallel = rows_per_stripe_ == 0;
  const bool done =
      req.values_after == nullptr
          ? ForEachKeyByStripe(req.keys, req.num_keys, apply, req.no_wait, NoThen{}, parallel)
          : ForEachKeyByStripe(req.keys, req.num_keys, apply, req.no_wait, read_after, parallel);
  if (!done) {
    res.would_block = true;
    return res;
  }
  res.values_read = req.values_after != nullptr;
  res.tau = tau;
  res.version = version_.fetch_add(1) + 1;
  if (ssp_) {
    ssp_->Tick(req.sender, req.now_ms);
    res.hold = !ssp_->Releasable(req.sender, req.now_ms);
  }
  return res;
}

void SparseTable::CompensateEach(const PushRequest& req, float* g) {
  ForEachKeyByStripe(req.keys, req.num_keys, [&](Stripe& s, uint32_t i) {
    const uint32_t slot = s.rows.Find(req.keys[i]);
    if (slot == RowStore::kNoSlot) return;  // a row not created yet still equals its backup
    s.Preserve(slot);  // DC-adaptive compensation updates the row's policy state
    s.MarkChanged(slot);
    float* row = s.rows.Floats(slot);
    auto* b = s.backups.Find({req.sender, req.keys[i]});
    if (b == nullptr) {
      backup_misses_.fetch_add(1);
      return;
    }
    float* pol[4];
    const size_t pol_off = dim_ * (1 + rules_.optimizer_slots());
    for (int k = 0; k < rules_.policy_slots(); ++k) pol[k] = row + pol_off + dim_ * k;
    rules_.Compensate(g + size_t{i} * dim_, row, b->data(), pol, dim_);
  });
}

StatusOr<PushResult> SparseTable::Accumulate(const PushRequest& req, uint64_t tau) {
  // DC-ASGD: each contribution is compensated against its own sender's backup at the
  // current weights before it joins the sum, as in the dense table.
  std::vector<float> g(req.values, req.values + req.num_values);
  if (rules_.needs_backup()) CompensateEach(req, g.data());
  PushResult res;
  res.tau = tau;
  {
    MutexLock lock(&acc_mu_);
    if (spec_.admit_after > 1) {
      // Admission counts pushes, as without accumulation: each push touching a missing
      // row counts once (under acc_mu_, so that the sum applied next sees the touches of
      // exactly the pushes in it, on a backup replaying the log too).
      const Repeats repeats = RepeatsOf(req.keys, req.num_keys);
      ForEachKeyByStripe(req.keys, req.num_keys, [&](Stripe& s, uint32_t i) {
        if (repeats.earlier.empty() || !repeats.earlier[i]) CountTouch(s, req.keys[i]);
      });
    }
    for (size_t i = 0; i < req.num_keys; ++i) {
      auto& sum = acc_[req.keys[i]];
      if (sum.empty()) sum.assign(dim_, 0.0f);
      for (uint32_t j = 0; j < dim_; ++j) sum[j] = internal::Saturate(sum[j] + g[i * dim_ + j]);
    }
    acc_tau_sum_ += tau;
    // The pending sum is bounded as the rows it becomes are: with a cap (max_rows, or
    // the admission candidates) it is applied early once it holds that many rows' worth.
    const uint64_t cap = PendingBytesCap();
    const bool full = cap != 0 && acc_.size() * uint64_t{dim_} * sizeof(float) >= cap;
    if (++acc_count_ < spec_.accumulate && !full) {
      res.queued = true;
      res.version = version_.load();
    } else {
      const uint64_t mean_tau = (acc_tau_sum_ + acc_count_ / 2) / acc_count_;
      ApplyAccumulated(rules_.policy().LrScale(mean_tau), req.now_ms, &res.evicted);
      res.version = version_.fetch_add(1) + 1;
    }
  }
  if (ssp_) {
    ssp_->Tick(req.sender, req.now_ms);
    res.hold = !ssp_->Releasable(req.sender, req.now_ms);
  }
  return res;
}

uint64_t SparseTable::PendingBytesCap() const {
  const uint64_t row_bytes = uint64_t{dim_} * sizeof(float);
  uint64_t rows = 0;
  if (spec_.max_rows > 0) {
    rows = spec_.max_rows;
  } else if (spec_.admit_after > 1) {
    rows = kMaxAdmissionCandidates;
  } else {
    return 0;
  }
  return std::max(kMinPendingCapBytes,
                  rows > UINT64_MAX / row_bytes ? UINT64_MAX : rows * row_bytes);
}

void SparseTable::ApplyAccumulated(float lr_scale, uint64_t now_ms,
                                   std::vector<uint64_t>* evicted) {
  const float scale = spec_.accumulate_mean ? 1.0f / static_cast<float>(acc_count_) : 1.0f;
  const uint64_t step = version_.load() + 1;
  for (const uint64_t key : AccumulatedKeys()) {
    std::vector<float>& sum = acc_[key];
    for (float& x : sum) x *= scale;
    Stripe& s = StripeOf(key);
    MutexLock lock(&s.mu);
    // Touches were counted as the pushes arrived.
    int64_t slot = FindOrCreate(s, key, now_ms, evicted, Touch::kAdmitIfCounted);
    if (slot >= 0) {
      ApplyRow(s, static_cast<uint32_t>(slot), 0, sum.data(), false, lr_scale, step,
               /*compensate=*/false,  // each contribution was compensated on arrival
               /*step_average=*/true);
    }
  }
  acc_.clear();
  acc_count_ = 0;
  acc_tau_sum_ = 0;
}

bool SparseTable::Releasable(uint64_t sender, uint64_t now_ms) {
  return !ssp_ || ssp_->Releasable(sender, now_ms);
}

void SparseTable::Maintain(uint64_t now_ms) {
  if (spec_.ttl_ms == 0) return;
  for (size_t si = 0; si < num_stripes_; ++si) {
    Stripe& s = *stripes_[si];
    MutexLock lock(&s.mu);
    // Written as a difference: last_ms + ttl_ms wraps for a ttl near 2^64 ("never").
    auto expired = [&](uint64_t last_ms) {
      return now_ms > last_ms && now_ms - last_ms > spec_.ttl_ms;
    };
    while (s.tail != kNil && expired(s.Links(s.tail).last_ms)) s.Evict(s.tail);
  }
}

TableStats SparseTable::Stats() const {
  TableStats st;
  st.version = version_.load();
  st.backup_misses = backup_misses_.load();
  st.clipped_pushes = clipped_pushes_.load();
  for (size_t si = 0; si < num_stripes_; ++si) {
    Stripe& s = *stripes_[si];
    MutexLock lock(&s.mu);
    st.rows += s.rows.size();
    st.evicted_rows += s.evicted;
    st.backups += s.backups.size();
    st.memory_bytes += s.rows.memory_bytes() + s.backups.size() * (dim_ * 4 + 48) +
                       s.admission.size() * kCandidateBytes;
  }
  {
    MutexLock lock(&acc_mu_);  // the pending sum of accumulation, per key
    st.memory_bytes += acc_.size() * (dim_ * 4 + 64);
  }
  st.elements = st.rows * dim_;
  return st;
}

uint64_t SparseTable::BytesPerNewRow() const {
  // The record, its index entry (8 bytes at a load of 3/4 or less: 16), and with
  // accumulation its pending sum until applied (as Stats counts it). With admission a
  // new key is a candidate first, which a small row can cost more than.
  const uint64_t record = layout_.header_bytes + uint64_t{row_floats_} * sizeof(float);
  const uint64_t row = record + 16 + (spec_.accumulate > 1 ? uint64_t{dim_} * 4 + 64 : 0);
  return spec_.admit_after > 1 ? std::max(row, kCandidateBytes) : row;
}

uint64_t SparseTable::NewRows(const uint64_t* keys, size_t n) {
  uint64_t missing[kMaxStripes] = {};
  ForEachKeyByStripe(keys, n, [&](Stripe& s, uint32_t i) {
    if (s.rows.Find(keys[i]) != RowStore::kNoSlot) return;
    uint64_t& m = missing[StripeIndex(keys[i])];
    // A capped stripe that is full evicts a row for each new one: it grows no more.
    if (rows_per_stripe_ == 0 || s.rows.size() + m < rows_per_stripe_) ++m;
  });
  uint64_t rows = 0;
  for (size_t si = 0; si < num_stripes_; ++si) rows += missing[si];
  return rows;
}

void SparseTable::Save(ByteWriter* w) const {
  w->Put<uint64_t>(version_.load());
  for (size_t si = 0; si < num_stripes_; ++si) {
    Stripe& s = *stripes_[si];
    MutexLock lock(&s.mu);
    w->Put<uint64_t>(s.rows.size());
    auto put = [&](uint32_t i) {
      w->Put<uint64_t>(s.rows.KeyOf(i));
      w->Put<uint32_t>(layout_.avg_count_offset != 0 ? s.AvgCount(i) : 0);
      w->Append(s.rows.Floats(i), row_floats_ * sizeof(float));
    };
    if (layout_.lru) {
      // Oldest first, so a restore rebuilds the same LRU order.
      for (uint32_t i = s.tail; i != kNil; i = s.Links(i).prev) put(i);
    } else {
      // Without a cap or TTL no row is ever dropped: every slot handed out is live.
      for (uint32_t i = 0; i < s.rows.slot_end(); ++i) put(i);
    }
  }
  SaveAccumulator(w);
}

void SparseTable::SaveAccumulator(ByteWriter* w) const {
  // Pushes answered "queued" are part of the state: keep the accumulator.
  MutexLock lock(&acc_mu_);
  w->Put<uint32_t>(acc_count_);
  w->Put<uint64_t>(acc_tau_sum_);
  w->Put<uint64_t>(acc_.size());
  for (const uint64_t key : AccumulatedKeys()) {
    w->Put<uint64_t>(key);
    w->Append(acc_.at(key).data(), dim_ * sizeof(float));
  }
}

std::vector<uint64_t> SparseTable::AccumulatedKeys() const {
  std::vector<uint64_t> keys;
  keys.reserve(acc_.size());
  for (const auto& [key, sum] : acc_) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

// A snapshot of a sparse table: the cut records, per stripe, which rows to write (the
// slots handed out, or the head of the LRU list; a delta: the rows changed since the
// last cut, and the keys dropped since); the writer then takes each stripe's lock for
// kChunkRows rows at a time, and an update about to change a row (or its LRU links)
// that is still to be written copies its record first (Stripe::Preserve). A full
// snapshot's rows come out in Save's order: LRU order (oldest first) for tables that can
// drop rows, slot order for the others; a delta's in slot order.
class SparseSnapshot final : public TableSnapshot {
 public:
  SparseSnapshot(SparseTable* t, SnapshotKind kind)
      : t_(t), delta_(kind == SnapshotKind::kDelta), version_(t->version_.load()) {
    for (const auto& s : t_->stripes_) {
      MutexLock lock(&s->mu);
      s->snap_active = true;
      s->snap_delta = delta_;
      s->snap_cursor = 0;
      s->snap_end = s->rows.slot_end();
      s->snap_next = s->tail;
      s->TakeReady();
      std::vector<uint64_t> changed, dropped;
      if (kind != SnapshotKind::kCopy) s->TakeChanges(&changed, &dropped);
      if (delta_) {
        rows_.push_back(SparseTable::Stripe::Ones(changed));
        s->snap_changed = std::move(changed);
        s->snap_dropped = std::move(dropped);
      } else {
        if (t_->layout_.lru) s->snap_written.assign(s->snap_end, false);
        rows_.push_back(s->rows.size());
      }
    }
    t_->SaveAccumulator(&accumulator_);
  }
  ~SparseSnapshot() override {
    for (const auto& s : t_->stripes_) {
      MutexLock lock(&s->mu);
      s->EndSnapshot();
    }
  }

  void Write(ByteWriter* w) override {
    w->Put<uint64_t>(version_);
    for (size_t si = 0; si < t_->stripes_.size(); ++si) {
      SparseTable::Stripe& s = *t_->stripes_[si];
      if (delta_) {
        MutexLock lock(&s.mu);
        w->Put<uint64_t>(s.snap_dropped.size());
        w->Append(s.snap_dropped.data(), s.snap_dropped.size() * sizeof(uint64_t));
      }
      w->Put<uint64_t>(rows_[si]);
      WriteStripe(s, w);
    }
    w->Append(accumulator_.buffer().data(), accumulator_.buffer().size());
  }

 private:
  // Rows per hold of a stripe's lock: ~1 MiB of copying at dim 64.
  static constexpr uint32_t kChunkRows = 4096;

  void WriteStripe(SparseTable::Stripe& s, ByteWriter* w) {
    std::string buf;
    for (bool more = true; more;) {
      buf.clear();
      {
        MutexLock lock(&s.mu);
        for (uint32_t n = 0; n < kChunkRows && (more = NextRow(s, &buf)); ++n) {
        }
        if (!more) s.EndSnapshot();  // this stripe is written: its copies go
      }
      w->Append(buf.data(), buf.size());
      // Between chunks the writer gives its core to whoever waits for one: on 2 cores a
      // push's tail during a checkpoint was a scheduler slice lost to the writer (p99
      // during 6.5-7.1 ms -> 4.5-4.6 at 10M rows x 64, the write 10-20% longer).
      std::this_thread::yield();
    }
  }

  // Appends the next row to write to buf; false when the stripe is done.
  // REQUIRES: s.mu held.
  bool NextRow(SparseTable::Stripe& s, std::string* buf) {
    uint32_t slot;
    if (delta_) {
      slot = s.snap_cursor = NextChanged(s, s.snap_cursor);
      if (slot == s.snap_end) return false;
    } else if (t_->layout_.lru) {
      if (s.snap_next == kNil) return false;
      slot = s.snap_next;
    } else {
      if (s.snap_cursor == s.snap_end) return false;
      slot = s.snap_cursor;
    }
    const char* copy = s.CopyOf(slot);
    const char* rec = copy != nullptr ? copy : s.rows.Record(slot);
    uint32_t avg_count = 0;
    if (t_->layout_.avg_count_offset != 0) {
      std::memcpy(&avg_count, rec + t_->layout_.avg_count_offset, sizeof avg_count);
    }
    buf->append(rec, sizeof(uint64_t));  // the key
    buf->append(reinterpret_cast<const char*>(&avg_count), sizeof avg_count);
    buf->append(rec + t_->layout_.header_bytes, t_->row_floats_ * sizeof(float));
    if (t_->layout_.lru && !delta_) {
      LruLinks links;
      std::memcpy(&links, rec + sizeof(uint64_t), sizeof links);  // the cut's links
      s.snap_written[slot] = true;
      s.snap_next = links.prev;
    } else {
      ++s.snap_cursor;
    }
    return true;
  }

  // The first slot at or after `from` whose row changed before the cut, or snap_end.
  static uint32_t NextChanged(const SparseTable::Stripe& s, uint32_t from) {
    const std::vector<uint64_t>& bits = s.snap_changed;
    size_t w = from >> 6;
    if (from >= s.snap_end || w >= bits.size()) return s.snap_end;
    uint64_t word = bits[w] & (~uint64_t{0} << (from & 63));
    while (word == 0) {
      if (++w == bits.size()) return s.snap_end;
      word = bits[w];
    }
    return std::min<uint32_t>(s.snap_end, static_cast<uint32_t>(w * 64 + __builtin_ctzll(word)));
  }

  SparseTable* const t_;
  const bool delta_;
  const uint64_t version_;
  std::vector<uint64_t> rows_;  // per stripe, at the cut
  ByteWriter accumulator_;
};

std::unique_ptr<TableSnapshot> SparseTable::BeginSnapshot(SnapshotKind kind) {
  return std::make_unique<SparseSnapshot>(this, kind);
}

void SparseTable::PrepareSnapshot() {
  for (const auto& s : stripes_) {
    size_t slots = 0;
    {
      MutexLock lock(&s->mu);
      if (s->ready_copy_at != nullptr) continue;
      slots = s->rows.slot_end();
    }
    // A small stripe's first copies cost little: map nothing ahead for it.
    if (slots < kPrepareSlots) continue;
    // Room for the rows created until the cut, and a block of copies: a 10,000-key push
    // copies ~165 KiB per stripe at dim 64.
    const size_t bytes = (slots + slots / 8 + 1024) * sizeof(uint32_t);
    auto* map = reinterpret_cast<uint32_t*>(MapPopulated(bytes));
    char* block = MapPopulated(Stripe::kCopyBlockBytes);
    MutexLock lock(&s->mu);
    s->DropReady();
    s->ready_copy_at = map;
    s->ready_copy_at_bytes = bytes;
    s->ready_blocks.push_back(block);
  }
}

ChangeStats SparseTable::Changes() const {
  ChangeStats c;
  for (const auto& s : stripes_) {
    MutexLock lock(&s->mu);
    c.changed_rows += Stripe::Ones(s->changed);
    c.dropped_rows += s->dropped.size();
    c.rows += s->rows.size();
    c.overflow = c.overflow || s->dropped_overflow;
  }
  return c;
}

Status SparseTable::Load(ByteReader* r) { return LoadBody(r, /*delta=*/false); }
Status SparseTable::LoadDelta(ByteReader* r) { return LoadBody(r, /*delta=*/true); }

Status SparseTable::LoadBody(ByteReader* r, bool delta) {
  uint64_t version = 0;
  ONLINEPS_RETURN_IF_ERROR(r->Get(&version, "sparse version"));
  std::vector<float> row(row_floats_);
  const uint64_t now_ms = NowMs();  // restored rows count as touched now for TTL
  for (size_t si = 0; si < num_stripes_; ++si) {
    Stripe& s = *stripes_[si];
    if (delta) {
      uint64_t dropped = 0;
      ONLINEPS_RETURN_IF_ERROR(r->Get(&dropped, "sparse dropped row count"));
      if (dropped > r->Remaining() / 8) return DataLoss("sparse dropped row count too large");
      for (uint64_t k = 0; k < dropped; ++k) {
        uint64_t key = 0;
        ONLINEPS_RETURN_IF_ERROR(r->Get(&key, "sparse dropped row key"));
        if (&StripeOf(key) != &s) return DataLoss("sparse dropped row in the wrong stripe");
        MutexLock lock(&s.mu);
        if (const uint32_t slot = s.rows.Find(key); slot != RowStore::kNoSlot) {
          if (layout_.lru) s.Unlink(slot);
          s.rows.Erase(slot);
        }
      }
    }
    uint64_t rows = 0;
    ONLINEPS_RETURN_IF_ERROR(r->Get(&rows, "sparse row count"));
    if (rows > r->Remaining() / (row_floats_ * 4 + 12))
      return DataLoss("sparse row count too large");
    for (uint64_t k = 0; k < rows; ++k) {
      uint64_t key = 0;
      uint32_t avg_count = 0;
      ONLINEPS_RETURN_IF_ERROR(r->Get(&key, "sparse row key"));
      ONLINEPS_RETURN_IF_ERROR(r->Get(&avg_count, "sparse row average count"));
      ONLINEPS_RETURN_IF_ERROR(r->GetBytes(row.data(), row_floats_ * 4, "sparse row values"));
      if (&StripeOf(key) != &s) return DataLoss("sparse row in the wrong stripe");
      MutexLock lock(&s.mu);
      uint32_t slot = s.rows.Find(key);
      if (slot == RowStore::kNoSlot) {
        slot = s.rows.Insert(key);
        s.InitMeta(slot, now_ms, avg_count);
      } else if (!delta) {
        // A full checkpoint writes each live row once: a second copy is damage.
        return DataLoss("sparse row key " + std::to_string(key) + " appears twice");
      } else {
        if (layout_.avg_count_offset != 0) s.AvgCount(slot) = avg_count;
        if (delta) s.Touch(slot, now_ms);  // changed after the rows before it
      }
      std::memcpy(s.rows.Floats(slot), row.data(), row_floats_ * 4);
    }
  }
  return LoadAccumulator(r, version);
}

Status SparseTable::LoadAccumulator(ByteReader* r, uint64_t version) {
  uint32_t count = 0;
  uint64_t tau_sum = 0, rows = 0;
  ONLINEPS_RETURN_IF_ERROR(r->Get(&count, "accumulator count"));
  ONLINEPS_RETURN_IF_ERROR(r->Get(&tau_sum, "accumulator staleness"));
  ONLINEPS_RETURN_IF_ERROR(r->Get(&rows, "accumulator rows"));
  if (rows > r->Remaining() / (8 + dim_ * 4)) return DataLoss("accumulator row count too large");
  std::unordered_map<uint64_t, std::vector<float>> acc;
  for (uint64_t k = 0; k < rows; ++k) {
    uint64_t key = 0;
    std::vector<float> sum(dim_);
    ONLINEPS_RETURN_IF_ERROR(r->Get(&key, "accumulator key"));
    ONLINEPS_RETURN_IF_ERROR(r->GetBytes(sum.data(), dim_ * 4, "accumulator values"));
    acc[key] = std::move(sum);
  }
  MutexLock lock(&acc_mu_);
  acc_ = std::move(acc);
  acc_count_ = count;
  acc_tau_sum_ = tau_sum;
  version_.store(version);
  return Status::Ok();
}

}  // namespace onlineps::ps
