// Simulated agents for load (tests and controller_load_bench): N agents in
// this process attached to a controller over the real gRPC protocol. Each
// registers with 8 slots, heartbeats every second, answers StartGeneration
// (each rank ready) and Stop (each rank's exit, then GenerationStopped) as
// the agent does, and reports its ranks' steps every step: in one NodeSteps
// (as the agent does), or with `per_rank` a StepProgress for each rank (as
// agents did before node reports, and as a controller of then reads them).
// A channel serves 8 agents, each its own connection. One send loop
// drives them all (every 20 ms); its worst lateness says whether this
// process kept up.
#pragma once

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "proto/endure.grpc.pb.h"
#include "proto/endure.pb.h"

namespace endure::loadgen {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
inline constexpr int kSlotsPerAgent = 8;

double WallSeconds();
double Since(Clock::time_point t);

// ---- One simulated agent: a bidirectional stream, writes one at a time ----

class SimulatedAgents;

class SimAgent final : public grpc::ClientBidiReactor<proto::AgentEvent, proto::AgentCommand> {
 public:
  SimAgent(SimulatedAgents* fleet, int index, std::string name)
      : fleet_(fleet), index_(index), name_(std::move(name)) {}

  void Attach(proto::Controller::Stub* stub) {
    stub->async()->Attach(&context_, this);
    proto::AgentEvent hello = Event(-1);
    proto::Register* r = hello.mutable_register_();
    r->set_node_id(name_);
    r->set_slots(kSlotsPerAgent);
    r->set_host("127.0.0.1");
    r->set_pid(getpid());
    Send(std::move(hello));
    StartRead(&command_);
    StartCall();
  }

  // Called by the fleet's send loop: a heartbeat and this step's reports,
  // when due.
  void Drive(Clock::time_point now, Clock::duration step_time);
  void Close() { context_.TryCancel(); }
  void FallSilent() {
    std::lock_guard<std::mutex> lock(mu_);
    silent_ = true;
  }
  bool done() const { return done_.load(); }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writes_.pop_front();
    if (!ok) {
      broken_ = true;
      writes_.clear();
    }
    if (!writes_.empty()) {
      StartWrite(&writes_.front());
    } else {
      writing_ = false;
    }
  }
  void OnReadDone(bool ok) override;
  // The stream has ended (the controller closed it, died, or Close): no
  // operation may start on it from here on (gRPC's reactor contract), so
  // the send loop's next Drive sends nothing.
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    writes_.clear();
    done_ = true;
  }

 private:
  proto::AgentEvent Event(int64_t generation) const;
  // Under mu_ (or before StartCall).
  void Send(proto::AgentEvent e) {
    if (broken_) return;
    writes_.push_back(std::move(e));
    if (!writing_) {
      writing_ = true;
      StartWrite(&writes_.front());
    }
  }

  SimulatedAgents* const fleet_;
  const int index_;
  const std::string name_;
  grpc::ClientContext context_;
  proto::AgentCommand command_;
  std::atomic<bool> done_{false};

  std::mutex mu_;
  std::deque<proto::AgentEvent> writes_;  // front: being written
  bool writing_ = false;
  bool broken_ = false;
  bool silent_ = false;
  int64_t generation_ = -1;  // running; -1: none
  int64_t step_ = 0;
  std::vector<int> ranks_;
  Clock::time_point next_beat_{};
  Clock::time_point next_step_{};
  std::optional<Clock::time_point> last_report_;  // the last node report sent
  int64_t step_base_ = 0;                         // the generation's restore step
  Clock::time_point first_step_at_{};             // its first step, for every agent
};

// ---- The agents, their send loop, what they saw ----

class SimulatedAgents {
 public:
  SimulatedAgents(const std::string& address, const std::string& token, int agents,
                  Clock::duration step_time, bool per_rank = false)
      : token_(token), step_time_(step_time), per_rank_(per_rank) {
    // A channel per 8 agents, each its own connection (local subchannel
    // pool): the controller serves many connections, as in production.
    for (int i = 0; i < agents; ++i) {
      if (i % 8 == 0) {
        grpc::ChannelArguments args;
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        args.SetInt("endure.load_bench.channel", i);  // distinct channels
        auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
        stubs_.push_back(proto::Controller::NewStub(channel));
      }
      agents_.push_back(std::make_unique<SimAgent>(this, i, "load" + std::to_string(i)));
    }
    for (int i = 0; i < agents; ++i) agents_[i]->Attach(stubs_[i / 8].get());
    loop_ = std::thread([this] { Loop(); });
  }
  ~SimulatedAgents() {
    stop_ = true;
    loop_.join();
    for (auto& a : agents_) a->Close();
    for (auto& a : agents_) {
      for (int i = 0; i < 500 && !a->done(); ++i) std::this_thread::sleep_for(10ms);
    }
  }

  SimAgent& agent(int i) { return *agents_[i]; }

  // What the agents saw: commands by kind, the newest step reported.
  // OnStart returns when the generation's first agent started it.
  Clock::time_point OnStart(int agent, int64_t generation) {
    std::lock_guard<std::mutex> lock(mu_);
    newest_start_ = std::max(newest_start_, generation);
    if (generation > started_gen_) {
      started_gen_ = generation;
      started_at_ = Clock::now();
    }
    started_agents_.push_back(agent);
    cv_.notify_all();
    return generation == started_gen_ ? started_at_ : Clock::now();
  }
  void OnStop(int agent, int64_t generation) {
    std::lock_guard<std::mutex> lock(mu_);
    if (generation > stopped_gen_) {
      stopped_gen_ = generation;
      stopped_at_ = Clock::now();
    }
    (void)agent;
    cv_.notify_all();
  }
  void Reported(int64_t step) {
    sent_.fetch_add(1);
    if (step <= newest_step_.load()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (step <= newest_step_.load()) return;
    newest_step_ = step;
    first_reported_[step] = Clock::now();
  }
  // How long ago the first step after `applied` was reported (0: none was).
  double Behind(int64_t applied) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = first_reported_.upper_bound(applied);
    return it == first_reported_.end() ? 0.0 : Since(it->second);
  }
  void Sent() { sent_.fetch_add(1); }

  // Waits until a generation > `after` started (or stopped); its time.
  std::optional<Clock::time_point> WaitStart(int64_t after, Clock::duration limit) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, limit, [&] { return started_gen_ > after; })) return std::nullopt;
    return started_at_;
  }
  std::optional<Clock::time_point> WaitStop(int64_t at_least, Clock::duration limit) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, limit, [&] { return stopped_gen_ >= at_least; })) return std::nullopt;
    return stopped_at_;
  }
  int64_t generation() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_gen_;
  }
  // Members of the newest generation (by agent index).
  std::vector<int> started_agents() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_agents_;
  }
  void ForgetStarts() {
    std::lock_guard<std::mutex> lock(mu_);
    started_agents_.clear();
  }
  int64_t newest_step() const { return newest_step_.load(); }
  bool per_rank() const { return per_rank_; }
  const std::string& token() const { return token_; }
  int64_t sent() const { return sent_.load(); }
  double worst_lateness_ms() const { return late_ms_.load(); }
  void ResetLateness() { late_ms_ = 0; }

 private:
  void Loop() {
    constexpr auto kTurn = 20ms;
    Clock::time_point next = Clock::now();
    while (!stop_) {
      const Clock::time_point now = Clock::now();
      const double late = std::chrono::duration<double, std::milli>(now - next).count();
      if (late > late_ms_.load()) late_ms_ = late;
      for (auto& a : agents_) a->Drive(now, step_time_);
      next += kTurn;
      if (next < Clock::now()) next = Clock::now();
      std::this_thread::sleep_until(next);
    }
  }

  const std::string token_;
  const Clock::duration step_time_;
  const bool per_rank_;
  std::vector<std::unique_ptr<proto::Controller::Stub>> stubs_;
  std::vector<std::unique_ptr<SimAgent>> agents_;
  std::thread loop_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> newest_step_{0};
  std::atomic<int64_t> sent_{0};
  std::atomic<double> late_ms_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t newest_start_ = -1, started_gen_ = -1, stopped_gen_ = -1;
  Clock::time_point started_at_{}, stopped_at_{};
  std::vector<int> started_agents_;
  std::map<int64_t, Clock::time_point> first_reported_;  // step -> its first report
};

}  // namespace endure::loadgen
