// WorkerService's local-group mode: every round, the members sum their accumulated dense
// gradients (and example counts) with a collective, take the per-shard minimum of their
// base versions, and the leader pushes the sum once.
#include <spdlog/spdlog.h>

#include <limits>

#include "common/clock.h"
#include "ps/optimizers.h"
#include "worker/worker_service.h"

namespace onlineps::worker {

void WorkerService::GroupTick() {
  if (group_active_) {
    Status st = GroupRound();
    if (!st.ok()) {
      spdlog::error(
          "local group round failed ({}); this worker pushes its own gradients "
          "from now on",
          st.ToString());
      group_active_ = false;
    }
  }
  // Without a working group this tick flushes like the plain one (incl. leftovers).
  if (!group_active_) {
    Status st = FlushDue(/*force=*/false);
    if (!st.ok()) spdlog::warn("flush of accumulated gradients failed: {}", st.ToString());
  }
  RetryHeldIfDue();
}

Status WorkerService::GroupRound() {
  GroupReducer& group = *options_.group;
  const auto& params = model_->params();
  const size_t shards = client_->num_shards();
  constexpr uint64_t kNoBase = std::numeric_limits<uint64_t>::max();
  Pushes pushes;
  Status failed;
  for (size_t i = 0; i < params.size(); ++i) {
    if (group_acc_[i] == nullptr) continue;
    std::optional<Accumulator::Batch> mine =
        group_acc_[i]->TakeIfDue(static_cast<int64_t>(NowMs()), /*force=*/true);
    if (!failed.ok()) {  // the group broke earlier in this round: push directly
      if (mine) PushDense(i, std::move(*mine), &pushes, /*answered=*/true);
      continue;
    }
    // Members without gradients still take part, with zeros: the collective needs all.
    std::vector<float> sum = mine ? mine->sum : std::vector<float>();
    sum.resize(params[i].size(), 0.0f);
    std::vector<uint64_t> base(shards, kNoBase);
    if (mine) std::copy(mine->base.begin(), mine->base.end(), base.begin());
    float examples = mine ? static_cast<float>(mine->examples) : 0.0f;
    Status st = group.SumFloats(sum.data(), sum.size());
    if (st.ok()) st = group.SumFloats(&examples, 1);
    // A member that fails before the parameter's last call never makes it, so the leader
    // cannot complete it: the member pushes its own gradient. A last call that failed
    // without the group's answer may have completed at the leader (it answered after this
    // member gave up), and the leader may push the sum with this member's gradient in it:
    // pushing it again would apply it twice, so it is dropped, its outcome unknown.
    bool last_failed = false;
    if (st.ok()) {
      st = group.MinU64(base.data(), base.size());
      last_failed = !st.ok();
    }
    if (!st.ok()) {
      failed = st;
      if (mine && last_failed && !group.leader() && group.MayHaveCompleted()) {
        spdlog::error(
            "local group: the last call of table '{}' failed ({}); the leader may have pushed "
            "this worker's {} examples with it, so they are not pushed again: their outcome "
            "is unknown",
            params[i].name, st.ToString(), mine->examples);
      } else if (mine) {
        PushDense(i, std::move(*mine), &pushes, /*answered=*/true);
      }
      continue;
    }
    if (!group.leader() || examples <= 0) continue;
    // Saturated as the accumulator's sums are: members' finite gradients may sum past the
    // float range, and a push holding Inf is refused for good (NON_FINITE).
    for (float& x : sum) x = ps::internal::Saturate(x);
    Accumulator::Batch all;
    all.sum = std::move(sum);
    for (uint64_t& b : base) b = b == kNoBase ? 0 : b;
    all.base = std::move(base);
    all.examples = static_cast<uint64_t>(examples);
    PushDense(i, std::move(all), &pushes, /*answered=*/true);
  }
  LearnReply ignored;
  Status pushed = FinishPushes(pushes, ReplyWhen::kApplied, &ignored);
  if (failed.ok()) {
    MutexLock lock(&mu_);
    stats_.group_rounds++;
  }
  if (!pushed.ok()) spdlog::warn("group push failed: {}", pushed.ToString());
  return failed;
}

}  // namespace onlineps::worker
