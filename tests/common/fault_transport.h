// Fault injection for tests (library onlineps_testing; the product never links it).
// FaultyClientTransport wraps a real client transport and drops, duplicates, delays and
// reorders messages in both directions at the rates of FaultOptions; tests install it
// with TransportOptions::decorate = FaultInjection(options) to check that the retry and
// dedup paths keep every push exactly once over a lossy network.
//
// Every message, either way, goes through one delivery thread in order of its due time
// (FIFO among equal times), so the caller's Handler is still called from one thread.
// Held messages are bounded by FaultOptions::max_held; Close() discards what is still held.
#ifndef ONLINEPS_TESTS_COMMON_FAULT_TRANSPORT_H_
#define ONLINEPS_TESTS_COMMON_FAULT_TRANSPORT_H_

#include <atomic>
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

// What a fault-injecting client transport counts.
struct FaultCounters {
  std::atomic<uint64_t> passed{0};      // messages delivered (each copy of a duplicate)
  std::atomic<uint64_t> dropped{0};     // messages lost on purpose
  std::atomic<uint64_t> duplicated{0};  // messages delivered twice
  std::atomic<uint64_t> reordered{0};   // messages held back so later ones overtake them
  std::atomic<uint64_t> overflowed{0};  // dropped because max_held messages were waiting
};

// Faults a client transport injects into every message, in both directions (requests
// it sends and replies it receives), each decided independently from a seeded PRNG.
struct FaultOptions {
  double drop = 0;                     // probability a message is lost
  double duplicate = 0;                // probability a message is delivered twice
  double reorder = 0;                  // probability a message is held back by ~reorder_delay
  std::chrono::milliseconds delay{0};  // added to every message
  std::chrono::milliseconds reorder_delay{20};  // hold-back of a reordered message
  uint64_t seed = 1;
  size_t max_held = 65536;  // messages waiting for their delivery time; beyond, dropped
  std::shared_ptr<FaultCounters> counters;  // optional: where the counts go
  bool enabled() const { return drop > 0 || duplicate > 0 || reorder > 0 || delay.count() > 0; }
};

// The decorator for TransportOptions::decorate: wraps every client transport in a
// FaultyClientTransport with `faults`; null when !faults.enabled() (no wrapping at all).
ClientTransportDecorator FaultInjection(FaultOptions faults);

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

#endif  // ONLINEPS_TESTS_COMMON_FAULT_TRANSPORT_H_
