// How the failure policies combine, decided once: when a failure is
// detected that no detector's own policy decided (a crash, a hang, a lost
// node, a log line), what the job does. In order:
//  1. the matching log rule's stop, or stop_if_repeated's confirming restart
//     failing the same way: the job stops with the line as the verdict;
//  2. otherwise the recovery policy's action (RecoveryPolicy::Step);
//  3. a hardware cause (RecoveryPolicy::ClassOf) strikes the node in the
//     health ledger; a hard one (StrikeClassOf) quarantines it at once, so a
//     node the policy would have kept leaves the job now;
//  4. unless the job stops, the route back to training (ChooseRoute), on the
//     facts of the job with the failed node gone or kept as decided.
// JobMachine::OnFailure (the controller) and the simulator (`endure sim`)
// both call DecideFailure and carry the decision out each its own way: the
// controller with actions to its shell, the simulator on its clock. Pure but
// for the policy's history, which it steps. Not thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/duration.h"
#include "core/log_classifier.h"
#include "core/recovery_policy.h"
#include "core/recovery_route.h"

namespace endure::core {

struct FailureFacts {
  FailureEvent event;  // the recovery policy's input
  // The action of the log rule that matched the failed worker's output.
  std::optional<LogAction> log_action;
  // A stop_if_repeated failure in the restart that was to confirm it: the
  // id of the incident it repeats (0: not a confirmation).
  int confirms_incident = 0;
  // The node health ledger is kept (strikes, hard-cause quarantine). Only
  // the simulator's ablation (SimConfig::multi_strike) turns it off.
  bool strikes = true;
};

struct FailureDecision {
  RecoveryAction action = RecoveryAction::kRestartInPlace;
  Duration delay{0};  // back off this long before the restart
  // Why, in words for the incident: parts joined by "; ".
  std::string reason;
  // The failed node leaves the job now (evicted or quarantined).
  bool node_leaves = false;
  // The node takes a strike in the health ledger; `hard_strike`: one that
  // quarantines it at once.
  bool strike = false;
  bool hard_strike = false;
  // How the job gets back to training; none when it stops.
  std::optional<RouteDecision> route;

  bool stops() const { return action == RecoveryAction::kStop; }
};

// The caller's facts of the job for ChooseRoute, given the decided action
// and whether the failed node leaves; DecideFailure sets `backoff`.
using RouteFactsFor = std::function<RouteFacts(RecoveryAction action, bool node_leaves)>;

// Decides as the header says; steps `policy` unless a log rule stops the
// job. `now` is the detection time.
FailureDecision DecideFailure(RecoveryPolicy& policy, const FailureFacts& facts, TimePoint now,
                              const RouteFactsFor& route_facts);

}  // namespace endure::core
