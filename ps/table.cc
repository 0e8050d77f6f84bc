#include "ps/table.h"

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
