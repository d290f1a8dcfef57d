// WorkerSet: the worker processes of one generation on one node. Starts
// them with their environment, pipes their output to per-rank log files
// while keeping the last lines for classification (and handing each line to
// an optional observer), reports each exit with its last words, stops them
// (SIGTERM to the worker's whole process tree, grace, SIGKILL), and captures
// their stacks (agent/stack_capture.h: from the worker itself where it dumps
// them on a signal, from outside otherwise). Thread-safe.
//
// Each worker leads its own session and process group, and carries a tag
// in its environment (ENDURE_WORKER_TAG) that its descendants inherit: its
// process tree (common/subprocess.h ProcessTree) is the group, the session
// and every tagged process, which finds children that left with setsid or
// a double fork. A worker's exit is found by its pid, never by the end of
// its output, so a descendant that keeps the pipe open cannot hide it; what
// is left of its tree is then killed, and the output drained for at most
// kDrainAfterExit.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/stack_capture.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace endure::agent {

// How long a worker's output is read after it exited, for what its
// descendants still write, before its exit is reported regardless.
inline constexpr std::chrono::milliseconds kDrainAfterExit{1000};
// The last words kept for classification: at most this many lines and bytes.
inline constexpr size_t kTailLines = 60;
inline constexpr size_t kTailBytes = 256 * 1024;

struct WorkerSpec {
  int rank = 0;
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;  // on top of the agent's
  std::vector<std::string> unset_env;  // the agent's variables the worker must not see
  std::string log_path;                // the worker's stdout and stderr go here
  // Where the worker writes its own stacks when signalled
  // (ENDURE_STACKS_FILE); empty: none.
  std::string stacks_path;
};

// A worker started ahead of need (ENDURE_STANDBY=1): the program is loaded
// and blocks reading its assignment from `input_fd` (see
// endure::AwaitStandbyAssignment). Owns both descriptors.
struct Standby {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;  // what it started with beyond ours
  std::optional<Subprocess> process;
  int input_fd = -1;   // write end of its stdin
  int output_fd = -1;  // read end of its stdout and stderr
  std::string tag;     // its ENDURE_WORKER_TAG
};

// A worker's environment as the KEY=VALUE lines a standby reads its
// assignment from (and a live worker a rejoin offer: client.h Rejoin).
std::string AssignmentText(const std::vector<std::pair<std::string, std::string>>& env);

// Starts a standby for `argv`, whose environment is the agent's with `env`
// set and `unset_env` removed.
Result<Standby> StartStandby(const std::vector<std::string>& argv,
                             const std::vector<std::pair<std::string, std::string>>& env,
                             const std::vector<std::string>& unset_env = {});
// Ends a standby that will not be used: it reads end-of-file and exits.
void DiscardStandby(Standby& standby);

struct WorkerEnd {
  int rank = 0;
  ExitStatus status;
  std::string tail;  // the last lines of its output
  // The set stopped or killed it (StopAll, KillAll) while it was alive: its
  // end is no failure of its own.
  bool stopped = false;
};

class WorkerSet {
 public:
  using LineObserver = std::function<void(int rank, std::string_view line)>;

  // `on_exit` runs on a watcher thread, once per worker, after the worker
  // exited and its output was drained (to its end, or for kDrainAfterExit
  // after the exit). `on_line` (optional) runs on the same thread
  // for each line of output (see core::LineSplitter: '\r' ends a line too, and a
  // line is cut at kMaxLineBytes), before the exit. Neither may call back
  // into this WorkerSet.
  explicit WorkerSet(std::function<void(const WorkerEnd&)> on_exit, LineObserver on_line = nullptr);
  ~WorkerSet();  // kills and reaps what is left

  Status Start(const WorkerSpec& spec);

  // Turns `standby` (same argv as spec.argv) into the worker of `spec`: its
  // environment is written to the standby's stdin. Fails, leaving nothing
  // behind, when the standby has died.
  Status Adopt(Standby standby, const WorkerSpec& spec);

  // SIGTERM to every worker's process tree (and SIGCONT to its group, so
  // that a stopped worker acts on it), then SIGKILL to what is left of it
  // after `grace` (at once when `grace` is 0); returns once every watcher
  // has finished, which after the SIGKILL takes at most kDrainAfterExit
  // (unless the kernel cannot end a process, e.g. one stuck in a device).
  void StopAll(std::chrono::milliseconds grace);

  // SIGKILL to every worker's process tree, without waiting for anything
  // (a node that dies at once).
  void KillAll();

  // Sends `sig` to the worker of `rank` (its process group); false if none.
  bool Signal(int rank, int sig);

  // The stacks of each live worker: rank -> text (or what could not be
  // captured and why), every rank at once under the one deadline `timeout`
  // (agent/stack_capture.h). A rank in `stack_signals` (rank -> the signal
  // it announced) is asked to dump its own stacks into its stacks file.
  std::map<int, std::string> CaptureStacks(std::chrono::milliseconds timeout,
                                           const std::map<int, int>& stack_signals = {});

  std::map<int, pid_t> Pids() const;

  // The live worker of `rank` joins a later generation in place (an
  // in-process restart) as `new_rank`: its lines and its exit are reported
  // under `new_rank` from now on, and the last words its exit reports start
  // afresh, so that what it said in an earlier generation (a collective
  // that failed when a peer died) never explains how it ends in this one.
  // False if there is no such worker.
  bool Rejoin(int rank, int new_rank);
  // The live worker of `rank` starts its last words afresh: called when it
  // reports ready after a rejoin, so that the lines it printed in between
  // (the failed collective that made it rejoin) do not explain its end.
  void ForgetLastWords(int rank);

 private:
  struct Worker {
    std::atomic<int> rank{0};
    // Bumped by Rejoin: the watcher drops the tail it holds.
    std::atomic<uint64_t> tail_epoch{0};
    pid_t pid = -1;
    ProcessTree tree;  // its group, session and tagged descendants
    std::string stacks_path;
    std::thread watcher;
    // Its watcher and the set's callers meet here: held from a check of
    // `reaped` to the signal it allows, so that the pid is not reused in
    // between. Taken after the set's mu_ where both are held.
    Mutex mu;
    bool reaped GUARDED_BY(mu) = false;   // its pid may be reused from now on
    bool done GUARDED_BY(mu) = false;     // its exit was reported
    bool stopped GUARDED_BY(mu) = false;  // StopAll or KillAll signalled it alive
  };
  void Watch(Worker* worker, Subprocess process, int out_fd, std::string log_path);
  // Takes a started worker (its process, the read end of its output, its
  // tag) into the set and starts its watcher.
  void Add(const WorkerSpec& spec, Subprocess process, int out_fd, const std::string& tag);

  std::function<void(const WorkerEnd&)> on_exit_;
  LineObserver on_line_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<Worker>> workers_ GUARDED_BY(mu_);
};

}  // namespace endure::agent
