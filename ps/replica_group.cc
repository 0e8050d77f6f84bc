#include "ps/replica_group.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

namespace onlineps::ps {

namespace {

using nlohmann::json;

uint64_t JsonU64(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_unsigned()) return 0;
  return j[key].get<uint64_t>();
}

// The leader key's create revision for `epoch` under `base`; UINT64_MAX, which no key
// has, when the epoch is below the base (of another base: the compare then fails).
uint64_t Revision(uint64_t epoch, uint64_t base) {
  return epoch > base ? epoch - base : UINT64_MAX;
}

}  // namespace

uint64_t NewIncarnation() {
  std::random_device rd;
  const uint64_t r =
      (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return r == 0 ? 1 : r;
}

std::string IncarnationHex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t ParseIncarnation(const std::string& s) {
  if (s.empty() || s.size() > 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return 0;
  }
  return std::stoull(s, nullptr, 16);
}

GroupView ReplicaGroup::Parse(const std::vector<KvEntry>& entries,
                              std::vector<std::string>* skipped) const {
  GroupView v;
  const std::string members_prefix = prefix_ + "members/";
  for (const KvEntry& e : entries) {
    if (e.key.compare(0, prefix_.size(), prefix_) != 0) continue;
    json j = json::parse(e.value, nullptr, /*allow_exceptions=*/false);
    try {
      if (!j.is_object()) throw std::invalid_argument("not a JSON object");
      if (e.key == leader_key()) {
        v.has_leader = true;
        v.leader.index = static_cast<uint32_t>(JsonU64(j, "index"));
        v.leader.incarnation = ParseIncarnation(j.value("incarnation", std::string()));
        v.leader.epoch = e.create_revision;  // plus the base, once it is read (below)
        v.leader.lease = e.lease;
      } else if (e.key == epoch_base_key()) {
        if (!j.contains("base") || !j["base"].is_number_unsigned()) {
          throw std::invalid_argument("no base");
        }
        v.epoch_base = j["base"].get<uint64_t>();
      } else if (e.key == isr_key()) {
        v.has_isr = true;
        v.isr_epoch = JsonU64(j, "epoch");
        v.isr_mod_revision = e.mod_revision;
        for (const json& m : j.value("members", json::array())) {
          v.isr.push_back(GroupMember{static_cast<uint32_t>(JsonU64(m, "index")),
                                      ParseIncarnation(m.value("incarnation", std::string()))});
        }
      } else if (e.key.compare(0, members_prefix.size(), members_prefix) == 0) {
        const std::string idx = e.key.substr(members_prefix.size());
        if (idx.empty() || idx.size() > 5 ||
            idx.find_first_not_of("0123456789") != std::string::npos) {
          throw std::invalid_argument("not members/<index>");
        }
        GroupRegistration reg;
        reg.incarnation = ParseIncarnation(j.value("incarnation", std::string()));
        reg.log_epoch = JsonU64(j, "log_epoch");
        reg.lsn = JsonU64(j, "lsn");
        reg.need = j.value("need", false);
        reg.data = j.value("data", false);
        reg.mod_revision = e.mod_revision;
        reg.epoch = JsonU64(j, "epoch");
        v.members[static_cast<uint32_t>(std::stoul(idx))] = reg;
      }
    } catch (const std::exception&) {
      if (skipped) skipped->push_back(e.key);
    }
  }
  if (v.has_leader) v.leader.epoch += v.epoch_base;  // the leader key's revision under the base
  return v;
}

KvTxn ReplicaGroup::Register(uint32_t index, const std::string& endpoint,
                             const GroupRegistration& r, uint64_t lease) const {
  json value = {{"incarnation", IncarnationHex(r.incarnation)},
                {"endpoint", endpoint},
                {"log_epoch", r.log_epoch},
                {"lsn", r.lsn},
                {"need", r.need},
                {"data", r.data},
                {"epoch", r.epoch}};
  KvTxn txn;
  txn.puts.push_back({prefix_ + "members/" + std::to_string(index), value.dump(), lease});
  return txn;
}

KvTxn ReplicaGroup::Campaign(const GroupView& seen, const GroupMember& me,
                             const std::string& endpoint, uint64_t lease, uint64_t new_base) const {
  json value = {
      {"index", me.index}, {"incarnation", IncarnationHex(me.incarnation)}, {"endpoint", endpoint}};
  KvTxn txn;
  txn.compares.push_back({leader_key(), KvTxn::Compare::Target::kCreateRevision, 0});
  if (seen.has_isr) {
    txn.compares.push_back(
        {isr_key(), KvTxn::Compare::Target::kModRevision, seen.isr_mod_revision});
  } else {
    txn.compares.push_back({isr_key(), KvTxn::Compare::Target::kCreateRevision, 0});
    txn.puts.push_back({epoch_base_key(), json{{"base", new_base}}.dump(), 0});
  }
  txn.puts.push_back({leader_key(), value.dump(), lease});
  txn.read_prefix = prefix_;
  return txn;
}

KvTxn ReplicaGroup::WriteIsr(uint64_t epoch, uint64_t base, bool isr_absent,
                             uint64_t isr_mod_revision,
                             const std::vector<GroupMember>& members) const {
  json list = json::array();
  for (const GroupMember& m : members) {
    list.push_back({{"index", m.index}, {"incarnation", IncarnationHex(m.incarnation)}});
  }
  KvTxn txn;
  txn.compares.push_back(
      {leader_key(), KvTxn::Compare::Target::kCreateRevision, Revision(epoch, base)});
  if (isr_absent) {
    txn.compares.push_back({isr_key(), KvTxn::Compare::Target::kCreateRevision, 0});
  } else {
    txn.compares.push_back({isr_key(), KvTxn::Compare::Target::kModRevision, isr_mod_revision});
  }
  txn.puts.push_back({isr_key(), json{{"epoch", epoch}, {"members", list}}.dump(), 0});
  txn.read_prefix = prefix_;
  return txn;
}

KvTxn ReplicaGroup::RemoveLeader(uint64_t epoch, uint64_t base) const {
  KvTxn txn;
  txn.compares.push_back(
      {leader_key(), KvTxn::Compare::Target::kCreateRevision, Revision(epoch, base)});
  txn.deletes.push_back(leader_key());
  return txn;
}

}  // namespace onlineps::ps
