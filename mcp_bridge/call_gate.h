// CallGate: runs the calls of one key (an MCP session) one at a time, in the order they
// arrived. A call enters with the continuation that runs it once its turn comes (or
// waits for its turn, blocking), and leaves when it is done, which hands the turn to the
// next. Keys with no running or waiting call hold no memory. Thread-safe; the gate must
// outlive its calls.
#ifndef ONLINEPS_MCP_BRIDGE_CALL_GATE_H_
#define ONLINEPS_MCP_BRIDGE_CALL_GATE_H_

#include <deque>
#include <functional>
#include <string>
#include <unordered_map>

#include "common/mutex.h"

namespace onlineps::bridge {

class CallGate {
 public:
  // Runs `turn` when the key's earlier calls are done: at once on this thread when none
  // is running or waiting, else on the thread whose Leave hands it the turn. The call
  // must Leave(key) exactly once after its turn came.
  void Enter(const std::string& key, std::function<void()> turn);
  // As Enter, blocking this thread until the call's turn; the call must Leave(key).
  void EnterAndWait(const std::string& key);
  void Leave(const std::string& key);

  size_t keys() const;  // keys with a call running or waiting

 private:
  struct Queue {  // one key's waiting calls, in arrival order, behind the running one
    std::deque<std::function<void()>> waiting;
  };

  mutable Mutex mu_;
  std::unordered_map<std::string, Queue> queues_ GUARDED_BY(mu_);  // erased when unused
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_CALL_GATE_H_
