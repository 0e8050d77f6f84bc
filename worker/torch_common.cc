#include "worker/torch_common.h"

namespace onlineps::worker {

std::string TorchMessage(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  const std::string s = error != nullptr ? error->what_without_backtrace() : e.what();
  return s.substr(0, s.find('\n'));
}

torch::Tensor ParamTensor(const float* data, at::IntArrayRef shape, const torch::Device& device,
                          bool grad) {
  torch::Tensor t = torch::from_blob(const_cast<float*>(data), shape, torch::kFloat32);
  if (!device.is_cpu()) t = t.to(device);
  return grad ? t.detach().requires_grad_() : t;
}

std::vector<float> ToVector(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kCPU, torch::kFloat32).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

InferOutput ToInferOutput(const torch::Tensor& logits) {
  torch::Tensor probs = torch::softmax(logits, 1).to(torch::kCPU).contiguous();
  torch::Tensor argmax = logits.argmax(1).to(torch::kCPU);
  InferOutput out;
  const int64_t n = probs.size(0), c = probs.size(1);
  for (int64_t i = 0; i < n; ++i) {
    const float* p = probs.data_ptr<float>() + i * c;
    out.scores.emplace_back(p, p + c);
    out.predicted.push_back(argmax[i].item<int64_t>());
  }
  return out;
}

}  // namespace onlineps::worker
