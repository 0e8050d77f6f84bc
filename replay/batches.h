// BatchSource implementations: fixed-size batches of a Dataset, reshuffled every epoch
// by a seeded permutation (batch k is the same examples in every run with that seed).
// Not thread-safe.
#ifndef ONLINEPS_REPLAY_BATCHES_H_
#define ONLINEPS_REPLAY_BATCHES_H_

#include <cstdint>
#include <map>
#include <vector>

#include "replay/dataset.h"
#include "replay/replayer.h"

namespace onlineps::replay {

// Turns row i of a split into an Example (features or text, and the label).
worker::Example ExampleOf(const Dataset& d, bool test, size_t i);

class DatasetBatches : public BatchSource {
 public:
  // REQUIRES: `data` outlives this object and has at least one training example.
  // shuffle = false keeps the file order (the online / progressive setting).
  DatasetBatches(const Dataset* data, uint32_t batch, uint64_t seed, bool shuffle,
                 size_t test_rows = 0);
  StatusOr<std::vector<worker::Example>> Batch(uint64_t batch) override;
  const std::vector<worker::Example>& Test() const override { return test_; }
  nlohmann::json Ref(uint64_t batch) const override;
  uint64_t BatchesPerEpoch() const;

 private:
  const std::vector<uint32_t>& Permutation(uint64_t epoch);

  const Dataset* const data_;
  const uint32_t batch_;
  const uint64_t seed_;
  const bool shuffle_;
  std::vector<worker::Example> test_;
  std::map<uint64_t, std::vector<uint32_t>> perms_;  // the last two epochs used
};

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_BATCHES_H_
