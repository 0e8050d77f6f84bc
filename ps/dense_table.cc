#include "ps/dense_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/partition.h"
#include "ps/apply_helper.h"
#include "ps/optimizers.h"

namespace onlineps::ps {

namespace {
// From this many elements a gradient is applied on two threads (ApplyHelper), in
// chunks of kChunkElems taken from one counter: below it the hand-off costs more than
// half the apply saves.
constexpr uint64_t kParallelElems = 256 << 10;
constexpr uint64_t kChunkElems = 64 << 10;
}  // namespace

DenseTable::DenseTable(const TableSpec& spec, RuleSet rules, uint32_t shard, uint32_t num_shards)
    : spec_(spec),
      rules_(std::move(rules)),
      n_(DenseLayout(spec.name, spec.size(), num_shards).ElemsOf(shard)),
      backups_(spec.dc_max_backups) {
  w_.resize(n_);
  uint64_t pos = 0;
  const DenseLayout layout(spec.name, spec.size(), num_shards);
  for (const DenseSlice& s : layout.SlicesOf(shard)) {
    InitValues(spec_, s.offset, w_.data() + pos, s.length, /*sparse_row=*/false);
    pos += s.length;
  }
  opt_state_.resize(n_ * rules_.optimizer_slots());
  for (int k = 0; k < rules_.optimizer_slots(); ++k) {
    std::fill(opt_state_.begin() + k * n_, opt_state_.begin() + (k + 1) * n_,
              rules_.InitialState(k));
  }
  pol_state_.assign(n_ * rules_.policy_slots(), 0.0f);
  opt_slots_ = Slots(opt_state_, rules_.optimizer_slots());
  pol_slots_ = Slots(pol_state_, rules_.policy_slots());
  if (spec_.polyak) avg_ = w_;
  if (spec_.accumulate > 1) acc_.assign(n_, 0.0f);
  if (HoldsReplies(spec_)) {
    ssp_.emplace(static_cast<uint64_t>(spec_.max_staleness), spec_.block_timeout_ms);
  }
}

std::vector<float*> DenseTable::Slots(std::vector<float>& storage, int slots) {
  std::vector<float*> out;
  for (int k = 0; k < slots; ++k) out.push_back(storage.data() + k * n_);
  return out;
}

uint64_t DenseTable::version() const { return published_version_.load(std::memory_order_acquire); }

bool DenseTable::LockUnlessNoWait(bool no_wait) {
  if (no_wait) return mu_.TryLock();
  mu_.Lock();
  return true;
}

StatusOr<PullResult> DenseTable::Pull(const PullRequest& req) {
  if (req.averaged && !spec_.polyak) {
    return InvalidArgument("table '" + spec_.name +
                           "' keeps no Polyak average; create it with polyak=true");
  }
  if (req.count != 0 && (req.first > n_ || req.count > n_ - req.first)) {
    return InvalidArgument("pull of " + std::to_string(req.count) + " elements from element " +
                           std::to_string(req.first) + " of table '" + spec_.name +
                           "': this shard holds " + std::to_string(n_));
  }
  if (ssp_) ssp_->Touch(req.sender, req.now_ms);
  PullResult out;
  if (!LockUnlessNoWait(req.no_wait)) {
    out.would_block = true;
    return out;
  }
  out.version = version_;
  const std::vector<float>& from = req.averaged ? avg_ : w_;
  if (req.count == 0) {
    out.values = from;
  } else {
    out.values.assign(from.begin() + req.first, from.begin() + req.first + req.count);
  }
  if (rules_.needs_backup() && req.record_backup && !req.averaged) {
    backups_.Put(req.sender, w_);
  }
  mu_.Unlock();
  return out;
}

StatusOr<PushResult> DenseTable::Push(const PushRequest& req) {
  if (req.num_values != n_) {
    return ShapeMismatch("table '" + spec_.name + "': this shard holds " + std::to_string(n_) +
                         " elements, the push carries " + std::to_string(req.num_values));
  }
  if (!AllFinite(req.values, req.num_values)) {
    return NonFinite("table '" + spec_.name + "': push contains NaN or Inf; nothing applied");
  }
  std::vector<float> clipped_values;
  bool clipped = false;
  const float* values = ClipToNorm(req.values, req.num_values, req.seed ? 0.0 : spec_.clip_norm,
                                   &clipped_values, &clipped);
  PushResult res;
  if (!LockUnlessNoWait(req.no_wait)) {
    res.would_block = true;
    return res;
  }
  const Status applied = ApplyPushLocked(req, values, &res);
  if (applied.ok() && req.values_after != nullptr) {
    std::memcpy(req.values_after, w_.data(), n_ * sizeof(float));
    res.values_read = true;
  }
  mu_.Unlock();
  if (clipped) clipped_pushes_.fetch_add(1);
  ONLINEPS_RETURN_IF_ERROR(applied);
  if (ssp_) {
    ssp_->Tick(req.sender, req.now_ms);
    res.hold = !ssp_->Releasable(req.sender, req.now_ms);
  }
  return res;
}

Status DenseTable::ApplyPushLocked(const PushRequest& req, const float* values, PushResult* res) {
  res->tau = version_ >= req.base_version ? version_ - req.base_version : 0;
  ONLINEPS_RETURN_IF_ERROR(rules_.CheckBound(spec_.name, res->tau));
  if (req.delta) {
    ApplyDeltaLocked(values);
  } else {
    const float* w_bak = nullptr;
    if (rules_.needs_backup()) {
      const std::vector<float>* b = backups_.Find(req.sender);
      if (b != nullptr)
        w_bak = b->data();
      else
        ++backup_misses_;
    }
    if (spec_.accumulate > 1) {
      res->queued = !AccumulateLocked(values, w_bak, res->tau);
    } else {
      ApplyLocked(values, w_bak, rules_.policy().LrScale(res->tau));
    }
  }
  res->version = version_;
  return Status::Ok();
}

void DenseTable::ApplyLocked(const float* g, const float* w_bak, float lr_scale) {
  // Every rule is elementwise, so a gradient applies in independent chunks. With a
  // DC-ASGD backup the rule rewrites a copy of g in scratch_: one thread.
  const bool chunked = w_bak == nullptr && n_ >= kParallelElems && rules_.optimizer_slots() <= 4 &&
                       rules_.policy_slots() <= 4;
  ApplyHelper* helper = chunked ? ApplyHelper::Get() : nullptr;
  if (helper == nullptr) {
    rules_.Apply(w_.data(), opt_slots_.data(), pol_slots_.data(), g, w_bak, n_, lr_scale,
                 version_ + 1, &scratch_);
  } else {
    // The helper runs while this thread holds mu_ and waits in Finish: it is handed the
    // arrays, not the members.
    float* const w = w_.data();
    const uint64_t step = version_ + 1;
    const uint64_t chunks = (n_ + kChunkElems - 1) / kChunkElems;
    helper->Share(chunks, [&, w](size_t c) {
      const uint64_t off = c * kChunkElems, len = std::min(kChunkElems, n_ - off);
      float* opt[4];  // slot counts checked above
      float* pol[4];
      for (int k = 0; k < rules_.optimizer_slots(); ++k) opt[k] = opt_slots_[k] + off;
      for (int k = 0; k < rules_.policy_slots(); ++k) pol[k] = pol_slots_[k] + off;
      rules_.Apply(w + off, opt, pol, g + off, nullptr, len, lr_scale, step, nullptr);
    });
  }
  AfterApplyLocked();
}

void DenseTable::ApplyDeltaLocked(const float* delta) {
  const float scale = internal::SaturateToFloat(spec_.delta_scale);
  float* __restrict w = w_.data();
  for (uint64_t i = 0; i < n_; ++i) w[i] = internal::Saturate(w[i] + scale * delta[i]);
  AfterApplyLocked();
}

bool DenseTable::AccumulateLocked(const float* g, const float* w_bak, uint64_t tau) {
  if (w_bak != nullptr) {
    scratch_.assign(g, g + n_);
    rules_.Compensate(scratch_.data(), w_.data(), w_bak, pol_slots_.data(), n_);
    g = scratch_.data();
  }
  float* __restrict acc = acc_.data();
  for (uint64_t i = 0; i < n_; ++i) acc[i] = internal::Saturate(acc[i] + g[i]);
  acc_tau_sum_ += tau;
  if (++acc_count_ < spec_.accumulate) return false;
  if (spec_.accumulate_mean) {
    const float inv = 1.0f / static_cast<float>(acc_count_);
    for (uint64_t i = 0; i < n_; ++i) acc[i] *= inv;
  }
  // The staleness-aware rule uses the mean staleness of the contributions.
  const uint64_t mean_tau = (acc_tau_sum_ + acc_count_ / 2) / acc_count_;
  ApplyLocked(acc_.data(), nullptr, rules_.policy().LrScale(mean_tau));
  std::fill(acc_.begin(), acc_.end(), 0.0f);
  acc_count_ = 0;
  acc_tau_sum_ = 0;
  return true;
}

void DenseTable::AfterApplyLocked() {
  ++version_;
  published_version_.store(version_, std::memory_order_release);
  if (spec_.polyak && version_ > spec_.polyak_start) {
    PolyakStep(avg_.data(), w_.data(), n_, version_, spec_.polyak_start);
  } else if (spec_.polyak) {
    avg_ = w_;
  }
}

bool DenseTable::Releasable(uint64_t sender, uint64_t now_ms) {
  return !ssp_ || ssp_->Releasable(sender, now_ms);
}

TableStats DenseTable::Stats() const {
  MutexLock lock(&mu_);
  TableStats s;
  s.version = version_;
  s.elements = n_;
  s.backups = backups_.size();
  s.backup_misses = backup_misses_;
  s.clipped_pushes = clipped_pushes_.load();
  s.memory_bytes = 4 * (w_.size() + opt_state_.size() + pol_state_.size() + avg_.size() +
                        acc_.size() + backups_.size() * n_);
  return s;
}

void DenseTable::Save(ByteWriter* w) const {
  MutexLock lock(&mu_);
  w->Put<uint64_t>(version_);
  w->PutArray(w_.data(), w_.size());
  w->PutArray(opt_state_.data(), opt_state_.size());
  w->PutArray(pol_state_.data(), pol_state_.size());
  w->PutArray(avg_.data(), avg_.size());
  w->PutArray(acc_.data(), acc_.size());
  w->Put<uint32_t>(acc_count_);
  w->Put<uint64_t>(acc_tau_sum_);
}

Status DenseTable::Load(ByteReader* r) {
  MutexLock lock(&mu_);
  ONLINEPS_RETURN_IF_ERROR(r->Get(&version_, "dense version"));
  published_version_.store(version_, std::memory_order_release);
  ONLINEPS_RETURN_IF_ERROR(r->GetArray(&w_, "dense weights", w_.size()));
  ONLINEPS_RETURN_IF_ERROR(r->GetArray(&opt_state_, "optimizer state", opt_state_.size()));
  ONLINEPS_RETURN_IF_ERROR(r->GetArray(&pol_state_, "policy state", pol_state_.size()));
  ONLINEPS_RETURN_IF_ERROR(r->GetArray(&avg_, "Polyak average", avg_.size()));
  ONLINEPS_RETURN_IF_ERROR(r->GetArray(&acc_, "accumulator", acc_.size()));
  ONLINEPS_RETURN_IF_ERROR(r->Get(&acc_count_, "accumulator count"));
  ONLINEPS_RETURN_IF_ERROR(r->Get(&acc_tau_sum_, "accumulator staleness"));
  opt_slots_ = Slots(opt_state_, rules_.optimizer_slots());
  pol_slots_ = Slots(pol_state_, rules_.policy_slots());
  backups_.Clear();
  return Status::Ok();
}

}  // namespace onlineps::ps
