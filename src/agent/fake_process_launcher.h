// FakeProcessLauncher: workers without processes, for tests of the agent.
// It records what the agent asked for (every worker's spec, stops with their
// grace, signals, standbys, the agent's own death) and lets a test end a
// worker with an exit status and last words, or have it print a line, as
// its watcher thread would report them. Thread-safe.
//
// Like WorkerSet, a group reports the exit of each worker it stops before
// StopAll returns: killed by SIGTERM with a grace, by SIGKILL without one.
// With a FakeClock, a stop advances it by its grace and a stack capture by
// the time set with SetStacks, as if they took that long.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/process_launcher.h"
#include "common/clock.h"
#include "common/mutex.h"

namespace endure::agent {

class FakeProcessLauncher : public ProcessLauncher {
 public:
  // A worker the agent started (or adopted from a standby).
  struct Launch {
    int group = 0;  // which NewGroup, from 0
    WorkerSpec spec;
    std::string standby_tag;  // adopted from this standby; empty: started cold
  };
  struct StandbyStart {
    std::vector<std::string> argv;
    std::vector<std::pair<std::string, std::string>> env;
    std::vector<std::string> unset_env;
    std::string tag;
  };

  // `clock` (optional, not owned) moves with stops and stack captures.
  explicit FakeProcessLauncher(FakeClock* clock = nullptr) : clock_(clock) {}

  // --- The test's side.

  // Start() and Adopt() fail with `status` from now on (OK: they succeed).
  void FailStarts(Status status);
  // What CaptureStacks returns for each live worker (rank -> text; a rank
  // not in `texts` gets "stacks of rank R"), and how long it takes.
  void SetStacks(std::map<int, std::string> texts, Duration takes);

  // Ends the live worker of `rank` in the newest group: its exit is
  // reported with `status` and `tail`. False when there is no such worker.
  bool Exit(int rank, ExitStatus status, std::string tail = "");
  // A line of the output of the live worker of `rank` in the newest group,
  // for the group's line observer. False when there is no such worker or
  // the group observes no lines.
  bool Print(int rank, std::string_view line);

  std::vector<Launch> launches() const;
  int groups() const;
  std::vector<std::chrono::milliseconds> stops() const;  // each StopAll's grace, of any group
  std::vector<std::pair<int, int>> signals() const;      // (rank, signal) of each Signal
  int kill_alls() const;
  std::vector<std::map<int, int>> stack_requests() const;  // the stack signals of each capture
  std::vector<StandbyStart> standbys_started() const;
  std::vector<std::string> standbys_discarded() const;  // their tags
  bool agent_killed() const;

  // --- ProcessLauncher.
  std::unique_ptr<WorkerGroup> NewGroup(ExitObserver on_exit,
                                        WorkerSet::LineObserver on_line) override;
  Result<Standby> StartStandby(const std::vector<std::string>& argv,
                               const std::vector<std::pair<std::string, std::string>>& env,
                               const std::vector<std::string>& unset_env) override;
  void DiscardStandby(Standby& standby) override;
  void KillAgent() override;

 private:
  class Group;
  friend class Group;

  FakeClock* const clock_;
  mutable Mutex mu_;  // the records below; never held while the agent is called
  Status start_status_ GUARDED_BY(mu_) = Status::Ok();
  std::map<int, std::string> stack_texts_ GUARDED_BY(mu_);
  Duration stacks_take_ GUARDED_BY(mu_) = Duration(0);
  std::vector<Launch> launches_ GUARDED_BY(mu_);
  int groups_made_ GUARDED_BY(mu_) = 0;
  pid_t next_pid_ GUARDED_BY(mu_) = 1000;
  std::vector<std::chrono::milliseconds> stops_ GUARDED_BY(mu_);
  std::vector<std::pair<int, int>> signals_ GUARDED_BY(mu_);
  int kill_alls_ GUARDED_BY(mu_) = 0;
  std::vector<std::map<int, int>> stack_requests_ GUARDED_BY(mu_);
  std::vector<StandbyStart> standbys_started_ GUARDED_BY(mu_);
  std::vector<std::string> standbys_discarded_ GUARDED_BY(mu_);
  bool agent_killed_ GUARDED_BY(mu_) = false;

  // The groups alive, oldest first. Held while a test's Exit or Print runs
  // the agent's callback, so that the group is not destroyed under it (the
  // agent's callbacks never call the launcher's group functions).
  mutable Mutex groups_mu_;
  std::vector<Group*> live_groups_ GUARDED_BY(groups_mu_);
};

}  // namespace endure::agent
