// HandlerPool<T>: a fixed set of threads, each with its own bounded FIFO. Items
// submitted with the same key always run on the same thread, in submission order; this
// is how server transports keep one peer's requests in order. Submit and Close are
// thread-safe; Close must not be called from a pool thread (it joins them).
#ifndef ONLINEPS_COMMON_HANDLER_POOL_H_
#define ONLINEPS_COMMON_HANDLER_POOL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"

namespace onlineps {

template <typename T>
class HandlerPool {
 public:
  using Fn = std::function<void(T&&)>;

  // Starts max(threads, 1) threads. `max_queue` bounds each thread's queue (0: unbounded).
  HandlerPool(std::string name, int threads, size_t max_queue, Fn fn);
  ~HandlerPool() { Close(); }
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Queues `item` on thread `key % size()`. Never blocks beyond the queue's mutex.
  // Returns false, dropping the item, when that queue is full (counted in dropped())
  // or the pool is closed.
  bool Submit(size_t key, T&& item);
  // Runs `item` on the calling thread when lane `key % size()` is idle (empty queue,
  // nothing running), keeping per-lane order; returns false, leaving `item` untouched,
  // otherwise. Lets an I/O thread answer small requests without a thread hand-off.
  bool TryRunInline(size_t key, T& item);
  // Lets every thread finish its queue, then joins them. Idempotent.
  void Close();

  size_t size() const { return lanes_.size(); }
  // Items dropped because their queue was full.
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct Lane {
    Mutex mu;
    CondVar cv;
    std::deque<T> queue GUARDED_BY(mu);
    bool closed GUARDED_BY(mu) = false;
    bool busy GUARDED_BY(mu) = false;  // an item of this lane is running
    std::thread thread;
  };
  void Run(Lane* lane);
  void Invoke(T&& item);

  // Immutable after construction.
  const std::string name_;
  const size_t max_queue_;
  const Fn fn_;
  std::vector<std::unique_ptr<Lane>> lanes_;

  std::atomic<uint64_t> dropped_{0};
  Mutex close_mu_;  // serializes Close()
};

template <typename T>
HandlerPool<T>::HandlerPool(std::string name, int threads, size_t max_queue, Fn fn)
    : name_(std::move(name)), max_queue_(max_queue), fn_(std::move(fn)) {
  const int n = std::max(threads, 1);
  for (int i = 0; i < n; ++i) lanes_.push_back(std::make_unique<Lane>());
  // Threads start only once every lane exists: Submit may index any lane right away.
  for (auto& lane : lanes_) lane->thread = std::thread(&HandlerPool::Run, this, lane.get());
}

template <typename T>
bool HandlerPool<T>::Submit(size_t key, T&& item) {
  Lane* lane = lanes_[key % lanes_.size()].get();
  bool was_empty;
  {
    MutexLock lock(&lane->mu);
    if (lane->closed) return false;
    if (max_queue_ != 0 && lane->queue.size() >= max_queue_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    was_empty = lane->queue.empty();
    lane->queue.push_back(std::move(item));
  }
  // The thread only sleeps on an empty queue, so only that transition needs a wake-up;
  // notifying after unlocking spares it from waking straight into a held mutex.
  if (was_empty) lane->cv.Signal();
  return true;
}

template <typename T>
bool HandlerPool<T>::TryRunInline(size_t key, T& item) {
  Lane* lane = lanes_[key % lanes_.size()].get();
  {
    MutexLock lock(&lane->mu);
    if (lane->closed || lane->busy || !lane->queue.empty()) return false;
    lane->busy = true;
  }
  Invoke(std::move(item));
  bool wake;
  {
    MutexLock lock(&lane->mu);
    lane->busy = false;
    // The lane's thread may be waiting on `busy` alone: with queued items, or to exit
    // after Close().
    wake = !lane->queue.empty() || lane->closed;
  }
  if (wake) lane->cv.Signal();
  return true;
}

template <typename T>
void HandlerPool<T>::Close() {
  MutexLock close_lock(&close_mu_);
  for (auto& lane : lanes_) {
    MutexLock lock(&lane->mu);
    lane->closed = true;
  }
  for (auto& lane : lanes_) {
    lane->cv.SignalAll();
    if (lane->thread.joinable()) lane->thread.join();
  }
}

template <typename T>
void HandlerPool<T>::Run(Lane* lane) {
  MutexLock lock(&lane->mu);
  while (true) {
    lane->cv.Wait(&lane->mu, [lane]() REQUIRES(lane->mu) {
      return (!lane->queue.empty() && !lane->busy) || (lane->closed && !lane->busy);
    });
    if (lane->queue.empty()) return;  // closed and drained
    T item = std::move(lane->queue.front());
    lane->queue.pop_front();
    lane->busy = true;
    lock.Unlock();
    Invoke(std::move(item));
    lock.Lock();
    lane->busy = false;
  }
}

template <typename T>
void HandlerPool<T>::Invoke(T&& item) {
  // A throwing handler must not take the thread (and every later item of its peers)
  // down with it.
  try {
    fn_(std::move(item));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "onlineps: %s handler threw: %s\n", name_.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "onlineps: %s handler threw a non-std exception\n", name_.c_str());
  }
}

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_HANDLER_POOL_H_
