// CreateModel: picks the model by kind and settles the options every model shares
// (device, intra-op threads) so each model's factory only checks its own.
#include <torch/torch.h>

#include <cmath>
#include <exception>
#include <unordered_map>

#include "worker/model.h"
#include "worker/model_factories.h"

namespace onlineps::worker {
namespace {

using Factory = StatusOr<std::unique_ptr<Model>> (*)(const ModelOptions&);

struct KindEntry {
  const char* kind;
  Factory factory;
};

constexpr KindEntry kKinds[] = {
    {"text", &NewTextModel},
    {"mlp", &NewMlpModel},
    {"torchscript", &NewTorchScriptModel},
};

// Parses "cpu", "cuda" or "cuda:N" into "cpu" / "cuda:N". torch::Device would accept
// more (mps, xla, ...) that this worker never runs on.
StatusOr<std::string> CanonicalDevice(const std::string& device) {
  if (device == "cpu") return std::string("cpu");
  std::string digits = "0";
  if (device.rfind("cuda:", 0) == 0) {
    digits = device.substr(5);
  } else if (device != "cuda") {
    return InvalidArgument("--device '" + device + "': expected cpu, cuda or cuda:N");
  }
  if (digits.empty() || digits.size() > 3 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgument("--device '" + device + "': expected cpu, cuda or cuda:N");
  }
  if (!torch::cuda::is_available()) {
    return Unavailable("--device " + device +
                       " requested but this libtorch build has no CUDA or no GPU is visible; "
                       "use --device cpu");
  }
  const int index = std::stoi(digits);
  const int count = static_cast<int>(torch::cuda::device_count());
  if (index >= count) {
    return Unavailable("--device " + device + " requested but only " + std::to_string(count) +
                       " GPU(s) are visible");
  }
  return "cuda:" + std::to_string(index);
}

StatusOr<std::unique_ptr<Model>> CreateModelOrThrow(const ModelOptions& options) {
  Factory factory = nullptr;
  for (const KindEntry& entry : kKinds) {
    if (options.kind == entry.kind) factory = entry.factory;
  }
  if (factory == nullptr) {
    return InvalidArgument("unknown model kind '" + options.kind +
                           "' (expected text, mlp or torchscript)");
  }
  ONLINEPS_RETURN_IF_ERROR(CheckCommonOptions(options));
  if (options.kind != "torchscript" && (!options.trainable.empty() || !options.frozen.empty())) {
    return InvalidArgument("--trainable / --frozen need --model torchscript: the built-in " +
                           options.kind +
                           " model has no frozen part (export a backbone + head to TorchScript, "
                           "docs/frozen.md)");
  }
  if (options.torch_threads < 1) {
    return InvalidArgument("torch_threads must be >= 1, got " +
                           std::to_string(options.torch_threads));
  }
  ONLINEPS_ASSIGN_OR_RETURN(std::string device, CanonicalDevice(options.device));
  ModelOptions canonical = options;
  canonical.device = device;
  // Process-wide in libtorch: the last model created sets it for all of them.
  torch::set_num_threads(options.torch_threads);
  return factory(canonical);
}

}  // namespace

StatusOr<std::unique_ptr<Model>> CreateModel(const ModelOptions& options) {
  try {
    return CreateModelOrThrow(options);
  } catch (const std::exception& e) {
    return Internal(std::string("creating model: ") + e.what());
  }
}

std::vector<ParamInfo> DenseLayerParams(const std::string& prefix, uint32_t in,
                                        const std::vector<uint32_t>& hidden, uint32_t out) {
  std::vector<ParamInfo> params;
  auto add_layer = [&](const std::string& name, uint32_t fan_in, uint32_t fan_out) {
    ParamInfo weight{prefix + name + ".weight",
                     ParamKind::kDense,
                     {fan_out, fan_in},
                     "normal",
                     1.0 / std::sqrt(static_cast<double>(fan_in))};
    ParamInfo bias{prefix + name + ".bias", ParamKind::kDense, {fan_out}, "zeros", 0.0};
    params.push_back(std::move(weight));
    params.push_back(std::move(bias));
  };
  for (size_t i = 0; i < hidden.size(); ++i) {
    add_layer("fc" + std::to_string(i), in, hidden[i]);
    in = hidden[i];
  }
  add_layer("out", in, out);
  return params;
}

Status CheckParamView(const std::vector<ParamInfo>& infos, const ParamView& view) {
  if (view.dense.size() != infos.size() || view.sparse.size() != infos.size()) {
    return InvalidArgument("param view has " + std::to_string(view.dense.size()) + " dense and " +
                           std::to_string(view.sparse.size()) + " sparse entries, model has " +
                           std::to_string(infos.size()) + " params");
  }
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& info = infos[i];
    if (info.kind == ParamKind::kDense) {
      if (view.dense[i] == nullptr) return InvalidArgument("param view lacks " + info.name);
      continue;
    }
    const SparseRows* rows = view.sparse[i];
    if (rows == nullptr) return InvalidArgument("param view lacks " + info.name);
    if (rows->values.size() != rows->keys.size() * info.size()) {
      return InvalidArgument("param view: " + info.name + " has " +
                             std::to_string(rows->values.size()) + " values for " +
                             std::to_string(rows->keys.size()) + " rows of " +
                             std::to_string(info.size()));
    }
  }
  return Status::Ok();
}

Status CheckLabels(const std::vector<Example>& batch, size_t num_labels) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t label = batch[i].label;
    if (label < 0 || static_cast<uint64_t>(label) >= num_labels) {
      return InvalidArgument("example " + std::to_string(i) + ": label " + std::to_string(label) +
                             " not in [0, " + std::to_string(num_labels) + ")");
    }
  }
  return Status::Ok();
}

Status CheckCommonOptions(const ModelOptions& options) {
  if (options.labels.empty()) return InvalidArgument("model needs at least one label");
  // A learn naming a label teaches its first index: a second one would never learn by name.
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < options.labels.size(); ++i) {
    const auto [it, fresh] = index.emplace(options.labels[i], i);
    if (!fresh) {
      return InvalidArgument("label '" + options.labels[i] + "' is given twice (indices " +
                             std::to_string(it->second) + " and " + std::to_string(i) + ")");
    }
  }
  for (uint32_t width : options.hidden) {
    if (width == 0) return InvalidArgument("hidden layer widths must be > 0");
  }
  return Status::Ok();
}

}  // namespace onlineps::worker
