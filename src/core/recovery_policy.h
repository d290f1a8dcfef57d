// The recovery policy: given a detected failure (cause, node, step, time) it
// decides what the job does next — restart the workers in place, evict the
// node and swap in a spare, evict it and wait for a repaired node, wait for
// the failed component's repair, keep running degraded, or stop — and says
// why in words that go into the incident log. One implementation, driven by
// the controller, by `endure sim` and by tests. Sans-I/O and deterministic:
// the caller passes time in and carries out the decision. Not thread-safe.
//
// Rules, in the order they apply:
//  1. Structural failure: the same cause at the same step `structural_repeats`
//     times while training ran: restarting cannot help, stop.
//  2. Retry budget: more than `max_restarts_in_window` restarts within
//     `restart_window`: the job is crash-looping, stop.
//  3. The cause's recovery path (restart / evict / wait), escalated from
//     restart to evict when the same node failed `evict_node_after` times
//     within `restart_window` — unless the failure repeats at the same step,
//     which points at code or data rather than the node.
//  4. Backoff: when the same node fails again with the same cause without the
//     job getting past the step of its previous failure, wait
//     backoff_initial * 2^(k-1) (capped at backoff_max) before acting.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "core/ids.h"

namespace endure::core {

// What a cause calls for, before budgets and escalation.
enum class RecoveryPath {
  kRestartInPlace,   // relaunch the workers on the same nodes (software, NCCL timeout)
  kEvictAndReplace,  // the node is bad: swap in a spare, or wait for a repaired node
  kWaitForRepair,    // nothing to swap (e.g. a switch): wait until it is repaired
};

// "restart", "evict", "wait".
std::string_view RecoveryPathName(RecoveryPath path);
// Accepts the names above; the error lists them.
Result<RecoveryPath> ParseRecoveryPath(std::string_view name);

struct RecoveryPolicyOptions {
  // Recovery path per cause name; causes not listed take default_path.
  std::unordered_map<std::string, RecoveryPath> paths;
  RecoveryPath default_path = RecoveryPath::kRestartInPlace;

  int max_restarts_in_window = 30;  // 0: unlimited
  Duration restart_window = std::chrono::hours(1);
  Duration backoff_initial = std::chrono::seconds(30);  // 0: no backoff
  Duration backoff_max = std::chrono::minutes(30);
  int structural_repeats = 3;  // 0: never stop for a repeated step
  int evict_node_after = 2;    // 0: never escalate restart to evict

  Status Validate() const;
};

struct FailureEvent {
  NodeId node;
  std::string_view node_name;  // for reasons, e.g. "node3"; empty: "node <id>"
  std::string_view cause;      // e.g. "faulty_gpu", "software_bug", "straggler"
  // The step being executed when the fault hit; during a restart, the step
  // the job was restoring to.
  StepNumber step;
  // The fault hit before training resumed: the previous restart failed.
  bool during_recovery = false;
  // The job still makes progress, only slower (a straggler): it may keep
  // running rather than stop for a repair.
  bool degraded = false;
  // Warm spares ready right now (from SparePool).
  int32_t spares_available = 0;
};

enum class RecoveryAction {
  kRestartInPlace,
  kReplaceWithSpare,       // evict `node`, take a spare, restart
  kEvictAndWaitForRepair,  // evict `node`; no spare: restart once a node is repaired
  kWaitForRepair,          // keep `node`; restart once its fault is repaired
  kTolerate,               // keep running degraded; nothing to do now
  kStop,                   // give up: the job ends with exit code 3
};

std::string_view RecoveryActionName(RecoveryAction action);

struct RecoveryDecision {
  RecoveryAction action = RecoveryAction::kRestartInPlace;
  NodeId node;
  Duration delay{0};  // back off this long before acting
  std::string reason;
};

class RecoveryPolicy {
 public:
  // `options` must be valid (CHECKed; call Validate() on user input first).
  explicit RecoveryPolicy(RecoveryPolicyOptions options);

  // Decides how to recover from `event`, detected at `now`. Every decision
  // except kTolerate and kStop counts as a restart for the retry budget.
  RecoveryDecision Step(const FailureEvent& event, TimePoint now);

  const RecoveryPolicyOptions& options() const { return options_; }

 private:
  struct CauseHistory {
    StepNumber last_training_step{-1};
    int same_step_count = 0;
  };
  struct NodeHistory {
    std::string last_cause;
    StepNumber last_step{-1};
    int no_progress_repeats = 0;
    std::vector<TimePoint> recent_failures;  // within restart_window; usually 0-2
  };

  RecoveryPath PathFor(std::string_view cause) const;

  RecoveryPolicyOptions options_;
  std::deque<TimePoint> restarts_;
  std::unordered_map<std::string, CauseHistory> causes_;
  std::unordered_map<NodeId, NodeHistory> nodes_;
};

}  // namespace endure::core
