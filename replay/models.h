// Torch-free models for replay experiments and golden checks, behind worker::Model:
//   quadratic  f(x) = sum_i h x_i^2 / 2 over one dense parameter; the gradient is h x.
//              Used to check the delay machinery against closed-form stability bounds.
//   sparse-lr  logistic regression on hashed words (one sparse row of width 1 per
//              bucket, plus a bias bucket): the sparse online-learning workload.
// Every other kind goes to worker::CreateModel (libtorch), linked only by the tool.
// Thread-safe like every Model: no mutable state after construction.
#ifndef ONLINEPS_REPLAY_MODELS_H_
#define ONLINEPS_REPLAY_MODELS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model.h"

namespace onlineps::replay {

struct QuadraticOptions {
  uint32_t dim = 1;  // coordinates of x
  double h = 1.0;    // curvature
  double x0 = 1.0;   // every coordinate starts here (a constant-initialised table)
  std::string table = "quad/x";
};

struct SparseLrOptions {
  uint32_t buckets = 1u << 18;  // hashed feature space; 0 keeps the full 64-bit hashes
  bool bigrams = false;
  std::vector<std::string> labels = {"ham", "spam"};  // label 1 is the positive class
  std::string table = "lr/w";
};

std::unique_ptr<worker::Model> MakeQuadraticModel(const QuadraticOptions& options);
std::unique_ptr<worker::Model> MakeSparseLrModel(const SparseLrOptions& options);

// "quadratic" and "sparse-lr" are built here; any other kind is passed to `fallback`
// (the tool passes worker::CreateModel). Errors: kInvalidArgument for an unknown kind
// when there is no fallback.
using ModelFactory =
    std::function<StatusOr<std::unique_ptr<worker::Model>>(const worker::ModelOptions&)>;
StatusOr<std::unique_ptr<worker::Model>> CreateReplayModel(const std::string& kind,
                                                           const worker::ModelOptions& options,
                                                           const ModelFactory& fallback);

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_MODELS_H_
