// Recovery policy; see recovery_policy.h for the rules.
#include "core/recovery_policy.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace endure::core {
namespace {

void DropOlderThan(std::deque<TimePoint>& times, TimePoint cutoff) {
  while (!times.empty() && times.front() <= cutoff) times.pop_front();
}

void DropOlderThan(std::vector<TimePoint>& times, TimePoint cutoff) {
  times.erase(times.begin(), std::upper_bound(times.begin(), times.end(), cutoff));
}

std::string NodeName(NodeId node) { return "node " + std::to_string(node.value); }

void AddDistinct(std::vector<std::string>& names, const std::string& name) {
  if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
}

std::string Join(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// Where a run of repeats happened: "on different nodes (node0, node1)", or
// "on node0 each time".
std::string WhereRepeated(const std::vector<std::string>& nodes) {
  if (nodes.size() > 1) return "on different nodes (" + Join(nodes) + ")";
  return "on " + (nodes.empty() ? std::string("the same node") : nodes[0]) + " each time";
}

std::string Ordinal(int n) {
  const char* suffix = (n % 100 >= 11 && n % 100 <= 13) ? "th"
                       : n % 10 == 1                    ? "st"
                       : n % 10 == 2                    ? "nd"
                       : n % 10 == 3                    ? "rd"
                                                        : "th";
  return std::to_string(n) + suffix;
}

}  // namespace

std::string_view CauseClassName(CauseClass cause_class) {
  switch (cause_class) {
    case CauseClass::kHardware:
      return "hardware";
    case CauseClass::kSoftware:
      return "software";
    case CauseClass::kAmbiguous:
      return "ambiguous";
  }
  return "?";
}

std::string_view RecoveryPathName(RecoveryPath path) {
  switch (path) {
    case RecoveryPath::kRestartInPlace:
      return "restart";
    case RecoveryPath::kEvictAndReplace:
      return "evict";
    case RecoveryPath::kWaitForRepair:
      return "wait";
  }
  return "?";
}

Result<RecoveryPath> ParseRecoveryPath(std::string_view name) {
  for (RecoveryPath p : {RecoveryPath::kRestartInPlace, RecoveryPath::kEvictAndReplace,
                         RecoveryPath::kWaitForRepair}) {
    if (name == RecoveryPathName(p)) return p;
  }
  return InvalidArgument("unknown recovery path '" + std::string(name) +
                         "' (expected restart, evict or wait)");
}

std::string_view RecoveryActionName(RecoveryAction action) {
  switch (action) {
    case RecoveryAction::kRestartInPlace:
      return "restart_in_place";
    case RecoveryAction::kReplaceWithSpare:
      return "replace_with_spare";
    case RecoveryAction::kEvictAndWaitForRepair:
      return "evict_and_wait_for_repair";
    case RecoveryAction::kWaitForRepair:
      return "wait_for_repair";
    case RecoveryAction::kTolerate:
      return "tolerate";
    case RecoveryAction::kStop:
      return "stop";
  }
  return "?";
}

Status RecoveryPolicyOptions::Validate() const {
  if (max_restarts_in_window < 0) return InvalidArgument("max restarts must be >= 0");
  if (restart_window <= Duration(0)) return InvalidArgument("restart window must be positive");
  if (backoff_initial < Duration(0)) return InvalidArgument("backoff must not be negative");
  if (backoff_max < backoff_initial) {
    return InvalidArgument("maximum backoff must be at least the initial backoff");
  }
  if (structural_repeats < 0 || startup_repeats < 0 || evict_node_after < 0) {
    return InvalidArgument(
        "repeat thresholds (structural_repeats, startup_repeats, evict_node_after) must be >= 0");
  }
  return Status::Ok();
}

RecoveryPolicy::RecoveryPolicy(RecoveryPolicyOptions options) : options_(std::move(options)) {
  ENDURE_CHECK(options_.Validate().ok());
}

RecoveryPath RecoveryPolicy::PathFor(std::string_view cause) const {
  auto it = options_.paths.find(std::string(cause));
  return it == options_.paths.end() ? options_.default_path : it->second;
}

CauseClass RecoveryPolicy::ClassOf(const FailureEvent& event) const {
  const CauseClass c = ClassifyCause(event.cause);
  if (c != CauseClass::kAmbiguous) return c;
  if (event.node_fault_evidence || PathFor(event.cause) != RecoveryPath::kRestartInPlace) {
    return CauseClass::kHardware;
  }
  return c;
}

RecoveryDecision RecoveryPolicy::Step(const FailureEvent& event, TimePoint now) {
  RecoveryDecision d;
  d.node = event.node;
  const std::string cause(event.cause);
  const std::string node_name =
      event.node_name.empty() ? NodeName(event.node) : std::string(event.node_name);
  const std::string where =
      node_name + " failed with " + cause + " at step " + std::to_string(event.step.value);
  const CauseClass cause_class = ClassOf(event);
  const bool hardware = cause_class == CauseClass::kHardware;

  // 1. Structural: the same cause stops training at the same step again and
  // again. A hardware fault that happens to recur at a step is the nodes'
  // bad luck, not the step's: it never counts.
  if (!event.during_recovery && !event.degraded && !hardware) {
    CauseHistory& c = causes_[cause];
    if (c.last_training_step != event.step) {
      c.same_step_count = 0;
      c.nodes.clear();
    }
    ++c.same_step_count;
    AddDistinct(c.nodes, node_name);
    c.last_training_step = event.step;
    if (options_.structural_repeats > 0 && c.same_step_count >= options_.structural_repeats) {
      d.action = RecoveryAction::kStop;
      d.reason = where + ": the " + Ordinal(c.same_step_count) + " " + cause +
                 " failure at this step, " + WhereRepeated(c.nodes) +
                 "; the fault is structural (code, data or config), restarting will not help";
      return d;
    }
  }

  // 1b. Start-up: consecutive attempts that fail the same way before
  // completing a step never reach a step to repeat, so rule 1 cannot see
  // them. Progress, or a different failure, ends the run.
  if (!event.degraded) {
    if (event.during_recovery && !hardware) {
      if (startup_.cause != cause) startup_ = StartupStreak{cause, 0, {}};
      ++startup_.attempts;
      AddDistinct(startup_.nodes, node_name);
      if (options_.startup_repeats > 0 && startup_.attempts >= options_.startup_repeats) {
        d.action = RecoveryAction::kStop;
        d.reason = cause + " at start-up in " + std::to_string(startup_.attempts) +
                   " consecutive attempts, " + WhereRepeated(startup_.nodes) + ": ";
        if (startup_.nodes.size() > 1 || cause_class == CauseClass::kSoftware) {
          d.reason += "the failure is in the program or its configuration, not the nodes";
        } else {
          d.reason += "restarting does not get the job past start-up (" + cause +
                      " is ambiguous: check the program's configuration and " + node_name + ")";
        }
        d.reason += "; stopping";
        return d;
      }
    } else {
      startup_ = StartupStreak{};
    }
  }

  // Isolation history of this node.
  NodeHistory& n = nodes_[event.node];
  DropOlderThan(n.recent_failures, now - options_.restart_window);
  DropOlderThan(n.recent_hardware_failures, now - options_.restart_window);
  n.recent_failures.push_back(now);
  if (hardware) n.recent_hardware_failures.push_back(now);
  bool no_progress = n.last_cause == cause && event.step <= n.last_step;
  n.no_progress_repeats = no_progress ? n.no_progress_repeats + 1 : 0;
  n.last_cause = cause;
  n.last_step = std::max(n.last_step, event.step);

  // 3. Path for the cause, escalated for a hardware repeat offender.
  RecoveryPath path = PathFor(cause);
  std::string why = where + " (" + std::string(CauseClassName(cause_class)) + " cause, path " +
                    std::string(RecoveryPathName(path)) + ")";
  const int node_failures =
      static_cast<int>(hardware ? n.recent_hardware_failures.size() : n.recent_failures.size());
  const bool repeat_offender =
      options_.evict_node_after > 0 && node_failures >= options_.evict_node_after;
  std::string note;  // why a node that looks suspect stays, after the action
  if (path == RecoveryPath::kRestartInPlace && !hardware) {
    if (event.node_fault_evidence) {
      note = "; the matching log rule's action is evict_node, but " + cause +
             " is a software cause: it would follow the job to any node, so " + node_name +
             " stays";
    } else if (repeat_offender) {
      note = "; not isolating " + node_name + " after its " + Ordinal(node_failures) +
             " failure within " + FormatDuration(options_.restart_window) + ": " + cause +
             (cause_class == CauseClass::kSoftware
                  ? " is a software cause, it would follow the job to any node"
                  : " is ambiguous, no evidence against the node");
    }
  } else if (path == RecoveryPath::kRestartInPlace && event.node_fault_evidence) {
    // The log says the node itself is bad (an Xid, an uncorrectable ECC
    // error): restarting on it would fail again.
    path = RecoveryPath::kEvictAndReplace;
    why = where + " (hardware cause): the matching log rule's action is evict_node: isolating " +
          node_name + " instead of restarting in place";
  } else if (path == RecoveryPath::kRestartInPlace && repeat_offender) {
    path = RecoveryPath::kEvictAndReplace;
    why = where + ", its " + Ordinal(node_failures) + " hardware failure within " +
          FormatDuration(options_.restart_window) + ": isolating it instead of restarting in place";
  }

  if (event.degraded) {
    if (path == RecoveryPath::kEvictAndReplace && event.spares_available > 0) {
      d.action = RecoveryAction::kReplaceWithSpare;
      d.reason = why + ": degraded node, replacing it with a spare";
    } else {
      d.action = RecoveryAction::kTolerate;
      d.reason = why + ": degraded node kept in the job; with " +
                 std::to_string(event.spares_available) +
                 " spares, running slower beats stopping to wait for a repair" + note;
      return d;
    }
  } else {
    switch (path) {
      case RecoveryPath::kRestartInPlace:
        d.action = RecoveryAction::kRestartInPlace;
        d.reason = why + ": restarting in place";
        break;
      case RecoveryPath::kEvictAndReplace:
        if (event.spares_available > 0) {
          d.action = RecoveryAction::kReplaceWithSpare;
          d.reason = why + ": evicting it and swapping in a spare (" +
                     std::to_string(event.spares_available) + " available)";
        } else {
          d.action = RecoveryAction::kEvictAndWaitForRepair;
          d.reason = why + ": evicting it; no spare available, waiting for a repaired node";
        }
        break;
      case RecoveryPath::kWaitForRepair:
        d.action = RecoveryAction::kWaitForRepair;
        d.reason = why + ": waiting for the component to be repaired";
        break;
    }
    d.reason += note;
  }

  // 2. Retry budget (tolerated faults cost no restart and returned above).
  DropOlderThan(restarts_, now - options_.restart_window);
  if (options_.max_restarts_in_window > 0 &&
      static_cast<int>(restarts_.size()) >= options_.max_restarts_in_window) {
    d.action = RecoveryAction::kStop;
    d.delay = Duration(0);
    d.reason = where + ": retry budget exhausted (" + std::to_string(restarts_.size()) +
               " restarts within " + FormatDuration(options_.restart_window) + ", limit " +
               std::to_string(options_.max_restarts_in_window) + "); the job is crash-looping";
    return d;
  }
  restarts_.push_back(now);

  // 4. Backoff for a node that keeps failing the same way without progress.
  if (no_progress && options_.backoff_initial > Duration(0)) {
    int k = n.no_progress_repeats;
    // In seconds as a double: initial * 2^(k-1) overflows int64 nanoseconds quickly.
    double delay_s = Seconds(options_.backoff_initial) * std::exp2(std::min(k - 1, 60));
    d.delay =
        delay_s >= Seconds(options_.backoff_max) ? options_.backoff_max : FromSeconds(delay_s);
    d.reason += "; " + Ordinal(k + 1) + " " + cause +
                " on this node without progress, backing off " + FormatDuration(d.delay);
  }
  return d;
}

}  // namespace endure::core
