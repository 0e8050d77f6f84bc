#include "tests/ps/sim_etcd.h"

namespace onlineps::sim {

const KvEntry* SimEtcd::Get(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

void SimEtcd::DeleteKey(const std::string& key) {
  auto it = kv_.find(key);
  if (it == kv_.end()) return;
  if (it->second.lease != 0) {
    auto l = leases_.find(it->second.lease);
    if (l != leases_.end()) l->second.keys.erase(key);
  }
  kv_.erase(it);
}

void SimEtcd::RevokeLease(uint64_t id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return;
  std::set<std::string> keys = it->second.keys;
  leases_.erase(it);
  if (keys.empty()) return;
  ++revision_;  // one revision for the whole revocation, as etcd does
  for (const std::string& k : keys) kv_.erase(k);
}

void SimEtcd::Expire(uint64_t now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, l] : leases_)
    if (l.expiry_ms <= now) expired.push_back(id);
  for (uint64_t id : expired) RevokeLease(id);
}

std::vector<KvEntry> SimEtcd::RangeOf(const std::string& prefix) const {
  std::vector<KvEntry> out;
  for (auto it = kv_.lower_bound(prefix); it != kv_.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    out.push_back(it->second);
  }
  return out;
}

KvResult SimEtcd::Do(uint64_t now, const ps::KvCall& call) {
  Expire(now);
  KvResult r;
  switch (call.kind) {
    case ps::KvCall::Kind::kGrant: {
      const uint64_t id = next_lease_++;
      leases_[id] = Lease{call.ttl_s, now + static_cast<uint64_t>(call.ttl_s) * 1000, {}};
      r.lease = id;
      r.ttl_s = call.ttl_s;
      break;
    }
    case ps::KvCall::Kind::kKeepAlive: {
      auto it = leases_.find(call.lease);
      if (it != leases_.end()) {
        it->second.expiry_ms = now + static_cast<uint64_t>(it->second.ttl_s) * 1000;
        r.lease = call.lease;
        r.ttl_s = it->second.ttl_s;
      }
      break;
    }
    case ps::KvCall::Kind::kRevoke:
      RevokeLease(call.lease);
      break;
    case ps::KvCall::Kind::kRange:
      r.entries = RangeOf(call.prefix);
      break;
    case ps::KvCall::Kind::kTxn: {
      bool ok = true;
      for (const auto& c : call.txn.compares) {
        const KvEntry* e = Get(c.key);
        const uint64_t have =
            e == nullptr ? 0
                         : (c.target == KvTxn::Compare::Target::kCreateRevision ? e->create_revision
                                                                                : e->mod_revision);
        if (have != c.revision) ok = false;
      }
      for (const auto& p : call.txn.puts) {
        if (ok && p.lease != 0 && !leases_.count(p.lease)) {
          r.status = NotFound("etcdserver: requested lease not found");
          return r;
        }
      }
      r.succeeded = ok;
      if (ok && (!call.txn.puts.empty() || !call.txn.deletes.empty())) {
        ++revision_;
        for (const std::string& d : call.txn.deletes) DeleteKey(d);
        for (const auto& p : call.txn.puts) {
          auto it = kv_.find(p.key);
          KvEntry e;
          e.key = p.key;
          e.value = p.value;
          e.create_revision = it == kv_.end() ? revision_ : it->second.create_revision;
          e.mod_revision = revision_;
          e.lease = p.lease;
          if (it != kv_.end() && it->second.lease != 0 && it->second.lease != p.lease) {
            auto l = leases_.find(it->second.lease);
            if (l != leases_.end()) l->second.keys.erase(p.key);
          }
          kv_[p.key] = e;
          if (p.lease != 0) leases_[p.lease].keys.insert(p.key);
        }
      }
      if (!call.txn.read_prefix.empty()) r.entries = RangeOf(call.txn.read_prefix);
      break;
    }
  }
  r.revision = revision_;
  return r;
}

}  // namespace onlineps::sim
