// The thread that owns the node's core (core/node_machine.h). The agent's
// other threads (its commands, the worker socket, the workers' exits and
// output, the tier store, the signal) hand it work in one queue; it runs one
// task at a time, in the order they came: steps the core and carries out its
// actions, writes to the controller's stream included. Post() does not wait
// for its task (but for room in the queue: a worker flooding the agent with
// datagrams while the loop waits on a slow controller meets the socket's
// bound, as it did when the receiver wrote itself, not the agent's memory);
// Call() waits for its function's result.
//
// What only the loop touches is GUARDED_BY the loop (a capability held on
// its thread, asserted by AssertOnLoop), so that the compiler checks it is
// not reached from another thread.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>

#include "common/mutex.h"

namespace endure::agent {

class CAPABILITY("thread") NodeLoop {
 public:
  // At most this many posted tasks wait; Post() blocks beyond it.
  static constexpr size_t kMaxPosted = 1024;

  explicit NodeLoop(size_t max_posted = kMaxPosted);
  ~NodeLoop();  // Stop()
  NodeLoop(const NodeLoop&) = delete;
  NodeLoop& operator=(const NodeLoop&) = delete;

  // Runs `task` on the loop after what is queued, once fewer than the bound
  // wait (it waits for room); dropped once stopped. Never from the loop's
  // own thread.
  void Post(std::function<void()> task) EXCLUDES(mu_);

  // Runs `f` on the loop after what is queued and returns its result. Once
  // the loop has stopped, `f` runs on the caller (only one thread of the
  // agent is left by then). Never from the loop's own thread.
  template <typename F>
  auto Call(F f) -> std::invoke_result_t<F> {
    using R = std::invoke_result_t<F>;
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(f));
    std::future<R> result = task->get_future();
    if (!Enqueue([task] { (*task)(); }, /*wait_for_room=*/false)) (*task)();
    return result.get();
  }

  // Waits until everything queued before this call has run.
  void Flush() {
    Call([] {});
  }

  // Runs what is queued, then ends the thread; later posts are dropped.
  void Stop() EXCLUDES(mu_);

  // On the loop's thread, or after Stop (see Call): what is GUARDED_BY it
  // may be used.
  void AssertOnLoop() const ASSERT_CAPABILITY(this);

 private:
  // False once stopped.
  bool Enqueue(std::function<void()> task, bool wait_for_room) EXCLUDES(mu_);
  void Run();

  const size_t max_posted_;
  Mutex mu_;
  CondVar cv_;       // work for the loop
  CondVar room_cv_;  // room in the queue
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<bool> stopped_{false};  // the thread has ended
  std::thread thread_;                // last: it uses the members above
};

}  // namespace endure::agent
