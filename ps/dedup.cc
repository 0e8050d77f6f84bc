#include "ps/dedup.h"

namespace onlineps::ps {

void Dedup::Advance(Window* w, uint64_t seq) {
  // Slide the window up to seq, clearing the bits of seqs that enter it.
  if (seq - w->high >= kWindow) {
    w->applied.reset();
    w->in_progress.reset();
  } else {
    for (uint64_t s = w->high; s != seq;) {  // not s <= seq: that never ends at 2^64 - 1
      ++s;
      w->applied.reset(s % kWindow);
      w->in_progress.reset(s % kWindow);
    }
  }
  w->high = seq;
}

Dedup::Verdict Dedup::Begin(uint64_t sender, uint64_t seq, bool refuse_forgotten) {
  if (seq == 0) return Verdict::kNew;
  MutexLock lock(&mu_);
  Window* w = senders_.Find(sender);
  if (w == nullptr) {
    if (senders_.size() >= senders_.capacity()) {
      const auto* oldest = senders_.Oldest();  // evicted by the Put below
      evicted_.Put(oldest->first, oldest->second.high);
    }
    Window fresh;
    if (const uint64_t* high = evicted_.Find(sender)) {
      fresh.high = fresh.floor = *high;
      evicted_.Erase(sender);
    }
    w = &senders_.Put(sender, fresh);
  }
  if (refuse_forgotten && seq <= w->floor) return Verdict::kTooOld;
  if (seq > w->high) {
    Advance(w, seq);
  } else if (w->high - seq >= kWindow) {
    return Verdict::kTooOld;
  } else if (w->applied.test(seq % kWindow)) {
    return Verdict::kDuplicate;
  } else if (w->in_progress.test(seq % kWindow)) {
    return Verdict::kInProgress;
  }
  w->in_progress.set(seq % kWindow);
  return Verdict::kNew;
}

void Dedup::Commit(uint64_t sender, uint64_t seq) {
  if (seq == 0) return;
  MutexLock lock(&mu_);
  Window* w = senders_.Find(sender);
  if (w == nullptr || seq > w->high || w->high - seq >= kWindow) return;
  w->in_progress.reset(seq % kWindow);
  w->applied.set(seq % kWindow);
}

void Dedup::Abort(uint64_t sender, uint64_t seq) {
  if (seq == 0) return;
  MutexLock lock(&mu_);
  Window* w = senders_.Find(sender);
  if (w == nullptr || seq > w->high || w->high - seq >= kWindow) return;
  w->in_progress.reset(seq % kWindow);
}

size_t Dedup::senders() const {
  MutexLock lock(&mu_);
  return senders_.size();
}

size_t Dedup::evictions() const {
  MutexLock lock(&mu_);
  return senders_.evictions();
}

void Dedup::Save(ByteWriter* out) const {
  MutexLock lock(&mu_);
  out->Put<uint64_t>(senders_.size());
  senders_.ForEach([out](uint64_t sender, const Window& w) {
    out->Put<uint64_t>(sender);
    out->Put<uint64_t>(w.high);
    // In-progress pushes were not applied; only applied bits persist.
    for (uint64_t word = 0; word < kWindow / 64; ++word) {
      uint64_t bits = 0;
      for (uint64_t b = 0; b < 64; ++b) bits |= uint64_t{w.applied.test(word * 64 + b)} << b;
      out->Put<uint64_t>(bits);
    }
  });
}

Status Dedup::Load(ByteReader* r) {
  uint64_t n = 0;
  ONLINEPS_RETURN_IF_ERROR(r->Get(&n, "dedup sender count"));
  std::vector<std::pair<uint64_t, Window>> loaded;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t sender = 0;
    Window w;
    ONLINEPS_RETURN_IF_ERROR(r->Get(&sender, "dedup sender"));
    ONLINEPS_RETURN_IF_ERROR(r->Get(&w.high, "dedup high seq"));
    for (uint64_t word = 0; word < kWindow / 64; ++word) {
      uint64_t bits = 0;
      ONLINEPS_RETURN_IF_ERROR(r->Get(&bits, "dedup window"));
      for (uint64_t b = 0; b < 64; ++b) w.applied.set(word * 64 + b, (bits >> b) & 1);
    }
    loaded.emplace_back(sender, w);
  }
  MutexLock lock(&mu_);
  senders_.Clear();
  // Saved most recent first; insert oldest first to rebuild the same order.
  for (auto it = loaded.rbegin(); it != loaded.rend(); ++it) senders_.Put(it->first, it->second);
  return Status::Ok();
}

}  // namespace onlineps::ps
