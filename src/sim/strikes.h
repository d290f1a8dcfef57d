// The simulator's per-node strike record, judged by core::JudgeNode (the
// controller's multi-strike rule). A thin holder: the simulator passes each
// strike's cause and time, core::StrikeClassOf classes it, and the verdict is
// the core's. Not thread-safe; one run owns it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/duration.h"
#include "core/ids.h"

namespace endure::sim {

// core::StrikeClassOf(cause) == kHard.
bool IsHardStrikeCause(std::string_view cause);

// The part of core::NodeVerdict the simulator acts on.
struct StrikeVerdict {
  bool quarantined = false;
  bool hard = false;  // the strike just added was hard
  std::string reason;
};

class StrikeRecord {
 public:
  StrikeRecord(int64_t soft_strikes, Duration soft_window);

  // Strikes `node` for `cause` at `now` (simulated time since the start of
  // the run, passed to JudgeNode as Unix milliseconds from 0) and returns
  // JudgeNode's verdict over its strikes since it was last released.
  StrikeVerdict Strike(core::NodeId node, std::string_view cause, Duration now);

  // The node came back from repair: its strikes are dropped (released).
  void Release(core::NodeId node);

 private:
  struct Entry {
    std::string cause;
    int64_t unix_ms;
  };
  int64_t soft_strikes_;
  Duration soft_window_;
  std::unordered_map<int32_t, std::vector<Entry>> strikes_;
};

}  // namespace endure::sim
