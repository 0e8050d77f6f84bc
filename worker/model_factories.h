// Factories of the three libtorch models, one per torch translation unit, and the
// torch-free helpers they share. Only model_factory.cc (CreateModel) and the model .cc
// files include this; everyone else goes through CreateModel in worker/model.h.
#ifndef ONLINEPS_WORKER_MODEL_FACTORIES_H_
#define ONLINEPS_WORKER_MODEL_FACTORIES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model.h"

namespace onlineps::worker {

// Each REQUIRES: options.device already canonical ("cpu" or "cuda:N" with that GPU
// present; CreateModel checks). Errors: kInvalidArgument for a bad option or file.
StatusOr<std::unique_ptr<Model>> NewTextModel(const ModelOptions& options);
StatusOr<std::unique_ptr<Model>> NewMlpModel(const ModelOptions& options);
StatusOr<std::unique_ptr<Model>> NewTorchScriptModel(const ModelOptions& options);

// Dense layers in -> hidden... -> out as ParamInfos "<prefix>fc<i>.weight/.bias", then
// "<prefix>out.weight/.bias"; weights [out, in] ~ normal(1/sqrt(in)), biases zeros.
std::vector<ParamInfo> DenseLayerParams(const std::string& prefix, uint32_t in,
                                        const std::vector<uint32_t>& hidden, uint32_t out);

// Checks that `view` fits `infos`: a non-null pointer of the right kind per param, and
// sparse rows with whole rows of their dim. Errors: kInvalidArgument.
Status CheckParamView(const std::vector<ParamInfo>& infos, const ParamView& view);

// Checks every label is in [0, num_labels). Errors: kInvalidArgument naming the example.
Status CheckLabels(const std::vector<Example>& batch, size_t num_labels);

// Checks the options every model shares (labels, hidden widths). Errors: kInvalidArgument.
Status CheckCommonOptions(const ModelOptions& options);

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_MODEL_FACTORIES_H_
