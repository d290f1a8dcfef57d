// The reconnection backoff and the outage buffer of agent/reconnect.h.
#include "agent/reconnect.h"

#include <algorithm>
#include <utility>

namespace endure::agent {

Status ReconnectBackoffOptions::Validate() const {
  if (initial <= Duration::zero()) {
    return InvalidArgument("reconnect backoff: initial must be positive, got " +
                           FormatDuration(initial));
  }
  if (max < initial) {
    return InvalidArgument("reconnect backoff: max must be at least initial=" +
                           FormatDuration(initial) + ", got " + FormatDuration(max));
  }
  if (!(jitter >= 0.0 && jitter < 1.0)) {
    return InvalidArgument("reconnect backoff: jitter must be in [0, 1), got " +
                           std::to_string(jitter));
  }
  return Status::Ok();
}

ReconnectBackoff::ReconnectBackoff(ReconnectBackoffOptions options, uint64_t seed)
    : o_(options), rng_(seed) {
  ENDURE_CHECK(o_.Validate().ok());
}

Duration ReconnectBackoff::Next() {
  if (attempts_++ == 0) {
    nominal_ = o_.initial;
    return Duration::zero();
  }
  const Duration base = nominal_;
  nominal_ = std::min(o_.max, nominal_ * 2);
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return std::chrono::duration_cast<Duration>(base * (1.0 - o_.jitter * u));
}

OutageBuffer::OutageBuffer(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {}

bool OutageBuffer::IsProgress(const proto::AgentEvent& event) {
  return event.has_step() || event.has_stack_dump();
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

}  // namespace endure::agent
