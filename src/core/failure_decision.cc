// How the failure policies combine; see failure_decision.h.
#include "core/failure_decision.h"

#include <string>

#include "core/cause.h"

namespace endure::core {
namespace {

void Add(std::string& reason, const std::string& part) {
  reason += (reason.empty() ? "" : "; ") + part;
}

}  // namespace

FailureDecision DecideFailure(RecoveryPolicy& policy, const FailureFacts& facts, TimePoint now,
                              const RouteFactsFor& route_facts) {
  FailureDecision d;
  const std::string cause(facts.event.cause);

  // 1. The log says a restart cannot fix it.
  if (facts.log_action == LogAction::kStop) {
    d.action = RecoveryAction::kStop;
    d.reason =
        "the matching log rule's action is stop: a restart cannot fix this error, it fails the "
        "same way on every node";
    return d;
  }
  if (facts.confirms_incident > 0) {
    d.action = RecoveryAction::kStop;
    d.reason = cause + " again, in the restart that was to confirm it (incident " +
               std::to_string(facts.confirms_incident) +
               "): a restart cannot fix it; fix what the line says, then run the spec again (it "
               "resumes from the newest checkpoint)";
    return d;
  }

  // 2. The recovery policy. A log rule's evict_node is evidence against
  // the node's hardware.
  FailureEvent event = facts.event;
  event.node_fault_evidence =
      event.node_fault_evidence || facts.log_action == LogAction::kEvictNode;
  const RecoveryDecision r = policy.Step(event, now);
  d.action = r.action;
  d.delay = r.delay;
  d.reason = r.reason;
  if (facts.log_action == LogAction::kStopIfRepeated && !d.stops()) {
    Add(d.reason, cause +
                      " recurs unless what caused it changes: this restart confirms it, and the "
                      "same failure in it stops the job");
  }
  d.node_leaves = d.action == RecoveryAction::kReplaceWithSpare ||
                  d.action == RecoveryAction::kEvictAndWaitForRepair;

  // 3. A hardware cause is a strike against the node (software follows the
  // program; an ambiguous cause is no evidence against the node). A hard
  // one quarantines it: it leaves the job now.
  if (facts.strikes && event.node.valid() && policy.ClassOf(event) == CauseClass::kHardware) {
    d.strike = true;
    d.hard_strike = StrikeClassOf(cause) == StrikeClass::kHard;
    const bool kept =
        d.action == RecoveryAction::kRestartInPlace || d.action == RecoveryAction::kTolerate;
    if (d.hard_strike && kept) {
      d.action = event.spares_available > 0 ? RecoveryAction::kReplaceWithSpare
                                            : RecoveryAction::kEvictAndWaitForRepair;
      d.node_leaves = true;
      Add(d.reason, cause + " is a hard cause: the node is quarantined");
    }
  }

  // 4. The route back, for a restart.
  if (d.action != RecoveryAction::kStop && d.action != RecoveryAction::kTolerate) {
    RouteFacts route = route_facts(d.action, d.node_leaves);
    route.action = d.action;
    route.backoff = d.delay > Duration(0);
    d.route = ChooseRoute(route);
  }
  return d;
}

}  // namespace endure::core
