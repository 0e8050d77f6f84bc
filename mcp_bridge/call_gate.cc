#include "mcp_bridge/call_gate.h"

#include <utility>

#include "common/await.h"

namespace onlineps::bridge {

void CallGate::EnterAndWait(const std::string& key) {
  Await<bool>([&](std::function<void(bool)> ready) {
    Enter(key, [ready = std::move(ready)] { ready(true); });
  });
}

void CallGate::Enter(const std::string& key, std::function<void()> turn) {
  {
    MutexLock lock(&mu_);
    auto [it, first] = queues_.try_emplace(key);
    if (!first) {
      it->second.waiting.push_back(std::move(turn));
      return;
    }
  }
  turn();  // nothing ran or waited: the entry just made marks this call as running
}

void CallGate::Leave(const std::string& key) {
  std::function<void()> next;
  {
    MutexLock lock(&mu_);
    auto it = queues_.find(key);
    if (it == queues_.end()) return;  // a Leave without its Enter: nothing to hand on
    if (it->second.waiting.empty()) {
      queues_.erase(it);
      return;
    }
    next = std::move(it->second.waiting.front());
    it->second.waiting.pop_front();
  }
  next();
}

size_t CallGate::keys() const {
  MutexLock lock(&mu_);
  return queues_.size();
}

}  // namespace onlineps::bridge
