#include "agent/node_loop.h"

#include <algorithm>

#include "common/status.h"

namespace endure::agent {

NodeLoop::NodeLoop(size_t max_posted)
    : max_posted_(std::max<size_t>(1, max_posted)), thread_(&NodeLoop::Run, this) {}

NodeLoop::~NodeLoop() { Stop(); }

void NodeLoop::Post(std::function<void()> task) {
  Enqueue(std::move(task), /*wait_for_room=*/true);
}

bool NodeLoop::Enqueue(std::function<void()> task, bool wait_for_room) {
  MutexLock lock(&mu_);
  if (wait_for_room) {
    room_cv_.Wait(lock,
                  [this]() REQUIRES(mu_) { return stopping_ || queue_.size() < max_posted_; });
  }
  if (stopping_) return false;
  queue_.push_back(std::move(task));
  cv_.NotifyOne();
  return true;
}

void NodeLoop::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.NotifyOne();
    room_cv_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
  stopped_ = true;
}

void NodeLoop::AssertOnLoop() const {
  ENDURE_CHECK(stopped_ || std::this_thread::get_id() == thread_.get_id());
}

void NodeLoop::Run() {
  MutexLock lock(&mu_);
  while (true) {
    cv_.Wait(lock, [this]() REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued ran
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    room_cv_.NotifyAll();
    lock.Unlock();
    task();
    lock.Lock();
  }
}

}  // namespace endure::agent
