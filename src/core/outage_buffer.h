// The events an agent could not send while it had no controller (one piece
// of the node core, core/node_machine.h). Pure: no clock, no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>

#include "proto/endure.pb.h"

namespace endure::core {

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

}  // namespace endure::core
