#include "agent/node_loop.h"

#include "common/status.h"

namespace endure::agent {

NodeLoop::NodeLoop() : thread_(&NodeLoop::Run, this) {}

NodeLoop::~NodeLoop() { Stop(); }

void NodeLoop::Post(std::function<void()> task) { Enqueue(std::move(task)); }

bool NodeLoop::Enqueue(std::function<void()> task) {
  MutexLock lock(&mu_);
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
    lock.Unlock();
    task();
    lock.Lock();
  }
}

}  // namespace endure::agent
