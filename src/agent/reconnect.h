// What an agent needs to ride out a controller outage, as pure pieces: the
// delays between its attempts to reach the controller again
// (ReconnectBackoff) and the events that happen meanwhile, kept in order
// until a stream can take them (OutageBuffer). The agent (agent_shell.h)
// drives both; neither reads a clock or does I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <random>

#include "common/duration.h"
#include "common/status.h"
#include "proto/endure.pb.h"

namespace endure::agent {

struct ReconnectBackoffOptions {
  Duration initial = std::chrono::milliseconds(500);  // before the second attempt
  Duration max = std::chrono::seconds(10);            // no delay is longer
  // Each delay is shortened by up to this fraction of itself, at random, so
  // that the agents of a job do not all knock at the same instant.
  double jitter = 0.25;

  // Names the first invalid field and its accepted range.
  Status Validate() const;
};

// Delays between reconnection attempts: none before the first (a blip is
// over at once more often than not), then `initial` doubling up to `max`,
// each jittered down. Deterministic for a given seed. Not thread-safe.
class ReconnectBackoff {
 public:
  // `options` must be valid (ENDURE_CHECK).
  ReconnectBackoff(ReconnectBackoffOptions options, uint64_t seed);

  // The wait before the next attempt; the first call returns zero.
  Duration Next();
  // The delay that Next() jitters, for the attempt after the next one
  // (zero before the first call).
  Duration nominal() const { return nominal_; }

 private:
  ReconnectBackoffOptions o_;
  std::mt19937_64 rng_;
  int attempts_ = 0;
  Duration nominal_{0};
};

// The events an agent could not send while it had no controller, oldest
// first, bounded: past `capacity`, the oldest progress report (a step, a
// stack dump) goes first, and a report that something happened (a worker
// started, exited or became ready, a checkpoint persisted or stopped, a log
// match, a fired fault) only once no progress report is left. Heartbeats
// are never kept: they say only that the agent is alive now. Not
// thread-safe.
class OutageBuffer {
 public:
  static constexpr size_t kDefaultCapacity = 10'000;

  explicit OutageBuffer(size_t capacity = kDefaultCapacity);

  // Keeps `event` (a heartbeat is ignored), dropping one as described when
  // full.
  void Push(proto::AgentEvent event);
  bool empty() const { return events_.empty(); }
  size_t size() const { return events_.size(); }
  // The oldest event kept; the buffer must not be empty.
  const proto::AgentEvent& front() const;
  void PopFront();
  // Events dropped to stay within the capacity, since construction.
  int64_t dropped() const { return dropped_; }

 private:
  static bool IsProgress(const proto::AgentEvent& event);

  size_t capacity_;
  uint64_t next_seq_ = 0;
  std::map<uint64_t, proto::AgentEvent> events_;  // by arrival
  std::deque<uint64_t> progress_;                 // the progress reports among them, oldest first
  int64_t dropped_ = 0;
};

}  // namespace endure::agent
