#include "worker/torch_common.h"

namespace onlineps::worker {

std::string TorchMessage(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  const std::string s = error != nullptr ? error->what_without_backtrace() : e.what();
  // Most errors say it on their first line. The TorchScript interpreter's first line is
  // only "The following operation failed ...": the cause is the last "...Error: " line
  // after its traceback (e.g. "RuntimeError: mat1 and mat2 shapes cannot be multiplied").
  std::string cause;
  for (size_t at = 0; at < s.size();) {
    const size_t end = std::min(s.find('\n', at), s.size());
    const std::string line = s.substr(at, end - at);
    const size_t colon = line.find("Error: ");
    if (colon != std::string::npos && colon > 0 &&
        line.find_first_of(" \t") > colon) {  // "<Name>Error: ...", not indented code
      cause = line;
    }
    at = end + 1;
  }
  std::string out = s.substr(0, s.find('\n'));
  if (!cause.empty() && out.find("TorchScript interpreter") != std::string::npos) out = cause;
  constexpr size_t kMax = 1000;
  if (out.size() > kMax) out = out.substr(0, kMax) + "...";
  return out;
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
