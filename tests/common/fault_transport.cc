#include "tests/common/fault_transport.h"

#include <utility>

namespace onlineps {

ClientTransportDecorator FaultInjection(FaultOptions faults) {
  if (!faults.enabled()) return nullptr;
  return [faults](std::unique_ptr<ClientTransport> inner) -> std::unique_ptr<ClientTransport> {
    return std::make_unique<FaultyClientTransport>(std::move(inner), faults);
  };
}

FaultyClientTransport::FaultyClientTransport(std::unique_ptr<ClientTransport> inner,
                                             FaultOptions faults)
    : inner_(std::move(inner)), faults_(std::move(faults)), rng_(faults_.seed) {}

FaultyClientTransport::~FaultyClientTransport() { Close(); }

Status FaultyClientTransport::Connect(const std::vector<std::string>& endpoints, Handler handler) {
  {
    MutexLock lock(&mu_);
    if (connected_ || closing_) return FailedPrecondition("fault transport already connected");
    connected_ = true;
  }
  handler_ = std::move(handler);
  thread_ = std::thread([this] { DeliveryLoop(); });
  return inner_->Connect(endpoints, [this](size_t server, Frames&& frames) {
    Inject(/*outgoing=*/false, server, std::move(frames));
  });
}

Status FaultyClientTransport::Send(size_t index, Frames frames) {
  {
    MutexLock lock(&mu_);
    if (!connected_ || closing_) return Unavailable("fault transport is not connected");
  }
  Inject(/*outgoing=*/true, index, std::move(frames));
  return Status();
}

void FaultyClientTransport::Count(std::atomic<uint64_t> FaultCounters::*field, uint64_t n) {
  if (faults_.counters) (faults_.counters.get()->*field) += n;
}

void FaultyClientTransport::Inject(bool outgoing, size_t server, Frames frames) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  MutexLock lock(&mu_);
  if (closing_) return;
  if (unit(rng_) < faults_.drop) {
    Count(&FaultCounters::dropped);
    return;
  }
  const bool dup = unit(rng_) < faults_.duplicate;
  const int copies = dup ? 2 : 1;
  if (held_.size() + copies > faults_.max_held) {
    Count(&FaultCounters::overflowed);
    return;
  }
  if (dup) Count(&FaultCounters::duplicated);
  const Clock::time_point now = Clock::now();
  for (int i = 0; i < copies; ++i) {
    Clock::duration delay = faults_.delay;
    if (unit(rng_) < faults_.reorder) {
      // Half to one and a half of reorder_delay, so held messages also swap among
      // themselves.
      delay +=
          std::chrono::duration_cast<Clock::duration>(faults_.reorder_delay * (0.5 + unit(rng_)));
      Count(&FaultCounters::reordered);
    }
    held_.push(Held{now + delay, next_order_++, outgoing, server,
                    i + 1 < copies ? frames : std::move(frames)});
  }
  cv_.Signal();
}

void FaultyClientTransport::DeliveryLoop() {
  MutexLock lock(&mu_);
  while (!closing_) {
    if (held_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    if (held_.top().due > Clock::now()) {
      cv_.WaitUntil(&mu_, held_.top().due);
      continue;
    }
    Held h = held_.top();
    held_.pop();
    lock.Unlock();
    Count(&FaultCounters::passed);
    if (h.outgoing) {
      (void)inner_->Send(h.server, std::move(h.frames));  // as a lost request
    } else {
      handler_(h.server, std::move(h.frames));
    }
    lock.Lock();
  }
}

void FaultyClientTransport::Close() {
  {
    MutexLock lock(&mu_);
    if (closing_) return;
    closing_ = true;
    held_ = {};
  }
  cv_.SignalAll();
  inner_->Close();  // no more incoming after this
  if (thread_.joinable()) thread_.join();
}

}  // namespace onlineps
