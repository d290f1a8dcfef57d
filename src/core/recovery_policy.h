// The recovery policy: given a detected failure (cause, node, step, time) it
// decides what the job does next — restart the workers in place, evict the
// node and swap in a spare, evict it and wait for a repaired node, wait for
// the failed component's repair, keep running degraded, or stop — and says
// why in words that go into the incident log. One implementation, driven by
// the controller, by `endure sim` and by tests. Sans-I/O and deterministic:
// the caller passes time in and carries out the decision. Not thread-safe.
//
// Every cause has a class (ClassifyCause): hardware, software or ambiguous.
// Only hardware ever isolates a node on the policy's own inference; a
// software failure follows the program to whichever node runs it, and an
// ambiguous one (a hang, a timeout) is no evidence against the node.
//
// Rules, in the order they apply:
//  1. Structural failure: the same non-hardware cause at the same step
//     `structural_repeats` times while training ran: restarting cannot help,
//     stop.
//  1b. Start-up failure: the same non-hardware cause in `startup_repeats`
//     consecutive attempts, each before the generation completed a step: the
//     job cannot get past start-up (on different nodes: the program or its
//     configuration is at fault), stop.
//  2. Retry budget: more than `max_restarts_in_window` restarts within
//     `restart_window`: the job is crash-looping, stop.
//  3. The cause's recovery path (restart / evict / wait). For a hardware
//     cause only, restart escalates to evict when the same node failed
//     `evict_node_after` times within `restart_window`, or at once when the
//     evidence names the node's hardware (a log rule's evict_node).
//  4. Backoff: when the same node fails again with the same cause without the
//     job getting past the step of its previous failure, wait
//     backoff_initial * 2^(k-1) (capped at backoff_max) before acting.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "core/cause.h"
#include "core/ids.h"

namespace endure::core {

// What a cause calls for, before budgets and escalation.
enum class RecoveryPath {
  kRestartInPlace,   // relaunch the workers on the same nodes (software, NCCL timeout)
  kEvictAndReplace,  // the node is bad: swap in a spare, or wait for a repaired node
  kWaitForRepair,    // nothing to swap (e.g. a switch): wait until it is repaired
};

// "hardware", "software", "ambiguous".
std::string_view CauseClassName(CauseClass cause_class);

// ClassifyCause (cause.h's catalogue) decides which causes are hardware.
inline bool IsHardwareCause(std::string_view cause) {
  return ClassifyCause(cause) == CauseClass::kHardware;
}

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
  // Stop after this many consecutive attempts failed at start-up with the
  // same non-hardware cause; 0: never.
  int startup_repeats = 3;
  // Escalate a hardware cause's restart to evict on the node's N-th hardware
  // failure within restart_window; 0: never. Other causes never escalate.
  int evict_node_after = 2;

  Status Validate() const;
};

struct FailureEvent {
  NodeId node;
  std::string_view node_name;  // for reasons, e.g. "node3"; empty: "node <id>"
  std::string_view cause;      // e.g. "faulty_gpu", "software_bug", "straggler"
  // The step being executed when the fault hit; during a restart, the step
  // the job was restoring to.
  StepNumber step;
  // The fault hit before the generation completed a training step: at
  // start-up, or while restarting (the previous restart failed).
  bool during_recovery = false;
  // The evidence names the node's hardware (a log rule whose action is
  // evict_node): an ambiguous or unknown cause counts as hardware and the
  // node is isolated at once. A software cause stays software.
  bool node_fault_evidence = false;
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

  // The class the policy acts on for `event`: ClassifyCause, except that an
  // ambiguous cause counts as hardware when the event carries node-fault
  // evidence or the configured path for it is evict or wait (the operator
  // says the component is at fault).
  CauseClass ClassOf(const FailureEvent& event) const;

  const RecoveryPolicyOptions& options() const { return options_; }

  // Its state, for a snapshot of the job (core/job_snapshot.h); the options
  // come from the job's configuration.
  template <class Archive>
  void serialize(Archive& ar) {
    ar(restarts_, causes_, nodes_, startup_);
  }

 private:
  struct CauseHistory {
    StepNumber last_training_step{-1};
    int same_step_count = 0;
    std::vector<std::string> nodes;  // distinct, of the current same-step run

    template <class Archive>
    void serialize(Archive& ar) {
      ar(last_training_step, same_step_count, nodes);
    }
  };
  // The current run of consecutive attempts that failed at start-up.
  struct StartupStreak {
    std::string cause;  // empty: no run
    int attempts = 0;
    std::vector<std::string> nodes;  // distinct, in order of failure

    template <class Archive>
    void serialize(Archive& ar) {
      ar(cause, attempts, nodes);
    }
  };
  struct NodeHistory {
    std::string last_cause;
    StepNumber last_step{-1};
    int no_progress_repeats = 0;
    // Within restart_window; usually 0-2. Only hardware failures count
    // towards isolating the node.
    std::vector<TimePoint> recent_failures, recent_hardware_failures;

    template <class Archive>
    void serialize(Archive& ar) {
      ar(last_cause, last_step, no_progress_repeats, recent_failures, recent_hardware_failures);
    }
  };

  RecoveryPath PathFor(std::string_view cause) const;

  RecoveryPolicyOptions options_;
  std::deque<TimePoint> restarts_;
  std::map<std::string, CauseHistory> causes_;
  std::map<NodeId, NodeHistory> nodes_;
  StartupStreak startup_;
};

}  // namespace endure::core
