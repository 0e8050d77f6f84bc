#include "mcp_bridge/call_gate.h"

#include <spdlog/spdlog.h>

#include <exception>
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
  // The turns handed on from this thread while it runs one: a turn whose call ends at
  // once (a refusal) leaves from inside the Leave that started it, and a long queue of
  // those must not grow the stack, so the outermost Leave runs them one after the other.
  thread_local std::deque<std::function<void()>>* t_handed = nullptr;
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
  if (t_handed) {
    t_handed->push_back(std::move(next));
    return;
  }
  std::deque<std::function<void()>> handed;
  handed.push_back(std::move(next));
  t_handed = &handed;
  while (!handed.empty()) {
    std::function<void()> turn = std::move(handed.front());
    handed.pop_front();
    try {
      turn();
    } catch (const std::exception& e) {  // the turns after it still run
      spdlog::error("call gate: a call's turn threw: {}", e.what());
    }
  }
  t_handed = nullptr;
}

size_t CallGate::keys() const {
  MutexLock lock(&mu_);
  return queues_.size();
}

}  // namespace onlineps::bridge
