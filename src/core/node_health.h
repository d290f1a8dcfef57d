// The node health ledger's policy: which failures a node is blamed for, and
// when its record takes it out of service (Aurora's multi-strike
// quarantine). A hard strike (the GPU is broken or computes wrong numbers)
// quarantines the node at once; soft strikes (symptoms that one bad day can
// explain: a straggling step, a hang it was suspected of) quarantine it only
// when `soft_strikes` of them fall within `soft_window`, so one transient
// does not cost a node while a node that keeps misbehaving is removed.
//
// Storage is not here: the controller keeps strikes in SQLite under
// [cluster] state_dir, keyed by the host's identity, and passes JudgeNode
// the strikes since the node was last released. Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "core/cause.h"

namespace endure::core {

// "hard", "soft" (the ledger's column); ParseStrikeClass is its inverse.
std::string_view StrikeClassName(StrikeClass cls);
Result<StrikeClass> ParseStrikeClass(std::string_view name);

// StrikeClassOf (cause.h's catalogue) gives a cause's strike class.

struct Strike {
  std::string cause;    // the incident cause, e.g. "xid_79", "straggler"
  int64_t unix_ms = 0;  // when (wall clock: strikes outlive the controller)
  StrikeClass cls = StrikeClass::kSoft;
  std::string detail;  // the incident's reason or log line, for the operator
};

// A strike for `cause` of the class StrikeClassOf(cause).
Strike StrikeFor(std::string cause, int64_t unix_ms, std::string detail = "");

struct NodeHealthOptions {
  // Soft strikes within `soft_window` that quarantine a node.
  int soft_strikes = 3;
  Duration soft_window = std::chrono::hours(24);

  // Names the first invalid key and its accepted range: "soft_strikes must
  // be in [1, 1000], got 0", "soft_window must be positive, got 0ms".
  Status Validate() const;
};

enum class HealthState { kHealthy, kSuspect, kQuarantined };

// "healthy", "suspect", "quarantined"; ParseHealthState is its inverse.
std::string_view HealthStateName(HealthState state);
Result<HealthState> ParseHealthState(std::string_view name);

struct NodeVerdict {
  HealthState state = HealthState::kHealthy;
  // E.g. "3 soft strikes within 24h: straggler x2, hang_suspect",
  // "hard strike: xid_79 (GPU has fallen off the bus)".
  std::string reason;
};

// The state of a node with `strikes` (those since it was last released, in
// any order) at `now_unix_ms`:
//   - any hard strike, however old: quarantined;
//   - at least `soft_strikes` soft strikes within `soft_window` before now
//     (age <= soft_window; a strike stamped after now, from a clock ahead of
//     ours, counts as recent): quarantined;
//   - some soft strikes within the window, fewer than that: suspect;
//   - otherwise (none, or only older ones): healthy.
// `options` must be valid (ENDURE_CHECK).
NodeVerdict JudgeNode(const std::vector<Strike>& strikes, int64_t now_unix_ms,
                      const NodeHealthOptions& options);

}  // namespace endure::core
