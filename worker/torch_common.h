// Helpers shared by the three torch translation units (text, mlp, torchscript models).
// INTERNAL: this is the one header that includes torch. Only those .cc files include
// it, and they are compiled with the torch precompiled header anyway, so it adds no
// compile time; no other header and no file outside onlineps_worker_models may include
// it (the rest of the worker, the tests and the bridge stay torch-free).
#ifndef ONLINEPS_WORKER_TORCH_COMMON_H_
#define ONLINEPS_WORKER_TORCH_COMMON_H_

#include <torch/torch.h>

#include <exception>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model.h"

namespace onlineps::worker {

// The first line of a torch exception's message, without its C++ backtrace.
std::string TorchMessage(const std::exception& e);

// Turns every exception of `fn` into kInternal: inputs are checked before any torch
// call, so what throws is a bug or resource exhaustion, not the caller's data; errors
// that are the caller's fault are caught closer to their source.
template <typename Fn>
auto Guarded(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Internal(std::string(what) + ": " + TorchMessage(e));
  }
}

// A tensor over caller-owned floats, without a copy on CPU. Autograd only reads a leaf's
// data, so a requires_grad leaf never writes to the caller's memory.
torch::Tensor ParamTensor(const float* data, at::IntArrayRef shape, const torch::Device& device,
                          bool grad);

// A CPU float copy of `t`.
std::vector<float> ToVector(const torch::Tensor& t);

// Softmax scores and argmax per row of `logits` [batch, labels].
InferOutput ToInferOutput(const torch::Tensor& logits);

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_TORCH_COMMON_H_
