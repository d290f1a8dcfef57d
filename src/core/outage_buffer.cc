// The outage buffer of core/outage_buffer.h.
#include "core/outage_buffer.h"

#include <algorithm>
#include <utility>

#include "common/status.h"

namespace endure::core {

OutageBuffer::OutageBuffer(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {}

bool OutageBuffer::IsProgress(const proto::AgentEvent& event) {
  return event.has_step() || event.has_node_steps() || event.has_stack_dump();
}

void OutageBuffer::Push(proto::AgentEvent event) {
  if (event.has_heartbeat()) return;
  if (events_.size() >= capacity_) {
    // The oldest progress report goes first: a later step supersedes it,
    // while an exit or a checkpoint report is the only word of what it says.
    uint64_t victim = events_.begin()->first;
    if (!progress_.empty()) {
      victim = progress_.front();
      progress_.pop_front();
    }
    events_.erase(victim);
    ++dropped_;
  }
  const uint64_t seq = next_seq_++;
  if (IsProgress(event)) progress_.push_back(seq);
  events_.emplace(seq, std::move(event));
}

const proto::AgentEvent& OutageBuffer::front() const {
  ENDURE_CHECK(!events_.empty());
  return events_.begin()->second;
}

void OutageBuffer::PopFront() {
  ENDURE_CHECK(!events_.empty());
  const uint64_t seq = events_.begin()->first;
  if (!progress_.empty() && progress_.front() == seq) progress_.pop_front();
  events_.erase(events_.begin());
}

}  // namespace endure::core
