// The process-less workers of agent/fake_process_launcher.h.
#include "agent/fake_process_launcher.h"

#include <signal.h>

#include <algorithm>

namespace endure::agent {

class FakeProcessLauncher::Group : public WorkerGroup {
 public:
  Group(FakeProcessLauncher* launcher, int index, ExitObserver on_exit,
        WorkerSet::LineObserver on_line)
      : launcher_(launcher),
        index_(index),
        on_exit_(std::move(on_exit)),
        on_line_(std::move(on_line)) {}

  ~Group() override {
    {
      MutexLock lock(&launcher_->groups_mu_);
      std::erase(launcher_->live_groups_, this);
    }
    // Like WorkerSet's destructor: what is left is killed, and its exits reported.
    EndAll(ExitStatus{false, 0, SIGKILL});
  }

  Status Start(const WorkerSpec& spec) override { return Add(spec, ""); }

  Status Adopt(Standby standby, const WorkerSpec& spec) override { return Add(spec, standby.tag); }

  void StopAll(std::chrono::milliseconds grace) override {
    {
      MutexLock lock(&launcher_->mu_);
      launcher_->stops_.push_back(grace);
    }
    if (launcher_->clock_ != nullptr) launcher_->clock_->Advance(grace);
    EndAll(ExitStatus{false, 0, grace.count() > 0 ? SIGTERM : SIGKILL});
  }

  void KillAll() override {
    {
      MutexLock lock(&launcher_->mu_);
      ++launcher_->kill_alls_;
    }
    // The node is dying: nothing is reported.
    MutexLock lock(&mu_);
    live_.clear();
  }

  bool Signal(int rank, int sig) override {
    {
      MutexLock lock(&launcher_->mu_);
      launcher_->signals_.emplace_back(rank, sig);
    }
    MutexLock lock(&mu_);
    return live_.count(rank) > 0;
  }

  std::map<int, std::string> CaptureStacks(std::chrono::milliseconds timeout,
                                           const std::map<int, int>& stack_signals) override {
    (void)timeout;
    std::map<int, std::string> texts;
    Duration takes{0};
    {
      MutexLock lock(&launcher_->mu_);
      launcher_->stack_requests_.push_back(stack_signals);
      texts = launcher_->stack_texts_;
      takes = launcher_->stacks_take_;
    }
    if (launcher_->clock_ != nullptr) launcher_->clock_->Advance(takes);
    std::map<int, std::string> out;
    MutexLock lock(&mu_);
    for (const auto& [rank, pid] : live_) {
      auto it = texts.find(rank);
      out[rank] = it != texts.end() ? it->second : "stacks of rank " + std::to_string(rank);
    }
    return out;
  }

  std::map<int, pid_t> Pids() const override {
    MutexLock lock(&mu_);
    return live_;
  }

  bool Rejoin(int rank, int new_rank) override {
    MutexLock lock(&mu_);
    auto it = live_.find(rank);
    if (it == live_.end()) return false;
    const pid_t pid = it->second;
    live_.erase(it);
    live_[new_rank] = pid;
    return true;
  }

  void ForgetLastWords(int) override {}  // a fake worker says nothing

  // The test's side (FakeProcessLauncher::Exit and Print).
  bool Exit(int rank, ExitStatus status, std::string tail) {
    {
      MutexLock lock(&mu_);
      if (live_.erase(rank) == 0) return false;
    }
    on_exit_(WorkerEnd{rank, status, std::move(tail)});
    return true;
  }

  bool Print(int rank, std::string_view line) {
    {
      MutexLock lock(&mu_);
      if (live_.count(rank) == 0 || !on_line_) return false;
    }
    on_line_(rank, line);
    return true;
  }

 private:
  Status Add(const WorkerSpec& spec, const std::string& standby_tag) {
    pid_t pid = 0;
    {
      MutexLock lock(&launcher_->mu_);
      if (!launcher_->start_status_.ok()) return launcher_->start_status_;
      launcher_->launches_.push_back(Launch{index_, spec, standby_tag});
      pid = launcher_->next_pid_++;
    }
    MutexLock lock(&mu_);
    live_[spec.rank] = pid;
    return Status::Ok();
  }

  // Reports the exit of every live worker with `status` (empty tails).
  void EndAll(ExitStatus status) {
    std::map<int, pid_t> ending;
    {
      MutexLock lock(&mu_);
      ending.swap(live_);
    }
    for (const auto& [rank, pid] : ending) on_exit_(WorkerEnd{rank, status, ""});
  }

  FakeProcessLauncher* const launcher_;  // outlives its groups (the test owns both)
  const int index_;
  const ExitObserver on_exit_;
  const WorkerSet::LineObserver on_line_;
  mutable Mutex mu_;
  std::map<int, pid_t> live_ GUARDED_BY(mu_);  // rank -> fake pid
};

void FakeProcessLauncher::FailStarts(Status status) {
  MutexLock lock(&mu_);
  start_status_ = std::move(status);
}

void FakeProcessLauncher::SetStacks(std::map<int, std::string> texts, Duration takes) {
  MutexLock lock(&mu_);
  stack_texts_ = std::move(texts);
  stacks_take_ = takes;
}

bool FakeProcessLauncher::Exit(int rank, ExitStatus status, std::string tail) {
  MutexLock lock(&groups_mu_);
  if (live_groups_.empty()) return false;
  return live_groups_.back()->Exit(rank, status, std::move(tail));
}

bool FakeProcessLauncher::Print(int rank, std::string_view line) {
  MutexLock lock(&groups_mu_);
  if (live_groups_.empty()) return false;
  return live_groups_.back()->Print(rank, line);
}

std::vector<FakeProcessLauncher::Launch> FakeProcessLauncher::launches() const {
  MutexLock lock(&mu_);
  return launches_;
}

int FakeProcessLauncher::groups() const {
  MutexLock lock(&mu_);
  return groups_made_;
}

std::vector<std::chrono::milliseconds> FakeProcessLauncher::stops() const {
  MutexLock lock(&mu_);
  return stops_;
}

std::vector<std::pair<int, int>> FakeProcessLauncher::signals() const {
  MutexLock lock(&mu_);
  return signals_;
}

int FakeProcessLauncher::kill_alls() const {
  MutexLock lock(&mu_);
  return kill_alls_;
}

std::vector<std::map<int, int>> FakeProcessLauncher::stack_requests() const {
  MutexLock lock(&mu_);
  return stack_requests_;
}

std::vector<FakeProcessLauncher::StandbyStart> FakeProcessLauncher::standbys_started() const {
  MutexLock lock(&mu_);
  return standbys_started_;
}

std::vector<std::string> FakeProcessLauncher::standbys_discarded() const {
  MutexLock lock(&mu_);
  return standbys_discarded_;
}

bool FakeProcessLauncher::agent_killed() const {
  MutexLock lock(&mu_);
  return agent_killed_;
}

std::unique_ptr<WorkerGroup> FakeProcessLauncher::NewGroup(ExitObserver on_exit,
                                                           WorkerSet::LineObserver on_line) {
  int index = 0;
  {
    MutexLock lock(&mu_);
    index = groups_made_++;
  }
  auto group = std::make_unique<Group>(this, index, std::move(on_exit), std::move(on_line));
  MutexLock lock(&groups_mu_);
  live_groups_.push_back(group.get());
  return group;
}

Result<Standby> FakeProcessLauncher::StartStandby(
    const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& env,
    const std::vector<std::string>& unset_env) {
  MutexLock lock(&mu_);
  Standby s;
  s.argv = argv;
  s.env = env;
  s.tag = "standby-" + std::to_string(standbys_started_.size());
  standbys_started_.push_back(StandbyStart{argv, env, unset_env, s.tag});
  return s;
}

void FakeProcessLauncher::DiscardStandby(Standby& standby) {
  MutexLock lock(&mu_);
  standbys_discarded_.push_back(standby.tag);
}

void FakeProcessLauncher::KillAgent() {
  MutexLock lock(&mu_);
  agent_killed_ = true;
}

}  // namespace endure::agent
