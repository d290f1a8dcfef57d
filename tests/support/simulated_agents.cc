// Simulated agents for load; see simulated_agents.h.
#include "tests/support/simulated_agents.h"

#include <algorithm>

namespace endure::loadgen {

using namespace std::chrono_literals;

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

proto::AgentEvent SimAgent::Event(int64_t generation) const {
  proto::AgentEvent e;
  e.set_token(fleet_->token());
  e.set_generation(generation);
  e.set_time_s(WallSeconds());
  return e;
}

void SimAgent::Drive(Clock::time_point now, Clock::duration step_time) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ || silent_) return;
  if (now >= next_beat_) {
    // As the agent: no heartbeat within a second of a node report, which
    // says the node is alive too (core::kReportIsHeartbeat).
    if (fleet_->per_rank() || !last_report_ || now - *last_report_ >= 1s) {
      proto::AgentEvent beat = Event(generation_);
      beat.mutable_heartbeat();
      Send(std::move(beat));
      fleet_->Sent();
    }
    next_beat_ = now + 1s;
  }
  if (generation_ >= 0 && now >= next_step_) {
    // The step due now on the generation's common clock: the ranks of a
    // data-parallel job end each step together (an agent whose start came
    // late joins at the step the others are at).
    const int64_t due = 1 + (now - first_step_at_) / step_time;
    step_ = step_base_ + due;
    proto::AgentEvent node = Event(generation_);
    for (int rank : ranks_) {
      proto::StepProgress s;
      s.set_rank(rank);
      s.set_step(step_);
      s.set_loss(3.0 - 1e-4 * static_cast<double>(step_));
      s.set_compute_s(0.8 * std::chrono::duration<double>(step_time).count());
      s.set_checkpoint_step(-1);
      s.set_tokens(4096);
      if (fleet_->per_rank()) {
        proto::AgentEvent e = Event(generation_);
        *e.mutable_step() = std::move(s);
        Send(std::move(e));
        fleet_->Reported(step_);
      } else {
        *node.mutable_node_steps()->add_ranks() = std::move(s);
      }
    }
    if (!fleet_->per_rank() && !ranks_.empty()) {
      Send(std::move(node));
      fleet_->Reported(step_);
      last_report_ = now;
    }
    next_step_ = first_step_at_ + due * step_time;
  }
}

void SimAgent::OnReadDone(bool ok) {
  if (!ok) {
    // The stream is ending: nothing more is sent on it.
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    return;
  }
  const proto::AgentCommand cmd = command_;
  StartRead(&command_);
  std::unique_lock<std::mutex> lock(mu_);
  if (cmd.has_start()) {
    generation_ = cmd.generation();
    step_ = std::max<int64_t>(0, cmd.start().restore_step());
    ranks_.clear();
    for (const auto& r : cmd.start().ranks()) ranks_.push_back(r.rank());
    for (int rank : ranks_) {
      proto::AgentEvent e = Event(generation_);
      e.mutable_worker_ready()->set_rank(rank);
      e.mutable_worker_ready()->set_start_step(step_);
      Send(std::move(e));
      fleet_->Sent();
    }
    step_base_ = step_;
    next_step_ = Clock::time_point::max();  // until the generation's clock is known
    const int64_t g = generation_;
    lock.unlock();
    // The generation's first step comes a second after its first agent's
    // start, for every agent.
    const Clock::time_point first = fleet_->OnStart(index_, g) + 1s;
    lock.lock();
    if (generation_ == g) first_step_at_ = next_step_ = first;
  } else if (cmd.has_stop()) {
    if (silent_) return;
    for (int rank : ranks_) {
      proto::AgentEvent e = Event(cmd.generation());
      auto* x = e.mutable_worker_exited();
      x->set_rank(rank);
      x->set_signal(15);
      x->set_stopped(true);
      Send(std::move(e));
    }
    generation_ = -1;
    ranks_.clear();
    proto::AgentEvent stopped = Event(cmd.generation());
    stopped.mutable_stopped();
    Send(std::move(stopped));
    lock.unlock();
    fleet_->OnStop(index_, cmd.generation());
  }
}

}  // namespace endure::loadgen
