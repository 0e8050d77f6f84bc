// The text model: hashed words and bigrams -> weighted mean of embedding rows (the
// session's context tokens mixed in at a lower weight) -> dense ReLU layers -> logits.
// Written functionally over the caller's ParamView so one instance serves any number of
// threads: no module, no state, nothing written outside the call's own tensors.
#include <torch/torch.h>

#include <cmath>
#include <exception>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "worker/model.h"
#include "worker/model_factories.h"
#include "worker/torch_common.h"

namespace onlineps::worker {
namespace {

constexpr size_t kEmbed = 0;  // params()[0]: the sparse embedding; dense layers follow

// Which embedding rows feed which example: text lookup j reads view row rows[j] into
// example bags[j] with weight weights[j]; every example also gets context_coef[e] times
// the sum of the context rows (one lookup per context token for the whole batch, not
// per example: the context's cost does not grow with the batch). The weights of one
// example sum to 1.
struct Bags {
  std::vector<int64_t> rows;
  std::vector<int64_t> bags;
  std::vector<float> weights;
  std::vector<int64_t> context_rows;
  std::vector<float> context_coef;  // per example
  std::vector<bool> touched;        // per view row
};

class TextModel : public Model {
 public:
  explicit TextModel(const ModelOptions& options)
      : options_(options),
        device_(options.device),
        params_(DenseLayerParams(options.table_prefix, options.embed_dim, options.hidden,
                                 static_cast<uint32_t>(options.labels.size()))) {
    ParamInfo embed{
        options.table_prefix + "embed", ParamKind::kSparse, {options.embed_dim}, "normal", 0.1};
    params_.insert(params_.begin() + kEmbed, std::move(embed));
  }

  const std::vector<ParamInfo>& params() const override { return params_; }
  const std::vector<std::string>& labels() const override { return options_.labels; }
  std::string device() const override { return options_.device; }

  StatusOr<std::vector<std::vector<uint64_t>>> SparseKeys(
      const std::vector<Example>& batch, const ContextInput& context) const override {
    ONLINEPS_RETURN_IF_ERROR(CheckTextInput(batch));
    return Guarded("text model keys", [&]() -> StatusOr<std::vector<std::vector<uint64_t>>> {
      std::vector<std::vector<uint64_t>> keys(params_.size());
      std::unordered_set<uint64_t> seen;
      auto add = [&](uint64_t key) {
        if (seen.insert(key).second) keys[kEmbed].push_back(key);
      };
      for (const Example& ex : batch) {
        for (uint64_t key : TextFeatureKeys(ex.text, options_.bigrams)) add(key);
      }
      for (uint64_t key : ContextKeys(context)) add(key);
      return keys;
    });
  }

  StatusOr<InferOutput> Infer(const std::vector<Example>& batch, const ContextInput& context,
                              const ParamView& view) override {
    ONLINEPS_RETURN_IF_ERROR(CheckTextInput(batch));
    return Guarded("text model infer", [&]() -> StatusOr<InferOutput> {
      ONLINEPS_RETURN_IF_ERROR(CheckParamView(params_, view));
      ONLINEPS_ASSIGN_OR_RETURN(Bags bags, MakeBags(batch, context, *view.sparse[kEmbed]));
      c10::InferenceMode guard;
      const std::vector<torch::Tensor> tensors = ViewTensors(view, /*grad=*/false);
      return ToInferOutput(Forward(tensors, bags, static_cast<int64_t>(batch.size())));
    });
  }

  StatusOr<GradOutput> Gradients(const std::vector<Example>& batch, const ContextInput& context,
                                 const ParamView& view) override {
    if (batch.empty()) return InvalidArgument("gradients of an empty batch");
    ONLINEPS_RETURN_IF_ERROR(CheckTextInput(batch));
    return Guarded("text model gradients", [&]() -> StatusOr<GradOutput> {
      ONLINEPS_RETURN_IF_ERROR(CheckParamView(params_, view));
      ONLINEPS_RETURN_IF_ERROR(CheckLabels(batch, options_.labels.size()));
      ONLINEPS_ASSIGN_OR_RETURN(Bags bags, MakeBags(batch, context, *view.sparse[kEmbed]));
      const std::vector<torch::Tensor> tensors = ViewTensors(view, /*grad=*/true);
      const auto n = static_cast<int64_t>(batch.size());
      std::vector<int64_t> labels;
      for (const Example& ex : batch) labels.push_back(ex.label);
      torch::Tensor targets = torch::tensor(labels, torch::kInt64).to(device_);
      torch::Tensor loss = torch::cross_entropy_loss(Forward(tensors, bags, n), targets);
      loss.backward();
      return CollectGrads(tensors, bags, *view.sparse[kEmbed], loss.item<double>());
    });
  }

 private:
  // The text model reads an example's text only: features sent to it would be ignored,
  // and a learn of them would move the output layer on an empty input.
  static Status CheckTextInput(const std::vector<Example>& batch) {
    for (size_t e = 0; e < batch.size(); ++e) {
      if (!batch[e].features.empty()) {
        return InvalidArgument("example " + std::to_string(e) +
                               ": the text model reads 'text', not 'features'");
      }
    }
    return Status::Ok();
  }

  // Context tokens count only with a positive weight; with weight 0 they are not fetched.
  std::vector<uint64_t> ContextKeys(const ContextInput& context) const {
    if (options_.context_weight <= 0 || context.text.empty()) return {};
    return TextFeatureKeys(context.text, options_.bigrams);
  }

  StatusOr<Bags> MakeBags(const std::vector<Example>& batch, const ContextInput& context,
                          const SparseRows& rows) const {
    std::unordered_map<uint64_t, int64_t> row_of;
    row_of.reserve(rows.keys.size());
    for (size_t i = 0; i < rows.keys.size(); ++i) row_of.emplace(rows.keys[i], i);
    auto lookup = [&](const std::vector<uint64_t>& keys, std::vector<int64_t>* out) -> Status {
      for (uint64_t key : keys) {
        auto it = row_of.find(key);
        if (it == row_of.end()) {
          return InvalidArgument("param view: " + params_[kEmbed].name + " lacks key " +
                                 std::to_string(key));
        }
        out->push_back(it->second);
      }
      return Status::Ok();
    };
    Bags bags;
    ONLINEPS_RETURN_IF_ERROR(lookup(ContextKeys(context), &bags.context_rows));
    bags.touched.assign(rows.keys.size(), false);
    for (int64_t row : bags.context_rows) bags.touched[row] = true;
    bags.context_coef.assign(batch.size(), 0.0f);
    const double context_rows = static_cast<double>(bags.context_rows.size());
    std::vector<int64_t> text_rows;
    for (size_t e = 0; e < batch.size(); ++e) {
      text_rows.clear();
      ONLINEPS_RETURN_IF_ERROR(lookup(TextFeatureKeys(batch[e].text, options_.bigrams), &text_rows)
                                   .WithContext("example " + std::to_string(e)));
      const double total = text_rows.size() + options_.context_weight * context_rows;
      if (total <= 0) continue;  // no features at all: a zero representation
      AddBag(text_rows, e, 1.0 / total, &bags);
      if (context_rows > 0) {
        bags.context_coef[e] = static_cast<float>(options_.context_weight / total);
      }
    }
    return bags;
  }

  static void AddBag(const std::vector<int64_t>& rows, size_t example, double weight, Bags* bags) {
    for (int64_t row : rows) {
      bags->rows.push_back(row);
      bags->bags.push_back(static_cast<int64_t>(example));
      bags->weights.push_back(static_cast<float>(weight));
      bags->touched[row] = true;
    }
  }

  // Tensors of every param, indexed like params_.
  std::vector<torch::Tensor> ViewTensors(const ParamView& view, bool grad) const {
    std::vector<torch::Tensor> tensors;
    const SparseRows& rows = *view.sparse[kEmbed];
    const int64_t dim = options_.embed_dim, num_rows = static_cast<int64_t>(rows.keys.size());
    // from_blob wants a real pointer even for zero rows.
    tensors.push_back(num_rows == 0
                          ? torch::zeros({0, dim}, torch::device(device_)).requires_grad_(grad)
                          : ParamTensor(rows.values.data(), {num_rows, dim}, device_, grad));
    for (size_t i = kEmbed + 1; i < params_.size(); ++i) {
      std::vector<int64_t> shape(params_[i].shape.begin(), params_[i].shape.end());
      tensors.push_back(ParamTensor(view.dense[i], shape, device_, grad));
    }
    return tensors;
  }

  torch::Tensor Forward(const std::vector<torch::Tensor>& tensors, const Bags& bags,
                        int64_t batch_size) const {
    torch::Tensor x = torch::zeros({batch_size, static_cast<int64_t>(options_.embed_dim)},
                                   torch::device(device_));
    if (!bags.rows.empty()) {
      torch::Tensor rows = torch::tensor(bags.rows, torch::kInt64).to(device_);
      torch::Tensor ids = torch::tensor(bags.bags, torch::kInt64).to(device_);
      torch::Tensor weights = torch::tensor(bags.weights, torch::kFloat32).to(device_);
      x = x.index_add(0, ids, tensors[kEmbed].index_select(0, rows) * weights.unsqueeze(1));
    }
    if (!bags.context_rows.empty()) {
      torch::Tensor rows = torch::tensor(bags.context_rows, torch::kInt64).to(device_);
      torch::Tensor coef = torch::tensor(bags.context_coef, torch::kFloat32).to(device_);
      torch::Tensor sum = tensors[kEmbed].index_select(0, rows).sum(0);
      x = x + coef.unsqueeze(1) * sum.unsqueeze(0);
    }
    for (size_t i = kEmbed + 1; i + 1 < tensors.size(); i += 2) {
      x = torch::linear(x, tensors[i], tensors[i + 1]);
      if (i + 2 < tensors.size()) x = torch::relu(x);
    }
    return x;
  }

  GradOutput CollectGrads(const std::vector<torch::Tensor>& tensors, const Bags& bags,
                          const SparseRows& rows, double loss) const {
    GradOutput out;
    out.loss = loss;
    out.dense.resize(params_.size());
    out.sparse.resize(params_.size());
    for (size_t i = kEmbed + 1; i < params_.size(); ++i) {
      out.dense[i] = ToVector(tensors[i].grad());
    }
    const torch::Tensor& embed_grad = tensors[kEmbed].grad();
    if (!embed_grad.defined()) return out;  // nothing touched
    const std::vector<float> grad = ToVector(embed_grad);
    const size_t dim = options_.embed_dim;
    SparseRows& sparse = out.sparse[kEmbed];
    for (size_t r = 0; r < rows.keys.size(); ++r) {
      if (!bags.touched[r]) continue;
      sparse.keys.push_back(rows.keys[r]);
      sparse.values.insert(sparse.values.end(), grad.begin() + r * dim,
                           grad.begin() + (r + 1) * dim);
    }
    return out;
  }

  const ModelOptions options_;
  const torch::Device device_;
  std::vector<ParamInfo> params_;  // immutable after construction
};

}  // namespace

StatusOr<std::unique_ptr<Model>> NewTextModel(const ModelOptions& options) {
  if (options.embed_dim == 0) return InvalidArgument("text model: embed_dim must be > 0");
  if (!std::isfinite(options.context_weight) || options.context_weight < 0) {
    return InvalidArgument("text model: context_weight must be finite and >= 0, got " +
                           std::to_string(options.context_weight));
  }
  return Guarded("text model", [&]() -> StatusOr<std::unique_ptr<Model>> {
    return std::unique_ptr<Model>(std::make_unique<TextModel>(options));
  });
}

}  // namespace onlineps::worker
