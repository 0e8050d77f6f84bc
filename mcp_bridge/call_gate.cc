#include "mcp_bridge/call_gate.h"

#include <utility>

namespace onlineps::bridge {

CallGate::Ticket::Ticket(CallGate* gate, std::string key) : gate_(gate), key_(std::move(key)) {
  MutexLock lock(&gate_->mu_);
  Queue& q = gate_->queues_[key_];
  ++q.users;
  const uint64_t ticket = q.next++;
  // `q` stays valid while waiting: the entry is erased only when its users reach 0.
  gate_->cv_.Wait(&gate_->mu_, [&]() REQUIRES(gate_->mu_) { return q.serving == ticket; });
}

CallGate::Ticket::~Ticket() {
  {
    MutexLock lock(&gate_->mu_);
    Queue& q = gate_->queues_[key_];
    ++q.serving;
    if (--q.users == 0) gate_->queues_.erase(key_);
  }
  gate_->cv_.SignalAll();
}

size_t CallGate::keys() const {
  MutexLock lock(&mu_);
  return queues_.size();
}

}  // namespace onlineps::bridge
