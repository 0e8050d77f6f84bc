// CheckpointQueue: checkpoint requests from the network, answered from a thread of
// their own, so that no handler thread (and no peer queued behind it) waits while a
// large shard is written. Requests that arrive while a checkpoint runs share the next
// one, which starts after all of them arrived; at most kMaxWaiting wait at once.
// Thread-safe.
#ifndef ONLINEPS_PS_CHECKPOINT_QUEUE_H_
#define ONLINEPS_PS_CHECKPOINT_QUEUE_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/wire.h"

namespace onlineps::ps {

class CheckpointQueue {
 public:
  static constexpr size_t kMaxWaiting = 1024;
  // `write` takes a checkpoint and returns its path; `answer` sends a requester its
  // reply (called on the queue's thread).
  using Write = std::function<StatusOr<std::string>()>;
  using Answer = std::function<void(const std::string& peer, const Header& request,
                                    const StatusOr<std::string>& result)>;

  CheckpointQueue(Write write, Answer answer);
  ~CheckpointQueue();  // Stop()

  // Queues a request; the answer comes later. Errors: kUnavailable when kMaxWaiting
  // requests wait already or the queue is stopped.
  Status Add(std::string peer, const Header& request);
  // Finishes the checkpoint under way, answers requests still waiting with
  // kUnavailable, and joins the thread. Idempotent.
  void Stop();

 private:
  struct Request {
    std::string peer;
    Header header;
  };
  void Run();

  const Write write_;
  const Answer answer_;
  Mutex mu_;
  CondVar cv_;
  std::vector<Request> waiting_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_CHECKPOINT_QUEUE_H_
