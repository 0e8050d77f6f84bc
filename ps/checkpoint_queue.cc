#include "ps/checkpoint_queue.h"

namespace onlineps::ps {

CheckpointQueue::CheckpointQueue(Write write, Answer answer)
    : write_(std::move(write)), answer_(std::move(answer)), thread_([this] { Run(); }) {}

CheckpointQueue::~CheckpointQueue() { Stop(); }

Status CheckpointQueue::Add(std::string peer, const Header& request) {
  MutexLock lock(&mu_);
  if (stopped_) return Unavailable("shard is stopping; it writes its final checkpoint itself");
  if (waiting_.size() >= kMaxWaiting) {
    return Unavailable(std::to_string(kMaxWaiting) + " checkpoint requests are waiting already");
  }
  waiting_.push_back({std::move(peer), request});
  cv_.Signal();
  return Status::Ok();
}

void CheckpointQueue::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void CheckpointQueue::Run() {
  for (;;) {
    std::vector<Request> batch;
    bool stop;
    {
      MutexLock lock(&mu_);
      while (waiting_.empty() && !stopped_) cv_.Wait(&mu_);
      batch.swap(waiting_);
      stop = stopped_;
    }
    const StatusOr<std::string> result =
        stop ? StatusOr<std::string>(
                   Unavailable("shard is stopping; it writes its final checkpoint itself"))
             : write_();
    for (const Request& r : batch) answer_(r.peer, r.header, result);
    if (stop) return;
  }
}

}  // namespace onlineps::ps
