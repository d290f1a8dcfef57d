// The real ProcessLauncher: WorkerSet and the standby functions of
// agent/worker_set.h.
#include "agent/process_launcher.h"

#include <signal.h>
#include <unistd.h>

namespace endure::agent {
namespace {

class RealWorkerGroup : public WorkerGroup {
 public:
  RealWorkerGroup(ProcessLauncher::ExitObserver on_exit, WorkerSet::LineObserver on_line)
      : set_(std::move(on_exit), std::move(on_line)) {}

  Status Start(const WorkerSpec& spec) override { return set_.Start(spec); }
  Status Adopt(Standby standby, const WorkerSpec& spec) override {
    return set_.Adopt(std::move(standby), spec);
  }
  void StopAll(std::chrono::milliseconds grace) override { set_.StopAll(grace); }
  void KillAll() override { set_.KillAll(); }
  bool Signal(int rank, int sig) override { return set_.Signal(rank, sig); }
  std::map<int, std::string> CaptureStacks(std::chrono::milliseconds timeout,
                                           const std::map<int, int>& stack_signals) override {
    return set_.CaptureStacks(timeout, stack_signals);
  }
  std::map<int, pid_t> Pids() const override { return set_.Pids(); }
  bool Rejoin(int rank, int new_rank) override { return set_.Rejoin(rank, new_rank); }
  void ForgetLastWords(int rank) override { set_.ForgetLastWords(rank); }

 private:
  WorkerSet set_;
};

class RealProcessLauncher : public ProcessLauncher {
 public:
  std::unique_ptr<WorkerGroup> NewGroup(ExitObserver on_exit,
                                        WorkerSet::LineObserver on_line) override {
    return std::make_unique<RealWorkerGroup>(std::move(on_exit), std::move(on_line));
  }
  Result<Standby> StartStandby(const std::vector<std::string>& argv,
                               const std::vector<std::pair<std::string, std::string>>& env,
                               const std::vector<std::string>& unset_env) override {
    return agent::StartStandby(argv, env, unset_env);
  }
  void DiscardStandby(Standby& standby) override { agent::DiscardStandby(standby); }
  void KillAgent() override { ::kill(::getpid(), SIGKILL); }
};

}  // namespace

std::unique_ptr<ProcessLauncher> NewRealProcessLauncher() {
  return std::make_unique<RealProcessLauncher>();
}

}  // namespace endure::agent
