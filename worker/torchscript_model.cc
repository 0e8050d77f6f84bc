// The torchscript model: a user's scripted module whose parameters become PS tables.
// Parameters named in ModelOptions::sparse_params are embedding tables of which a call
// sees only the rows its batch touches: the text's hashed ids are remapped to 0..u-1 and
// the module runs forward(ids, offsets) over a compact u x d weight. Without sparse
// params it runs forward(x) on the features. A TorchScript module is stateful (its
// parameters are slots it reads), so each concurrent call borrows its own clone.
// Context is ignored: a user module has no input for it.
// Frozen parameters (a backbone; ModelOptions::trainable / frozen) stay in the module:
// every replica shares the prototype's storage of them, they never require grad, and
// they are not in params(), so they are neither pulled nor pushed.
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <exception>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/mutex.h"
#include "common/sha256.h"
#include "worker/model.h"
#include "worker/model_factories.h"
#include "worker/model_file_check.h"
#include "worker/torch_common.h"

namespace onlineps::worker {
namespace {

constexpr size_t kMaxReplicas = 16;

// "sha256:<hex>" over the frozen part of `module`: the parameters `learns` marks false,
// every buffer, and the tensor constants of its code (what torch.jit.freeze folds a
// backbone into); each by name or position, dtype, shape and bytes. "" when it has none.
std::string HashFrozen(const torch::jit::Module& module, const std::vector<bool>& learns) {
  Sha256 hash;
  bool any = false;
  auto add = [&](const std::string& what, const torch::Tensor& value) {
    const torch::Tensor t = value.detach().contiguous().cpu();
    std::string head = what + " " + std::string(c10::toString(t.scalar_type())) + " [";
    for (int64_t d : t.sizes()) head += std::to_string(d) + ",";
    head += "]\n";
    hash.Update(head.data(), head.size());
    hash.Update(t.data_ptr(), t.nbytes());
    any = true;
  };
  size_t i = 0;
  for (const auto& p : module.named_parameters()) {
    if (!learns[i++]) add("param " + p.name, p.value);
  }
  for (const auto& b : module.named_buffers()) add("buffer " + b.name, b.value);
  size_t constants = 0;
  std::function<void(torch::jit::Block*)> scan = [&](torch::jit::Block* block) {
    for (torch::jit::Node* node : block->nodes()) {
      for (torch::jit::Block* inner : node->blocks()) scan(inner);
      if (node->kind() != c10::prim::Constant || node->outputs().size() != 1) continue;
      if (node->output()->type()->kind() != c10::TypeKind::TensorType) continue;
      auto value = torch::jit::toIValue(node->output());
      if (value && value->isTensor())
        add("constant " + std::to_string(constants++), value->toTensor());
    }
  };
  for (const auto& sub : module.modules()) {
    for (const auto& method : sub.get_methods()) scan(method.graph()->block());
  }
  return any ? "sha256:" + hash.HexDigest() : "";
}

// A clone of the module and its parameter tensors; used by one call at a time.
struct Replica {
  torch::jit::Module module;
  std::vector<torch::Tensor> params;
};

// Lends replicas, cloning the prototype on demand up to kMaxReplicas, then blocks.
// `learns` marks, in named_parameters() order, the parameters a replica owns and
// differentiates; the frozen rest share the prototype's storage.
class ReplicaPool {
 public:
  ReplicaPool(torch::jit::Module prototype, std::vector<bool> learns)
      : learns_(std::move(learns)), prototype_(std::move(prototype)) {}

  std::unique_ptr<Replica> Acquire() {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return !free_.empty() || created_ < kMaxReplicas; });
    if (!free_.empty()) {
      std::unique_ptr<Replica> replica = std::move(free_.back());
      free_.pop_back();
      return replica;
    }
    // Cloning copies each parameter with Tensor::clone(), which autograd would record,
    // sending every gradient back to the prototype: clone untracked, then make the
    // copies leaves of their own.
    torch::NoGradGuard no_grad;
    auto replica = std::make_unique<Replica>(Replica{prototype_.clone(), {}});
    const auto shared = prototype_.named_parameters();
    auto from = shared.begin();
    size_t i = 0;
    for (const auto& p : replica->module.named_parameters()) {
      torch::Tensor t = p.value;
      if (learns_[i++]) {
        t.requires_grad_(true);
        replica->params.push_back(t);
      } else {
        t.set_data((*from).value);  // read-only: one copy for every replica
      }
      ++from;
    }
    ++created_;
    return replica;
  }

  // HashFrozen over the prototype as it is now.
  std::string HashNow() {
    MutexLock lock(&mu_);
    return HashFrozen(prototype_, learns_);
  }

  void Release(std::unique_ptr<Replica> replica) {
    {
      MutexLock lock(&mu_);
      free_.push_back(std::move(replica));
    }
    cv_.Signal();
  }

 private:
  const std::vector<bool> learns_;
  Mutex mu_;
  CondVar cv_;
  torch::jit::Module prototype_ GUARDED_BY(mu_);  // cloned only under it
  std::vector<std::unique_ptr<Replica>> free_ GUARDED_BY(mu_);
  size_t created_ GUARDED_BY(mu_) = 0;
};

// Returns the borrowed replica to its pool on every path out of a call.
class Lease {
 public:
  explicit Lease(ReplicaPool* pool) : pool_(pool), replica_(pool->Acquire()) {}
  ~Lease() { pool_->Release(std::move(replica_)); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  Replica& operator*() { return *replica_; }

 private:
  ReplicaPool* pool_;
  std::unique_ptr<Replica> replica_;
};

// One call's module input and the view rows its ids touch.
struct Inputs {
  std::vector<torch::IValue> args;
  std::vector<bool> touched;  // per row of the sparse params' view rows
};

class TorchScriptModel : public Model {
 public:
  TorchScriptModel(const ModelOptions& options, std::vector<ParamInfo> params,
                   std::vector<FrozenParam> frozen, std::string base, std::vector<bool> learns,
                   torch::jit::Module prototype)
      : options_(options),
        device_(options.device),
        params_(std::move(params)),
        frozen_(std::move(frozen)),
        base_(std::move(base)),
        pool_(std::move(prototype), std::move(learns)) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].kind == ParamKind::kSparse) sparse_.push_back(i);
    }
  }

  const std::vector<ParamInfo>& params() const override { return params_; }
  const std::vector<std::string>& labels() const override { return options_.labels; }
  std::string device() const override { return options_.device; }
  const std::vector<FrozenParam>& frozen() const override { return frozen_; }
  std::string base() const override { return base_; }
  StatusOr<std::string> BaseNow() const override {
    return Guarded("torchscript hash", [&]() -> StatusOr<std::string> { return pool_.HashNow(); });
  }

  StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(
      const std::vector<Example>& batch, const ContextInput& context) const override {
    ONLINEPS_RETURN_IF_ERROR(CheckInputKind(batch));
    return Guarded("torchscript keys", [&]() -> StatusOr<std::vector<std::vector<uint64_t>>> {
      std::vector<std::vector<uint64_t>> keys(params_.size());
      if (sparse_.empty()) return keys;
      std::unordered_set<uint64_t> seen;
      std::vector<uint64_t> unique;
      for (const Example& ex : batch) {
        for (uint64_t key : TextFeatureKeys(ex.text, options_.bigrams)) {
          if (seen.insert(key).second) unique.push_back(key);
        }
      }
      for (size_t i : sparse_) keys[i] = unique;
      return keys;
    });
  }

  StatusOr<InferOutput> Infer(const std::vector<Example>& batch, const ContextInput& context,
                              const ParamView& view) override {
    return Guarded("torchscript infer", [&]() -> StatusOr<InferOutput> {
      ONLINEPS_ASSIGN_OR_RETURN(Inputs inputs, MakeInputs(batch, view));
      torch::NoGradGuard no_grad;
      Lease lease(&pool_);
      SetParams(*lease, view);
      ONLINEPS_ASSIGN_OR_RETURN(torch::Tensor logits, Forward(*lease, inputs, batch.size()));
      return ToInferOutput(logits);
    });
  }

  StatusOr<GradOutput> Gradients(const std::vector<Example>& batch, const ContextInput& context,
                                 const ParamView& view) override {
    if (batch.empty()) return InvalidArgument("gradients of an empty batch");
    return Guarded("torchscript gradients", [&]() -> StatusOr<GradOutput> {
      ONLINEPS_RETURN_IF_ERROR(CheckLabels(batch, options_.labels.size()));
      ONLINEPS_ASSIGN_OR_RETURN(Inputs inputs, MakeInputs(batch, view));
      Lease lease(&pool_);
      SetParams(*lease, view);
      for (torch::Tensor& p : (*lease).params) p.mutable_grad() = torch::Tensor();
      ONLINEPS_ASSIGN_OR_RETURN(torch::Tensor logits, Forward(*lease, inputs, batch.size()));
      if (!logits.requires_grad()) {
        return InvalidArgument(
            "torchscript forward returned logits that no trainable parameter reaches (detached, "
            "or computed from frozen ones only): a learn has nothing to differentiate");
      }
      std::vector<int64_t> labels;
      for (const Example& ex : batch) labels.push_back(ex.label);
      torch::Tensor targets = torch::tensor(labels, torch::kInt64).to(device_);
      torch::Tensor loss = torch::cross_entropy_loss(logits, targets);
      loss.backward();
      return CollectGrads(*lease, view, inputs, loss.item<double>());
    });
  }

 private:
  // The module reads one input: the text's ids (with sparse params) or the features
  // (forward(x)). The other would be ignored, and a learn of it would move the
  // parameters on an empty input (no ids, or x [B, 0]).
  Status CheckInputKind(const std::vector<Example>& batch) const {
    const bool reads_text = !sparse_.empty();
    for (size_t e = 0; e < batch.size(); ++e) {
      if (batch[e].features.empty() == reads_text) continue;
      return InvalidArgument("example " + std::to_string(e) + ": this torchscript model reads " +
                             (reads_text ? "'text' (ids of its sparse params), not 'features'"
                                         : "'features' (its forward(x)), not 'text'"));
    }
    return Status::Ok();
  }

  StatusOr<Inputs> MakeInputs(const std::vector<Example>& batch, const ParamView& view) const {
    ONLINEPS_RETURN_IF_ERROR(CheckParamView(params_, view));
    ONLINEPS_RETURN_IF_ERROR(CheckInputKind(batch));
    return sparse_.empty() ? DenseInputs(batch) : IdInputs(batch, view);
  }

  StatusOr<Inputs> DenseInputs(const std::vector<Example>& batch) const {
    const size_t width = batch.empty() ? 0 : batch[0].features.size();
    std::vector<float> x;
    x.reserve(batch.size() * width);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].features.size() != width) {
        return InvalidArgument("example " + std::to_string(i) + ": " +
                               std::to_string(batch[i].features.size()) +
                               " features, example 0 has " + std::to_string(width));
      }
      x.insert(x.end(), batch[i].features.begin(), batch[i].features.end());
    }
    const auto shape =
        std::vector<int64_t>{static_cast<int64_t>(batch.size()), static_cast<int64_t>(width)};
    Inputs inputs;
    inputs.args.emplace_back(torch::tensor(x, torch::kFloat32).view(shape).to(device_));
    return inputs;
  }

  // Ids index the view's rows, which every sparse param must hold in the same key order.
  StatusOr<Inputs> IdInputs(const std::vector<Example>& batch, const ParamView& view) const {
    const SparseRows& rows = *view.sparse[sparse_[0]];
    for (size_t i : sparse_) {
      if (view.sparse[i]->keys != rows.keys) {
        return InvalidArgument("param view: sparse params hold different keys");
      }
    }
    std::unordered_map<uint64_t, int64_t> row_of;
    for (size_t r = 0; r < rows.keys.size(); ++r) row_of.emplace(rows.keys[r], r);
    Inputs inputs;
    inputs.touched.assign(rows.keys.size(), false);
    std::vector<int64_t> ids, offsets;
    for (size_t e = 0; e < batch.size(); ++e) {
      offsets.push_back(static_cast<int64_t>(ids.size()));
      for (uint64_t key : TextFeatureKeys(batch[e].text, options_.bigrams)) {
        auto it = row_of.find(key);
        if (it == row_of.end()) {
          return InvalidArgument("example " + std::to_string(e) + ": param view lacks key " +
                                 std::to_string(key));
        }
        ids.push_back(it->second);
        inputs.touched[it->second] = true;
      }
    }
    inputs.args.emplace_back(torch::tensor(ids, torch::kInt64).to(device_));
    inputs.args.emplace_back(torch::tensor(offsets, torch::kInt64).to(device_));
    return inputs;
  }

  // Dense params are copied into the replica's own storage; sparse params get a fresh
  // compact u x d weight (a copy: the replica must not keep the caller's memory).
  void SetParams(Replica& replica, const ParamView& view) const {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& p = replica.params[i];
      if (params_[i].kind == ParamKind::kDense) {
        p.copy_(torch::from_blob(const_cast<float*>(view.dense[i]), p.sizes(), torch::kFloat32));
        continue;
      }
      const SparseRows& rows = *view.sparse[i];
      const int64_t n = static_cast<int64_t>(rows.keys.size()), dim = params_[i].size();
      p.set_data(n == 0 ? torch::zeros({0, dim}, torch::device(device_))
                        : torch::from_blob(const_cast<float*>(rows.values.data()), {n, dim},
                                           torch::kFloat32)
                              .to(device_, torch::kFloat32, false, /*copy=*/true));
    }
  }

  // Errors of the module itself (wrong arity, shapes) are the model file's fault.
  StatusOr<torch::Tensor> Forward(Replica& replica, const Inputs& inputs, size_t batch_size) const {
    torch::IValue out;
    try {
      out = replica.module.forward(inputs.args);
    } catch (const std::exception& e) {
      return InvalidArgument("torchscript forward: " + TorchMessage(e));
    }
    const auto want = std::vector<int64_t>{static_cast<int64_t>(batch_size),
                                           static_cast<int64_t>(options_.labels.size())};
    if (!out.isTensor() || out.toTensor().sizes() != at::IntArrayRef(want)) {
      return InvalidArgument("torchscript forward must return logits [" + std::to_string(want[0]) +
                             ", " + std::to_string(want[1]) + "]");
    }
    // Integer "logits" (class decisions) would be served as a softmax of them.
    if (!out.toTensor().is_floating_point()) {
      return InvalidArgument("torchscript forward must return float logits, returned " +
                             std::string(c10::toString(out.toTensor().scalar_type())));
    }
    return out.toTensor().to(torch::kFloat32);
  }

  GradOutput CollectGrads(Replica& replica, const ParamView& view, const Inputs& inputs,
                          double loss) const {
    GradOutput out;
    out.loss = loss;
    out.dense.resize(params_.size());
    out.sparse.resize(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      const torch::Tensor& p = replica.params[i];
      // A parameter the forward pass does not use has no grad: it gets zeros.
      const torch::Tensor grad = p.grad().defined() ? p.grad() : torch::zeros_like(p);
      if (params_[i].kind == ParamKind::kDense) {
        out.dense[i] = ToVector(grad);
        continue;
      }
      const std::vector<float> values = ToVector(grad);
      const size_t dim = params_[i].size();
      const std::vector<uint64_t>& keys = view.sparse[i]->keys;
      for (size_t r = 0; r < keys.size(); ++r) {
        if (!inputs.touched[r]) continue;
        out.sparse[i].keys.push_back(keys[r]);
        out.sparse[i].values.insert(out.sparse[i].values.end(), values.begin() + r * dim,
                                    values.begin() + (r + 1) * dim);
      }
    }
    return out;
  }

  const ModelOptions options_;
  const torch::Device device_;
  const std::vector<ParamInfo> params_;
  const std::vector<FrozenParam> frozen_;
  const std::string base_;
  std::vector<size_t> sparse_;  // indices of sparse params; immutable after construction
  mutable ReplicaPool pool_;    // lends replicas; BaseNow only reads the prototype
};

// The PS initializes tables from a ParamInfo, not from the file's values: a parameter the
// file holds constant (norm scales, zero biases, scalars) keeps that constant; other
// matrices get normal(1/sqrt(fan_in)), other vectors zeros.
// A dense table that starts at zeros and is seeded with the file's values (WorkerService
// pushes them once, as a delta, into a table no one has updated yet).
ParamInfo DenseInfo(const std::string& name, const torch::Tensor& t) {
  ParamInfo info{name, ParamKind::kDense, {}, "zeros", 0.0};
  for (int64_t d : t.sizes()) info.shape.push_back(static_cast<uint64_t>(d));
  // A 0-dim parameter (a temperature, a logit scale) is a table of one element: a table
  // needs a shape, and the values are copied by the parameter's own sizes.
  if (info.shape.empty()) info.shape.push_back(1);
  info.initial = ToVector(t);
  return info;
}

// The parameters of a module split into PS tables (trainable) and frozen ones.
struct Described {
  std::vector<ParamInfo> infos;
  std::vector<FrozenParam> frozen;
  std::vector<bool> learns;  // per named_parameters() entry
};

// Builds the ParamInfos, marks frozen params, and empties the sparse params of `module`:
// their rows live on the PS, so neither the prototype nor its clones keep a copy.
StatusOr<Described> DescribeParams(const ModelOptions& options, torch::jit::Module& module) {
  std::unordered_set<std::string> sparse(options.sparse_params.begin(),
                                         options.sparse_params.end());
  std::vector<std::string> names;
  std::vector<bool> requires_grad;
  std::vector<torch::Tensor> values;
  for (const auto& p : module.named_parameters()) {
    names.push_back(p.name);
    requires_grad.push_back(p.value.requires_grad());
    values.push_back(p.value);
  }
  Described out;
  ONLINEPS_ASSIGN_OR_RETURN(
      out.learns, SelectTrainable(names, requires_grad, options.trainable, options.frozen));
  // One tensor under two names (tied weights) would be two tables, each trained on its own
  // gradient: the tie would be lost. Only the frozen part, read-only, may hold one.
  for (size_t i = 0; i < values.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if ((out.learns[i] || out.learns[j]) && values[i].is_alias_of(values[j])) {
        return InvalidArgument("torchscript parameters " + names[j] + " and " + names[i] +
                               " are one tensor (tied weights): each trainable parameter is a "
                               "PS table of its own, so the tie would be lost; untie them, or "
                               "freeze both (--frozen)");
      }
    }
  }
  std::vector<ParamInfo>& infos = out.infos;
  torch::NoGradGuard no_grad;
  size_t index = 0;
  for (const auto& p : module.named_parameters()) {
    const std::string table = options.table_prefix + p.name;
    if (!out.learns[index++]) {
      if (sparse.count(p.name) != 0) {
        return InvalidArgument("sparse parameter " + p.name +
                               " is frozen: its rows live on the PS, so it must be trainable");
      }
      // Served as the file holds it: a NaN would make every score NaN. (-Inf may be a mask.)
      if (p.value.is_floating_point() && p.value.isnan().any().item<bool>()) {
        return InvalidArgument("frozen parameter " + p.name + " holds NaN in " +
                               options.model_file + ": every score would be NaN");
      }
      p.value.requires_grad_(false);
      FrozenParam frozen{p.name, {}};
      for (int64_t d : p.value.sizes()) frozen.shape.push_back(static_cast<uint64_t>(d));
      out.frozen.push_back(std::move(frozen));
      continue;
    }
    if (p.value.scalar_type() != torch::kFloat32) {
      return InvalidArgument("torchscript parameter " + p.name + " is not float32");
    }
    if (sparse.erase(p.name) == 0) {
      // Its values seed the table, which takes no NaN or Inf.
      if (!torch::isfinite(p.value).all().item<bool>()) {
        return InvalidArgument("torchscript parameter " + p.name + " holds NaN or Inf in " +
                               options.model_file + ": its table cannot be seeded with it");
      }
      infos.push_back(DenseInfo(table, p.value));
      // Calls copy_ into dense params: a broadcast (stride-0) one needs its own storage.
      if (!p.value.is_contiguous()) p.value.set_data(p.value.contiguous());
      continue;
    }
    if (p.value.dim() != 2) {
      return InvalidArgument("sparse parameter " + p.name + " must be 2-D, has " +
                             std::to_string(p.value.dim()) + " dims");
    }
    const auto dim = static_cast<uint64_t>(p.value.size(1));
    infos.push_back(ParamInfo{table, ParamKind::kSparse, {dim}, "normal", 0.1});
    p.value.set_data(torch::zeros({0, p.value.size(1)}, p.value.options()));
  }
  if (!sparse.empty()) {
    return InvalidArgument("sparse parameter " + *sparse.begin() + " is not a parameter of " +
                           options.model_file);
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<Model>> NewTorchScriptModel(const ModelOptions& options) {
  if (options.model_file.empty()) return InvalidArgument("torchscript model needs a model_file");
  ONLINEPS_RETURN_IF_ERROR(CheckModelArchive(options.model_file));
  torch::jit::Module module;
  try {
    module = torch::jit::load(options.model_file, torch::Device(options.device));
  } catch (const std::exception& e) {
    return InvalidArgument("cannot load torchscript model '" + options.model_file +
                           "': " + TorchMessage(e));
  }
  return Guarded("torchscript model", [&]() -> StatusOr<std::unique_ptr<Model>> {
    // Dropout and batch-norm statistics would differ per replica: run as in inference.
    module.eval();
    // The JIT's optimizing executor specializes a graph on its first runs; a replica
    // first run under no-grad (an infer) then loses autograd for later learns. The
    // modules we serve are small: the plain interpreter costs little and is always right.
    torch::jit::setGraphExecutorOptimize(false);
    ONLINEPS_ASSIGN_OR_RETURN(Described d, DescribeParams(options, module));
    std::string base = HashFrozen(module, d.learns);
    return std::unique_ptr<Model>(std::make_unique<TorchScriptModel>(
        options, std::move(d.infos), std::move(d.frozen), std::move(base), std::move(d.learns),
        std::move(module)));
  });
}

}  // namespace onlineps::worker
