#include "replay/batches.h"

#include <algorithm>
#include <numeric>

#include "replay/rng.h"

namespace onlineps::replay {

worker::Example ExampleOf(const Dataset& d, bool test, size_t i) {
  worker::Example e;
  if (d.sparse) {
    const std::vector<size_t>& off = test ? d.test_offsets : d.train_offsets;
    const std::vector<uint64_t>& keys = test ? d.test_keys : d.train_keys;
    const std::vector<float>& values = test ? d.test_values : d.train_values;
    e.sparse_keys.assign(keys.begin() + static_cast<ptrdiff_t>(off[i]),
                         keys.begin() + static_cast<ptrdiff_t>(off[i + 1]));
    e.sparse_values.assign(values.begin() + static_cast<ptrdiff_t>(off[i]),
                           values.begin() + static_cast<ptrdiff_t>(off[i + 1]));
  } else if (d.dim > 0) {
    const std::vector<float>& x = test ? d.test_x : d.train_x;
    e.features.assign(x.begin() + static_cast<ptrdiff_t>(i * d.dim),
                      x.begin() + static_cast<ptrdiff_t>((i + 1) * d.dim));
  } else {
    e.text = test ? d.test_text[i] : d.train_text[i];
  }
  e.label = test ? d.test_y[i] : d.train_y[i];
  return e;
}

DatasetBatches::DatasetBatches(const Dataset* data, uint32_t batch, uint64_t seed, bool shuffle,
                               size_t test_rows)
    : data_(data), batch_(std::max<uint32_t>(batch, 1)), seed_(seed), shuffle_(shuffle) {
  const size_t n = test_rows ? std::min(test_rows, data->test_size()) : data->test_size();
  test_.reserve(n);
  for (size_t i = 0; i < n; ++i) test_.push_back(ExampleOf(*data, true, i));
}

uint64_t DatasetBatches::BatchesPerEpoch() const {
  return (data_->train_size() + batch_ - 1) / batch_;
}

// Fisher-Yates with our own generator: the same permutation on every standard library.
const std::vector<uint32_t>& DatasetBatches::Permutation(uint64_t epoch) {
  auto it = perms_.find(epoch);
  if (it != perms_.end()) return it->second;
  std::vector<uint32_t> p(data_->train_size());
  std::iota(p.begin(), p.end(), 0u);
  if (shuffle_) {
    Rng rng(seed_ * 0x9e3779b97f4a7c15ULL + epoch);
    for (size_t i = p.size(); i > 1; --i) std::swap(p[i - 1], p[rng.Below(i)]);
  }
  while (perms_.size() >= 2) perms_.erase(perms_.begin());
  return perms_[epoch] = std::move(p);
}

StatusOr<std::vector<worker::Example>> DatasetBatches::Batch(uint64_t batch) {
  const uint64_t n = data_->train_size();
  if (n == 0 && data_->name.empty()) {
    // --dataset none: a model that reads no input (quadratic) gets empty examples.
    std::vector<worker::Example> none(batch_);
    for (worker::Example& e : none) e.label = 0;
    return none;
  }
  if (n == 0) return FailedPrecondition("dataset '" + data_->name + "' has no training rows");
  std::vector<worker::Example> out;
  out.reserve(batch_);
  for (uint64_t j = 0; j < batch_; ++j) {
    const uint64_t at = batch * batch_ + j;
    out.push_back(ExampleOf(*data_, false, Permutation(at / n)[at % n]));
  }
  return out;
}

nlohmann::json DatasetBatches::Ref(uint64_t batch) const {
  return {{"split", "train"}, {"offset", batch * batch_}, {"count", batch_}, {"seed", seed_}};
}

}  // namespace onlineps::replay
