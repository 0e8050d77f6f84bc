// RequestIdPool: request ids for a long-running client. An id is (generation << 16 |
// slot) with at most 65536 slots in flight; a slot's generation advances (mod 2^16,
// skipping 0) every time the slot is reused, so ids are recycled and never overflow,
// and a late reply to a recycled slot does not match the new request (its generation
// differs). Slots are reused least recently freed first, so an id comes round again only
// after about 65,536 x 65,535 others (last freed first, a caller that makes one call at a
// time would reuse one slot, and its ids, every 65,535 calls: a reply a few seconds late
// was taken as another call's answer). Id 0 is never issued. Not thread-safe: the owner
// locks.
#ifndef ONLINEPS_COMMON_REQUEST_IDS_H_
#define ONLINEPS_COMMON_REQUEST_IDS_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace onlineps {

class RequestIdPool {
 public:
  static constexpr uint32_t kMaxSlots = 1u << 16;

  explicit RequestIdPool(uint32_t slots = kMaxSlots)
      : generation_(slots > kMaxSlots ? kMaxSlots : slots, 0) {
    for (uint32_t i = 0; i < generation_.size(); ++i) free_.push_back(i);
  }

  // A fresh id, or nullopt when every slot is in flight (the caller reports
  // RESOURCE_EXHAUSTED).
  std::optional<uint32_t> Acquire() {
    if (free_.empty()) return std::nullopt;
    const uint32_t slot = free_.front();  // least recently freed: a slot's generation comes
    free_.pop_front();                    // round again only after every slot was reused
    uint16_t& g = generation_[slot];
    g = static_cast<uint16_t>(g + 1);
    if (g == 0) g = 1;
    return (uint32_t{g} << 16) | slot;
  }

  // Slot of a live id; nullopt for an id not issued or already released.
  std::optional<uint32_t> SlotOf(uint32_t id) const {
    const uint32_t slot = id & 0xffff;
    if (slot >= generation_.size() || (id >> 16) != generation_[slot] || (id >> 16) == 0) {
      return std::nullopt;
    }
    return slot;
  }

  void Release(uint32_t id) {
    if (auto slot = SlotOf(id)) {
      // Bump the generation now so a late reply to this id no longer matches.
      uint16_t& g = generation_[*slot];
      g = static_cast<uint16_t>(g + 1);
      if (g == 0) g = 1;
      free_.push_back(*slot);
    }
  }

  // Releases the id that holds `slot`, which must be in flight.
  void ReleaseSlot(uint32_t slot) {
    if (slot < generation_.size()) Release((uint32_t{generation_[slot]} << 16) | slot);
  }

  size_t in_flight() const { return generation_.size() - free_.size(); }
  size_t capacity() const { return generation_.size(); }

 private:
  std::vector<uint16_t> generation_;
  std::deque<uint32_t> free_;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_REQUEST_IDS_H_
