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
#include <vector>

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

// ---- The cause catalogue: what each cause name means, in one table ----
//
// Every cause a log rule, the job machine, the health check or the
// simulator's failure mixes name is in it (cause.cc), with its class, its
// strike class and whether it is a collective's failure. Families are
// matched by their form: "xid_N" (hardware for the Xids that name the GPU,
// NVIDIA's catalogue), "health_check_failed ..." (hard), "worker_exit ..."
// (software), "signal ..." (ambiguous). The log rules are checked against it
// when they load (LogClassifier::Load): a rule cannot name a cause whose
// meaning nobody decided.

// Where a cause puts the fault.
enum class CauseClass {
  kHardware,   // a component of the node (GPU, its memory, NIC, the host): isolating the node helps
  kSoftware,   // the program, its data or its configuration: it fails on any node alike
  kAmbiguous,  // either reading fits (a hang, a timeout, a full disk), or an unknown name
};

// A strike against a node in the node health ledger: a hard one quarantines
// it at once, soft ones when they pile up (node_health.h).
enum class StrikeClass { kHard, kSoft };

// Whether `name` is in the catalogue, by name or by family. A rule's cause
// with a placeholder ("xid_{xid}") is checked by the text before it.
bool IsCatalogued(std::string_view name);
// The catalogue's names (not its families), in its order.
std::vector<std::string_view> CatalogueNames();

// A cause as a metric's label (endure_incidents_total{cause=...}): few values,
// each known in advance, so that a counter starts every one at zero and the
// first incident of a kind is an increase. The catalogue's names are their
// own label; each family folds into one: "worker_exit" (any code),
// "signal_sigkill" and the like by the signal's name ("signal_other" for
// one without), "xid_N" for the Xids that name the hardware ("xid_other"
// for the rest), "health_check_failed"; anything else is "other". The
// incident itself keeps its whole cause.
std::string CauseLabel(std::string_view cause);
// Every value CauseLabel gives, each once.
std::vector<std::string> CauseLabels();

// The class of a cause; kAmbiguous for a name the catalogue does not know.
CauseClass ClassifyCause(std::string_view cause);

// The class of a strike for `cause`: hard for the SDC check's minority
// ("sdc", the simulator's "silent_data_corruption"), a failed health check
// ("health_check_failed", also with a suffix naming its test), a GPU gone
// ("gpu_lost", "gpu_fallen_off", "gpu_init_failed", "faulty_gpu"),
// uncorrectable memory ("ecc_uncorrectable", "gpu_hbm3", "gpu_sram", Xids
// 48, 79 and 95, a failed row remap, a failed DCGM diagnostic); soft for
// everything else a node can be blamed for ("straggler", "hang_suspect",
// "node_lost", "pairwise_failed", the other Xids, ...). Software causes
// never strike: the caller does not pass them.
StrikeClass StrikeClassOf(std::string_view cause);

// Whether a cause is a collective's failure (a Gloo or NCCL error or
// timeout, an injected comm-fail): the rank that reports it is as likely
// the victim of a peer's fault as its culprit, so the node it names is no
// evidence; the pairwise test decides.
bool IsCollectiveCause(std::string_view name);

}  // namespace endure::core
