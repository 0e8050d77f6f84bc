// FaultyClientTransport: wraps a real client transport and drops, duplicates, delays
// and reorders messages in both directions at the rates of TransportOptions::faults.
// NewClientTransport wraps in it when faults.enabled(); tests use it to check that the
// retry and dedup paths keep every push exactly once over a lossy network.
//
// Every message, either way, goes through one delivery thread in order of its due time
// (FIFO among equal times), so the caller's Handler is still called from one thread.
// Held messages are bounded by faults.max_held; Close() discards what is still held.
#ifndef ONLINEPS_COMMON_FAULT_TRANSPORT_H_
#define ONLINEPS_COMMON_FAULT_TRANSPORT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/transport.h"

namespace onlineps {

class FaultyClientTransport final : public ClientTransport {
 public:
  FaultyClientTransport(std::unique_ptr<ClientTransport> inner, FaultOptions faults);
  ~FaultyClientTransport() override;  // Close()

  Status Connect(const std::vector<std::string>& endpoints, Handler handler) override;
  // Always OK once connected: a dropped request looks like a lost one.
  Status Send(size_t index, Frames frames) override;
  void Close() override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Held {
    Clock::time_point due;
    uint64_t order;  // FIFO among equal due times
    bool outgoing;
    size_t server;
    Frames frames;
    bool operator>(const Held& o) const { return due != o.due ? due > o.due : order > o.order; }
  };

  // Decides this message's fate and queues its copies.
  void Inject(bool outgoing, size_t server, Frames frames);
  void DeliveryLoop();
  void Count(std::atomic<uint64_t> FaultCounters::*field, uint64_t n = 1);

  // Immutable after construction.
  const std::unique_ptr<ClientTransport> inner_;
  const FaultOptions faults_;

  Handler handler_;  // set by Connect before the delivery thread starts

  Mutex mu_;
  CondVar cv_;
  std::priority_queue<Held, std::vector<Held>, std::greater<>> held_ GUARDED_BY(mu_);
  std::mt19937_64 rng_ GUARDED_BY(mu_);
  uint64_t next_order_ GUARDED_BY(mu_) = 0;
  bool connected_ GUARDED_BY(mu_) = false;
  bool closing_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_FAULT_TRANSPORT_H_
