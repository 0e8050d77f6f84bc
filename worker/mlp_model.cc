// The mlp model: dense features (plus the session's context features as extra columns)
// -> dense ReLU layers -> logits. Written functionally over the caller's ParamView so one
// instance serves any number of threads: no module, no state.
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "worker/model.h"
#include "worker/model_factories.h"
#include "worker/torch_common.h"

namespace onlineps::worker {
namespace {

class MlpModel : public Model {
 public:
  explicit MlpModel(const ModelOptions& options)
      : options_(options),
        device_(options.device),
        params_(DenseLayerParams(options.table_prefix, options.input_dim + options.context_dim,
                                 options.hidden, static_cast<uint32_t>(options.labels.size()))) {}

  const std::vector<ParamInfo>& params() const override { return params_; }
  const std::vector<std::string>& labels() const override { return options_.labels; }
  std::string device() const override { return options_.device; }
  size_t context_features() const override { return options_.context_dim; }

  StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(
      const std::vector<Example>& batch, const ContextInput& context) const override {
    return Guarded("mlp keys", [&]() -> StatusOr<std::vector<std::vector<uint64_t>>> {
      ONLINEPS_RETURN_IF_ERROR(CheckInputs(batch, context));
      return std::vector<std::vector<uint64_t>>(params_.size());
    });
  }

  StatusOr<InferOutput> Infer(const std::vector<Example>& batch, const ContextInput& context,
                              const ParamView& view) override {
    return Guarded("mlp infer", [&]() -> StatusOr<InferOutput> {
      ONLINEPS_RETURN_IF_ERROR(CheckParamView(params_, view));
      ONLINEPS_RETURN_IF_ERROR(CheckInputs(batch, context));
      c10::InferenceMode guard;
      const std::vector<torch::Tensor> tensors = ViewTensors(view, /*grad=*/false);
      return ToInferOutput(Forward(tensors, Inputs(batch, context)));
    });
  }

  StatusOr<GradOutput> Gradients(const std::vector<Example>& batch, const ContextInput& context,
                                 const ParamView& view) override {
    if (batch.empty()) return InvalidArgument("gradients of an empty batch");
    return Guarded("mlp gradients", [&]() -> StatusOr<GradOutput> {
      ONLINEPS_RETURN_IF_ERROR(CheckParamView(params_, view));
      ONLINEPS_RETURN_IF_ERROR(CheckInputs(batch, context));
      ONLINEPS_RETURN_IF_ERROR(CheckLabels(batch, options_.labels.size()));
      const std::vector<torch::Tensor> tensors = ViewTensors(view, /*grad=*/true);
      std::vector<int64_t> labels;
      for (const Example& ex : batch) labels.push_back(ex.label);
      torch::Tensor targets = torch::tensor(labels, torch::kInt64).to(device_);
      torch::Tensor loss =
          torch::cross_entropy_loss(Forward(tensors, Inputs(batch, context)), targets);
      loss.backward();
      GradOutput out;
      out.loss = loss.item<double>();
      out.sparse.resize(params_.size());
      for (const torch::Tensor& t : tensors) out.dense.push_back(ToVector(t.grad()));
      return out;
    });
  }

 private:
  Status CheckInputs(const std::vector<Example>& batch, const ContextInput& context) const {
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].features.size() != options_.input_dim) {
        return InvalidArgument(
            "example " + std::to_string(i) + ": " + std::to_string(batch[i].features.size()) +
            " features, model input_dim is " + std::to_string(options_.input_dim));
      }
    }
    // A session without context features reads as zeros; a partial one is a bug upstream.
    if (options_.context_dim > 0 && !context.features.empty() &&
        context.features.size() != options_.context_dim) {
      return InvalidArgument("context has " + std::to_string(context.features.size()) +
                             " features, model context_dim is " +
                             std::to_string(options_.context_dim));
    }
    return Status::Ok();
  }

  // [batch, input_dim + context_dim] on device_. REQUIRES: CheckInputs passed.
  torch::Tensor Inputs(const std::vector<Example>& batch, const ContextInput& context) const {
    const size_t width = options_.input_dim + options_.context_dim;
    std::vector<float> x(batch.size() * width, 0.0f);
    const bool with_context = options_.context_dim > 0 && !context.features.empty();
    for (size_t i = 0; i < batch.size(); ++i) {
      float* row = x.data() + i * width;
      std::copy(batch[i].features.begin(), batch[i].features.end(), row);
      if (with_context) {
        std::copy(context.features.begin(), context.features.end(), row + options_.input_dim);
      }
    }
    const auto n = static_cast<int64_t>(batch.size());
    return torch::tensor(x, torch::kFloat32).view({n, static_cast<int64_t>(width)}).to(device_);
  }

  std::vector<torch::Tensor> ViewTensors(const ParamView& view, bool grad) const {
    std::vector<torch::Tensor> tensors;
    for (size_t i = 0; i < params_.size(); ++i) {
      std::vector<int64_t> shape(params_[i].shape.begin(), params_[i].shape.end());
      tensors.push_back(ParamTensor(view.dense[i], shape, device_, grad));
    }
    return tensors;
  }

  static torch::Tensor Forward(const std::vector<torch::Tensor>& tensors, torch::Tensor x) {
    for (size_t i = 0; i + 1 < tensors.size(); i += 2) {
      x = torch::linear(x, tensors[i], tensors[i + 1]);
      if (i + 2 < tensors.size()) x = torch::relu(x);
    }
    return x;
  }

  const ModelOptions options_;
  const torch::Device device_;
  const std::vector<ParamInfo> params_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> NewMlpModel(const ModelOptions& options) {
  if (options.input_dim == 0) return InvalidArgument("mlp model: input_dim must be > 0");
  return Guarded("mlp model", [&]() -> StatusOr<std::unique_ptr<Model>> {
    return std::unique_ptr<Model>(std::make_unique<MlpModel>(options));
  });
}

}  // namespace onlineps::worker
