// Small value types shared by the decision cores: node ids, ranks, step
// numbers, generations and the time point every core's Step(event, now)
// receives. They are distinct types so that a node id cannot be passed where
// a step is expected, nor a rank compared with a generation. (Aggregate
// initialisation still takes their values positionally: `StepEnd{0, 1, 12}`.)
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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
// Where a step may be absent, -1 stands for none (as on the wire).
struct StepNumber {
  int64_t value = 0;

  friend auto operator<=>(StepNumber, StepNumber) = default;
};

// A worker's rank in its generation's world, 0 .. world size - 1; -1 where
// none applies (an incident of a whole node, a fault of no rank).
struct Rank {
  int32_t value = 0;

  bool valid() const { return value >= 0; }
  friend auto operator<=>(Rank, Rank) = default;
};

// A generation of the worker set: each (re)start is one, with its own rank
// assignment and restore point, and every message carries the generation it
// belongs to.
struct Generation {
  int32_t value = 0;

  Generation Next() const { return Generation{value + 1}; }
  friend auto operator<=>(Generation, Generation) = default;
};

// "rank 3", "ranks 0-3, 7": ascending ranks as an incident's reason names
// them, runs of consecutive ranks joined.
std::string FormatRanks(const std::vector<Rank>& ranks);
std::string FormatRanks(const std::vector<int>& ranks);

}  // namespace endure::core

template <>
struct std::hash<endure::core::NodeId> {
  size_t operator()(endure::core::NodeId id) const noexcept {
    return std::hash<int32_t>()(id.value);
  }
};
