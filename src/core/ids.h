// Small value types shared by the decision cores: node ids, step numbers and
// the time point every core's Step(event, now) receives. They are distinct
// types so that a node id cannot be passed where a step is expected.
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <functional>

#include "common/duration.h"

namespace endure::core {

// Time as the cores see it: a steady-clock time point in nanoseconds. The
// controller passes steady_clock::now(); the simulator and tests pass
// TimePoint{} + simulated elapsed time.
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

inline TimePoint At(Duration since_start) { return TimePoint{} + since_start; }

// A physical node (host) of the cluster, stable across generations.
struct NodeId {
  int32_t value = -1;

  bool valid() const { return value >= 0; }
  friend auto operator<=>(NodeId, NodeId) = default;
};

// A global training step number (0-based, monotonically increasing in a run).
struct StepNumber {
  int64_t value = 0;

  friend auto operator<=>(StepNumber, StepNumber) = default;
};

}  // namespace endure::core

template <>
struct std::hash<endure::core::NodeId> {
  size_t operator()(endure::core::NodeId id) const noexcept {
    return std::hash<int32_t>()(id.value);
  }
};
