// The cause of an incident: what kind of failure it was (a closed set, what
// the job machine acts on) and its name (what the incident log, the report,
// the state directory, the recovery policy's path table and ClassifyCause
// know it by).
//
// Why a kind plus a name, not an enum alone: the machine's own causes have
// fixed names ("hang", "node_lost", "loss_nan", ...), but the log rules name
// theirs freely, with placeholders filled from the matched line ("xid_{xid}"
// is xid_79, xid_48, ...), and the crash detector's carry the exit code or
// the signal ("worker_exit code 2", "signal 9 SIGKILL"). Enumerating those
// would either refuse rules that work today or collapse names the report and
// the recovery paths distinguish; so the rule's cause is kind kLogRule with
// the rule's own text, and the crash detector's are kWorkerExit and kSignal
// with theirs. Pure; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "core/loss_anomaly_detector.h"

namespace endure::core {

enum class Cause {
  kWorkerExit,          // "worker_exit code N": exited with a code no rule explained
  kSignal,              // "signal N NAME": killed by a signal no rule explained
  kNodeLost,            // "node_lost": the agent's stream dropped or it fell silent
  kHang,                // "hang": no step progress within the learned timeout
  kLossNan,             // "loss_nan"
  kLossInf,             // "loss_inf"
  kLossSpike,           // "loss_spike"
  kPersistenceFailing,  // "checkpoint persistence failing": writing to T2 failed
  kStraggler,           // "straggler": a rank computes slower than its peers (fail-slow)
  kSdc,                 // "sdc": data-parallel replicas' parameters disagree (silent corruption)
  kLogRule,             // a log rule matched the worker's output: the rule's cause
};

// The name of a kind: the incident name for the kinds that have one fixed
// name, and "worker_exit", "signal", "log_rule" for the three families.
std::string_view CauseName(Cause kind);

struct IncidentCause {
  Cause kind = Cause::kLogRule;
  std::string name;  // e.g. "hang", "signal 9 SIGKILL", "xid_79"

  friend bool operator==(const IncidentCause&, const IncidentCause&) = default;
};

// A cause of one of the kinds with a fixed name (not kWorkerExit, kSignal,
// kLogRule: CHECKed).
IncidentCause FixedCause(Cause kind);
IncidentCause LossAnomalyCauseOf(LossAnomalyKind kind);

// The cause an incident's name stands for, e.g. read back from the state
// directory: a fixed name is its kind, "worker_exit code ..." and
// "signal ..." the crash detector's, anything else a log rule's. Total:
// name(ParseIncidentCause(n)) == n for every n.
IncidentCause ParseIncidentCause(std::string_view name);

// Whether a cause is a collective's failure (a Gloo or NCCL error or
// timeout, an injected comm-fail): the rank that reports it is as likely
// the victim of a peer's fault as its culprit, so the node it names is no
// evidence; the pairwise test decides.
bool IsCollectiveCause(std::string_view name);

}  // namespace endure::core
