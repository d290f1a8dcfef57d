// ProcessLauncher: how the agent starts and controls processes — a
// generation's workers (a WorkerGroup), warm standbys, and, for an injected
// kill-agent fault, the agent itself. The real one is WorkerSet and
// StartStandby (agent/worker_set.h) on real processes; tests use
// FakeProcessLauncher (agent/fake_process_launcher.h), which records the
// specs and lets a test end workers and print their lines.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/worker_set.h"
#include "common/status.h"

namespace endure::agent {

// The workers of one generation on this node: the calls of WorkerSet, with
// its contract. Thread-safe. Destroying it kills and reaps what is left, and
// their exits are reported before the destructor returns.
class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;

  virtual Status Start(const WorkerSpec& spec) = 0;
  // Turns `standby` (started for spec.argv) into the worker of `spec`; fails,
  // leaving nothing behind, when the standby has died.
  virtual Status Adopt(Standby standby, const WorkerSpec& spec) = 0;
  // Stops every worker (SIGTERM to its tree, SIGKILL after `grace`); returns
  // once every exit has been reported.
  virtual void StopAll(std::chrono::milliseconds grace) = 0;
  // SIGKILL to every worker, waiting for nothing.
  virtual void KillAll() = 0;
  // `sig` to the worker of `rank`; false if there is none.
  virtual bool Signal(int rank, int sig) = 0;
  // Each live worker's stacks: rank -> text (see WorkerSet::CaptureStacks).
  virtual std::map<int, std::string> CaptureStacks(std::chrono::milliseconds timeout,
                                                   const std::map<int, int>& stack_signals) = 0;
  virtual std::map<int, pid_t> Pids() const = 0;
  // The live worker of `rank` serves a later generation in place as
  // `new_rank` (see WorkerSet::Rejoin); false if there is none.
  virtual bool Rejoin(int rank, int new_rank) = 0;
  // The live worker of `rank` starts its last words afresh (see
  // WorkerSet::ForgetLastWords).
  virtual void ForgetLastWords(int rank) = 0;
};

// Thread-safe.
class ProcessLauncher {
 public:
  using ExitObserver = std::function<void(const WorkerEnd&)>;

  virtual ~ProcessLauncher() = default;

  // An empty group for one generation. `on_exit` runs once per worker after
  // it exited, `on_line` (optional) for each line of its output before that,
  // both on threads of the group (WorkerSet's watchers); neither may call
  // back into the group.
  virtual std::unique_ptr<WorkerGroup> NewGroup(ExitObserver on_exit,
                                                WorkerSet::LineObserver on_line) = 0;

  // A standby for `argv`: the agent's environment with `env` set and
  // `unset_env` removed (see agent/worker_set.h StartStandby).
  virtual Result<Standby> StartStandby(const std::vector<std::string>& argv,
                                       const std::vector<std::pair<std::string, std::string>>& env,
                                       const std::vector<std::string>& unset_env) = 0;
  // Ends a standby that will not be used.
  virtual void DiscardStandby(Standby& standby) = 0;

  // The node dies at once (an injected kill-agent fault): SIGKILL to the
  // agent's own process. The real one does not return.
  virtual void KillAgent() = 0;
};

// Real processes: WorkerSet, StartStandby, DiscardStandby, SIGKILL to self.
std::unique_ptr<ProcessLauncher> NewRealProcessLauncher();

}  // namespace endure::agent
