// CallGate: runs the calls of one key (an MCP session) one at a time, in the order they
// arrived. A Ticket waits for its turn on construction (blocking) and hands the turn on
// when destroyed, whatever the call did. Keys with no waiting call hold no memory.
// Thread-safe; the gate must outlive its tickets.
#ifndef ONLINEPS_MCP_BRIDGE_CALL_GATE_H_
#define ONLINEPS_MCP_BRIDGE_CALL_GATE_H_

#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/mutex.h"

namespace onlineps::bridge {

class CallGate {
 public:
  class Ticket {
   public:
    Ticket(CallGate* gate, std::string key);  // blocks until this call's turn
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

   private:
    CallGate* const gate_;
    const std::string key_;
  };

  size_t keys() const;  // keys with a call running or waiting

 private:
  struct Queue {  // FIFO order of one key's calls
    uint64_t next = 0, serving = 0;
    int users = 0;
  };

  mutable Mutex mu_;
  CondVar cv_;
  std::unordered_map<std::string, Queue> queues_ GUARDED_BY(mu_);  // erased when unused
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_CALL_GATE_H_
