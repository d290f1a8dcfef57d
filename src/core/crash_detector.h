// Crash classification: turns a worker's end (an exit status or a signal, as
// waitpid reports it) into a failure report with a cause name and a reason
// for the incident log, or into nothing when the end was expected. Lost nodes
// are detected by HeartbeatMonitor (heartbeat_monitor.h) and reported in the
// same form. Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ids.h"

namespace endure::core {

enum class CrashKind {
  kWorkerExit,  // the worker exited with a status code
  kSignal,      // the worker was killed by a signal
  kNodeLost,    // the node's agent stopped talking to the controller
};

struct CrashReport {
  CrashKind kind = CrashKind::kWorkerExit;
  // "worker_exit code 1", "signal 9 SIGKILL", "node_lost".
  std::string cause;
  NodeId node;
  int rank = -1;  // -1 for a lost node
  // For a lost node: the last time it was heard from (the best estimate of
  // when the fault happened, for the detection-latency figure).
  std::optional<TimePoint> last_seen;
  // E.g. "rank 3 on node 1 was killed by signal 9 SIGKILL, which the agent did
  // not send; the kernel's OOM killer and `kill -9` send it".
  std::string reason;
};

// How a worker process ended.
struct WorkerExit {
  NodeId node;
  std::string node_name;  // for the reason, e.g. "node3"; empty: "node <id>"
  int rank = -1;
  // Exactly one of these is set: WEXITSTATUS when WIFEXITED, WTERMSIG when
  // WIFSIGNALED.
  std::optional<int> exit_code;
  std::optional<int> signal;
  bool core_dumped = false;
  // The agent was stopping the generation: any end is expected.
  bool stop_requested = false;
  // The worker had reported that training completed: exit code 0 is expected.
  bool training_finished = false;
};

// The failure `exit` represents, or nullopt when the worker ended as expected
// (a requested stop, or code 0 after training finished).
std::optional<CrashReport> ClassifyWorkerExit(const WorkerExit& exit);

// "SIGKILL" for 9, and so on for the Linux signals; "SIG?" when unknown.
std::string_view SignalName(int signal);
// The signals SignalName knows, by number.
std::vector<int> KnownSignals();

}  // namespace endure::core
