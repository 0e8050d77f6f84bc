#include "common/partition.h"

#include <algorithm>

namespace onlineps {

DenseLayout::DenseLayout(std::string_view table, uint64_t total, uint32_t num_shards,
                         uint64_t slice_elems)
    : total_(total), num_shards_(std::max<uint32_t>(num_shards, 1)) {
  by_shard_.resize(num_shards_);
  elems_.assign(num_shards_, 0);
  if (total_ == 0) return;
  slice_elems = std::max<uint64_t>(slice_elems, 1);
  // At least num_shards slices, each at most slice_elems, all of near-equal length.
  uint64_t num_slices = (total_ + slice_elems - 1) / slice_elems;
  num_slices = std::min<uint64_t>(std::max<uint64_t>(num_slices, num_shards_), total_);
  const uint64_t base = total_ / num_slices, extra = total_ % num_slices;
  const uint32_t start = static_cast<uint32_t>(HashString(table) % num_shards_);
  uint64_t offset = 0;
  for (uint64_t i = 0; i < num_slices; ++i) {
    DenseSlice s;
    s.offset = offset;
    s.length = base + (i < extra ? 1 : 0);
    s.shard = static_cast<uint32_t>((start + i) % num_shards_);
    offset += s.length;
    slices_.push_back(s);
    by_shard_[s.shard].push_back(s);
    elems_[s.shard] += s.length;
  }
}

}  // namespace onlineps
