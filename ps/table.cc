#include "ps/table.h"

#include "common/partition.h"
#include "ps/dense_table.h"
#include "ps/rule_set.h"
#include "ps/sparse_table.h"

namespace onlineps::ps {

StatusOr<std::unique_ptr<Table>> Table::Create(const TableSpec& spec, uint32_t shard,
                                               uint32_t num_shards) {
  auto rules = RuleSet::Create(spec);
  if (!rules.ok()) return rules.status().WithContext("table '" + spec.name + "'");
  if (spec.kind == TableKind::kDense) {
    return std::unique_ptr<Table>(
        std::make_unique<DenseTable>(spec, std::move(rules).value(), shard, num_shards));
  }
  return std::unique_ptr<Table>(std::make_unique<SparseTable>(spec, std::move(rules).value()));
}

StatusOr<uint64_t> Table::InitialBytes(const TableSpec& spec, uint32_t shard, uint32_t num_shards) {
  if (spec.kind != TableKind::kDense) return 0;
  auto rules = RuleSet::Create(spec);
  if (!rules.ok()) return rules.status().WithContext("table '" + spec.name + "'");
  // DenseTable's vectors: weights, optimizer and policy slots, Polyak average, sum.
  const uint64_t n = DenseLayout(spec.name, spec.size(), num_shards).ElemsOf(shard);
  const uint64_t copies = 1 + rules->optimizer_slots() + rules->policy_slots() +
                          (spec.polyak ? 1 : 0) + (spec.accumulate > 1 ? 1 : 0);
  return n * copies * sizeof(float);  // n <= 2^36: no overflow
}

}  // namespace onlineps::ps

namespace onlineps::ps {
namespace {

// The state serialized at BeginSnapshot: a pause as long as the table's Save.
class SavedSnapshot final : public TableSnapshot {
 public:
  explicit SavedSnapshot(const Table& t) { t.Save(&bytes_); }
  void Write(ByteWriter* w) override { w->Append(bytes_.buffer().data(), bytes_.buffer().size()); }

 private:
  ByteWriter bytes_;
};

}  // namespace

std::unique_ptr<TableSnapshot> Table::BeginSnapshot(SnapshotKind) {
  return std::make_unique<SavedSnapshot>(*this);
}

}  // namespace onlineps::ps
