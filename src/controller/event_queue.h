// EventQueue: what the controller's stream threads hand to its one event
// loop, bounded per source. Each agent's stream is a source: an agent that
// has `max_per_source` events waiting is refused more (Post returns false),
// and the controller closes its stream, so that a flood from one agent cannot
// grow the controller's memory without bound nor starve the others. Control
// events (a node up or down, a stop signal) are never refused.
//
// Thread-safe: any number of producers, one consumer (the loop).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "common/mutex.h"

namespace endure::controller {

template <typename T>
class EventQueue {
 public:
  // A source's count of events waiting; shared by the queue's entries.
  using Source = std::shared_ptr<std::atomic<int>>;

  explicit EventQueue(int max_per_source) : max_per_source_(max_per_source) {}

  static Source NewSource() { return std::make_shared<std::atomic<int>>(0); }

  // Queues `item` of `source`. Returns false, queuing nothing, when the
  // source already has max_per_source events waiting.
  bool Post(T item, const Source& source) {
    if (source->fetch_add(1) >= max_per_source_) {
      --*source;
      return false;
    }
    Push(Entry{std::move(item), source}, false);
    return true;
  }

  // Queues a control event, never refused: at the back, or at the front
  // (`urgent`: before everything already waiting).
  void PostControl(T item, bool urgent = false) { Push(Entry{std::move(item), nullptr}, urgent); }

  // The next event, waiting for one until `deadline`; nullopt on timeout.
  std::optional<T> PopUntil(std::chrono::steady_clock::time_point deadline) {
    MutexLock lock(&mu_);
    if (!cv_.WaitUntil(lock, deadline, [&]() REQUIRES(mu_) { return !queue_.empty(); }))
      return std::nullopt;
    Entry e = std::move(queue_.front());
    queue_.pop_front();
    if (e.source) --*e.source;
    return std::move(e.item);
  }

  // Calls `f` with the next event (under the queue's lock: `f` must not
  // touch the queue) and returns true, or returns false when none waits.
  template <typename F>
  bool PeekFront(F&& f) const {
    MutexLock lock(&mu_);
    if (queue_.empty()) return false;
    f(queue_.front().item);
    return true;
  }

  size_t size() const {
    MutexLock lock(&mu_);
    return queue_.size();
  }

 private:
  struct Entry {
    T item;
    Source source;  // null: a control event
  };
  void Push(Entry e, bool front) {
    {
      MutexLock lock(&mu_);
      if (front) {
        queue_.push_front(std::move(e));
      } else {
        queue_.push_back(std::move(e));
      }
    }
    cv_.NotifyOne();
  }

  const int max_per_source_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Entry> queue_ GUARDED_BY(mu_);
};

}  // namespace endure::controller
