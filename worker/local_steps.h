// LocalSteps: local-steps mode (model averaging / elastic averaging on a PS). The worker
// applies its dense gradients to a local copy with a local learning rate and, every
// `steps` learn calls, hands back the parameter delta (local - anchor) to push with the
// delta flag; then the next call starts again from the PS's current values. Sparse
// parameters are not affected (their gradients are pushed at once). Not stateless: up to
// `steps - 1` local updates are lost if the worker dies. REQUIRES: callers hold mu().
#ifndef ONLINEPS_WORKER_LOCAL_STEPS_H_
#define ONLINEPS_WORKER_LOCAL_STEPS_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "common/status.h"
#include "ps/ps_client.h"
#include "worker/model.h"
#include "worker/param_cache.h"

namespace onlineps::worker {

class LocalSteps {
 public:
  LocalSteps(ParamCache* cache, const Model* model, uint32_t steps, double lr);

  std::mutex& mu() { return mu_; }
  // Points the dense entries of `view` at the local copies (copied from the cache first
  // when fresh) and sets their base versions to the anchor's.
  Status Substitute(ParamView* view, std::vector<ps::VersionVector>* base);
  // Applies `grad` to param `i`'s local copy. On every `steps`-th call returns the delta.
  std::optional<std::vector<float>> Step(size_t i, const std::vector<float>& grad);
  const ps::VersionVector& anchor_versions(size_t i) const { return params_[i].versions; }
  // After the deltas were pushed: drop the copies so the next call starts from the PS.
  void Reset();

 private:
  struct Local {
    std::vector<float> anchor, values;
    ps::VersionVector versions;
    uint32_t steps = 0;
    bool valid = false;
  };
  ParamCache* const cache_;
  const Model* const model_;
  const uint32_t steps_;
  const float lr_;
  std::mutex mu_;
  std::vector<Local> params_;  // per model param; guarded by mu_ (callers hold it)
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_LOCAL_STEPS_H_
