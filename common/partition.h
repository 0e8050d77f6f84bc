// Key and tensor partitioning over N shards.
// Sparse keys: shard = fastrange(mix64(key), N): every uint64 key, 0 and 2^64-1
// included, lands on exactly one shard in [0, N), spread uniformly even for sequential
// ids. Dense tensors: cut into slices of at most slice_elems floats; slice i goes to
// shard (i + table_offset) % N, so a tensor with at least N slices touches every shard.
// Pure functions; thread-safe. Mix64 and HashString come from common/hash.h.
#ifndef ONLINEPS_COMMON_PARTITION_H_
#define ONLINEPS_COMMON_PARTITION_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/hash.h"

namespace onlineps {

// Shard of a sparse key. REQUIRES: num_shards >= 1.
inline uint32_t ShardOfKey(uint64_t key, uint32_t num_shards) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(Mix64(key)) * num_shards) >> 64);
}

// One contiguous piece of a dense tensor.
struct DenseSlice {
  uint64_t offset = 0;  // first element in the flattened tensor
  uint64_t length = 0;  // elements
  uint32_t shard = 0;
};

// Layout of a dense tensor of `total` elements over `num_shards` shards.
class DenseLayout {
 public:
  // slice_elems: most elements per slice (default 256 Ki floats = 1 MiB). A tensor
  // smaller than num_shards * slice_elems is cut into num_shards near-equal slices
  // (at least 1 element each) so it still spreads over every shard.
  DenseLayout(std::string_view table, uint64_t total, uint32_t num_shards,
              uint64_t slice_elems = kDefaultSliceElems);

  static constexpr uint64_t kDefaultSliceElems = 256 * 1024;

  uint64_t total() const { return total_; }
  uint32_t num_shards() const { return num_shards_; }
  const std::vector<DenseSlice>& slices() const { return slices_; }
  // Slices held by `shard`, in tensor order. A shard stores them concatenated.
  const std::vector<DenseSlice>& SlicesOf(uint32_t shard) const { return by_shard_[shard]; }
  // Elements held by `shard` (sum of its slice lengths).
  uint64_t ElemsOf(uint32_t shard) const { return elems_[shard]; }

 private:
  uint64_t total_;
  uint32_t num_shards_;
  std::vector<DenseSlice> slices_;
  std::vector<std::vector<DenseSlice>> by_shard_;
  std::vector<uint64_t> elems_;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_PARTITION_H_
