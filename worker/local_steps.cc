#include "worker/local_steps.h"

namespace onlineps::worker {

LocalSteps::LocalSteps(ParamCache* cache, const Model* model, uint32_t steps, double lr)
    : cache_(cache),
      model_(model),
      steps_(steps == 0 ? 1 : steps),
      lr_(static_cast<float>(lr)),
      params_(model->params().size()) {}

Status LocalSteps::Substitute(ParamView* view, std::vector<ps::VersionVector>* base) {
  const auto& params = model_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind != ParamKind::kDense) continue;
    Local& l = params_[i];
    if (!l.valid) {
      ONLINEPS_ASSIGN_OR_RETURN(auto snap, cache_->Dense(params[i].name));
      l.anchor = snap->values;
      l.values = snap->values;
      l.versions = snap->versions;
      l.steps = 0;
      l.valid = true;
    }
    view->dense[i] = l.values.data();
    (*base)[i] = l.versions;
  }
  return Status::Ok();
}

std::optional<std::vector<float>> LocalSteps::Step(size_t i, const std::vector<float>& grad) {
  Local& l = params_[i];
  for (size_t j = 0; j < grad.size(); ++j) l.values[j] -= lr_ * grad[j];
  if (++l.steps < steps_) return std::nullopt;
  std::vector<float> delta(l.values.size());
  for (size_t j = 0; j < delta.size(); ++j) delta[j] = l.values[j] - l.anchor[j];
  return delta;
}

void LocalSteps::Reset() {
  const auto& params = model_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind != ParamKind::kDense || !params_[i].valid) continue;
    if (params_[i].steps < steps_) continue;
    params_[i].valid = false;
    // Our own delta changed the PS: the cached copy predates it.
    cache_->Invalidate(params[i].name);
  }
}

}  // namespace onlineps::worker
