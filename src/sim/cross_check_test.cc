// Issue 12, item 8: one scripted failure sequence driven through the
// controller's decision core (core::JobMachine, with the controller shell's
// strike judging) and through the simulator, which must take the same
// decisions, for the same nodes, in the same order, at the same times. How
// the failure policies combine is one function both call
// (core::DecideFailure, tested in core/failure_decision_test.cc); what this
// test holds together is the two event models: when each decision is asked,
// with which facts, and what the job does on its timeline after it.
//
// The script, on 4 nodes and one spare (node 4), 10 s steps, a checkpoint
// every 40 steps and an SDC check every 25:
//  - node 2 runs 1.5x slower from step 41 (the job knows it has 3000 steps);
//  - node 1 corrupts its replica in step 1045, found by the check of 1050;
//  - node 3 fails with the soft hardware cause node_failure in steps 1651,
//    2051 and 2451: more than an hour apart, all within the soft window.
// An evicted or quarantined node is repaired and comes back after 2 h, as a
// spare; the simulator releases its strikes then, and so does the controller
// path here (the operator's `endure nodes release` after the repair).
//
// Where the two models differ, the script's inputs are chosen so that the
// decisions' inputs are identical (each place says why).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/job_machine.h"
#include "core/node_health.h"
#include "core/straggler.h"
#include "sim/simulator.h"

namespace endure::sim {
namespace {

using core::JobAction;
using core::NodeId;
using core::StepNumber;
using testing::EndsWith;
using testing::HasSubstr;

// ---- The script (seconds since the job started) ----

constexpr double kStep = 10;
constexpr int64_t kCkptEvery = 40;  // steps: ckpt_interval 400 s
constexpr double kCkptWrite = 10;
constexpr double kRestart = 120;  // the start-up, and every restart
constexpr double kDetect = 30;    // node_failure's detection latency: the exit is reported then
constexpr double kRepair = 7200;
constexpr int64_t kSdcEvery = 25;
constexpr int kWindow = 20;  // the straggler detector's window, in steps
constexpr double kSlowFactor = 1.5;
constexpr int64_t kTotalSteps = 3000;
constexpr int kNodes = 4;
constexpr int kSpares = 1;

// Training time plus the checkpoint write of one 40-step segment.
constexpr double kSegment = kCkptEvery * kStep + kCkptWrite;  // 410 s

// The inputs: when each scripted event happens.
// Step 40 ends at 120 + 400 and its checkpoint is written by 530: node 2 is
// slow from the start of step 41.
constexpr double kSlowAt = kRestart + kCkptEvery * kStep + kCkptWrite;  // 530
// The expected timeline, which both paths must follow. The straggler is
// flagged after its window of 20 slowed steps (step 60); the job restarts
// from step 40.
constexpr double kFlagAt = kSlowAt + kWindow * kSlowFactor * kStep;  // 830
constexpr double kGen1 = kFlagAt + kRestart;                         // 950, from step 40
// Segment 25 of generation 1 holds steps 1041..1080; the corruption is in
// the middle of step 1045 and the check of step 1050 finds it.
constexpr double kSdcAt = kGen1 + 25 * kSegment + 4.5 * kStep;    // 11245
constexpr double kSdcFound = kGen1 + 25 * kSegment + 10 * kStep;  // 11300
constexpr double kGen2 = kSdcFound + kRestart;                    // 11420, from step 1000
constexpr double kFail1 = kGen2 + 16 * kSegment + 10.5 * kStep;   // 18085, step 1651
constexpr double kGen3 = kFail1 + kDetect + kRestart;             // 18235, from step 1640
constexpr double kFail2 = kGen3 + 10 * kSegment + 10.5 * kStep;   // 22440, step 2051
constexpr double kGen4 = kFail2 + kDetect + kRestart;             // 22590, from step 2040
constexpr double kFail3 = kGen4 + 10 * kSegment + 10.5 * kStep;   // 26795, step 2451
constexpr double kLastStart = kFail3 + kDetect + kRestart;        // 26945, from step 2440
// The simulator's remaining time is its run's remaining wall time; the
// controller's is the steps the workers say are left at the current step
// time. The run ends where the two agree at the flag: 2940 steps of 15 s.
constexpr double kRunEnd = kFlagAt + (kTotalSteps - 60) * kSlowFactor * kStep;  // 44930

std::vector<ScriptedEvent> Script() {
  using K = ScriptedEvent::Kind;
  return {
      {K::kStraggler, FromSeconds(kSlowAt), NodeId{2}, "", kSlowFactor},
      {K::kSdc, FromSeconds(kSdcAt), NodeId{1}, "", 1},
      {K::kFailure, FromSeconds(kFail1), NodeId{3}, "node_failure", 1},
      {K::kFailure, FromSeconds(kFail2), NodeId{3}, "node_failure", 1},
      {K::kFailure, FromSeconds(kFail3), NodeId{3}, "node_failure", 1},
  };
}

SimConfig Config() {
  SimConfig c;
  c.nodes = kNodes;
  c.spares = kSpares;
  c.failure_rate = 0;  // the script only
  c.duration = FromSeconds(kRunEnd);
  c.step_time = FromSeconds(kStep);
  c.ckpt_interval = FromSeconds(kCkptEvery * kStep);
  c.ckpt_write = FromSeconds(kCkptWrite);
  c.restart = FromSeconds(kRestart);
  c.detect = FromSeconds(kDetect);
  c.repair = FromSeconds(kRepair);
  c.straggler_window = kWindow;
  c.sdc_check_every = kSdcEvery;
  // Off: the simulator would add the health check's time to the
  // straggler's restart cost; the controller's estimate of it
  // (isolation.restart_cost) leaves the check out.
  c.health_check = false;
  c.script = Script();
  Status s = Finalize(c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

// One decision, as either path records it. Equal: the same time, cause,
// node and action; the reasons are compared apart, where the two paths'
// words are the core's.
struct Decision {
  double at = 0;
  std::string cause;
  int node = -1;
  std::string action;
  std::string reason;

  bool operator==(const Decision& o) const {
    return at == o.at && cause == o.cause && node == o.node && action == o.action;
  }
};

void PrintTo(const Decision& d, std::ostream* os) {
  *os << "{" << d.at << "s, " << d.cause << ", node " << d.node << ", " << d.action << "}";
}

int64_t Ms(double s) { return static_cast<int64_t>(s * 1000); }

std::string Fingerprint(int64_t step, bool corrupted) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(step) ^ (corrupted ? 0x8000000000ULL : 0));
  return buf;
}

// ---- The controller path ----

// Plays the cluster and the controller shell around a core::JobMachine:
// the workers' steps, checkpoints and fingerprints on the script's timeline,
// the scripted faults, the repaired nodes' return, and the shell's handling
// of strikes (the ledger's strikes since the release, judged by
// core::JudgeNode at the scripted time; a soft strike that quarantines posts
// NodeQuarantined back to the machine). No Tick: the script has no hang and
// no silent agent, and every restart in it is immediate (asserted), so no
// timer of the machine's has anything to decide.
class ControllerPath {
 public:
  explicit ControllerPath(const SimConfig& c) : script_(c.script), m_(Options(c), {}, At(0)) {
    health_.soft_strikes = static_cast<int>(c.soft_strikes);
    health_.soft_window = c.soft_window;
    // Node 4 registers last: the first generation runs on nodes 0-3.
    for (int n = 0; n < kNodes + kSpares; ++n) Register(NodeId{n});
  }

  void RunUntil(double end) {
    constexpr double kNone = std::numeric_limits<double>::infinity();
    while (!done_) {
      const double t_step = running_ ? step_start_ + kStep * SlowestAt(step_start_) : kNone;
      const double t_ready = ready_at_.value_or(kNone);
      const double t_exit = exit_ ? exit_->second : kNone;
      const double t_script = next_ < script_.size() ? Seconds(script_[next_].at) : kNone;
      const double t_back = back_.empty() ? kNone : back_.begin()->first;
      const double t = std::min({t_step, t_ready, t_exit, t_script, t_back});
      if (t > end) break;
      now_ = t;
      if (t == t_step) {
        EndStep();
      } else if (t == t_ready) {
        Ready();
      } else if (t == t_script) {
        OnScripted(script_[next_++]);
      } else if (t == t_exit) {
        Exit();
      } else {
        const NodeId node = back_.begin()->second;
        back_.erase(back_.begin());
        strikes_since_release_.erase(node.value);  // repaired and released
        Register(node);
      }
    }
  }

  std::vector<Decision> decisions;  // the incidents and the shell's quarantines, in order
  std::vector<core::StrikeNodeAction> strikes;
  std::vector<core::StartGenerationAction> starts;
  std::vector<int64_t> restored;  // each generation's start step
  std::optional<core::NodeVerdict> quarantine_verdict;
  const core::JobMachine& machine() const { return m_; }

 private:
  static core::JobMachineOptions Options(const SimConfig& c) {
    core::JobMachineOptions o;
    o.nodes = kNodes;
    o.ranks_per_node = 1;
    // The simulator's policy, paths per cause included.
    o.recovery = c.policy;
    o.isolation.straggler.theta = c.straggler_theta;
    o.isolation.straggler.window = kWindow;
    // The simulator flags a straggler once its whole window was slow: M = N.
    // (By default the controller flags after 12 slow steps of 20.)
    o.isolation.straggler.min_slow = kWindow;
    o.isolation.sdc_check_every = kSdcEvery;
    o.isolation.restart_cost = c.restart;
    o.isolation.replacement_wait = c.repair;
    o.isolation.health.soft_strikes = static_cast<int>(c.soft_strikes);
    o.isolation.health.soft_window = c.soft_window;
    return o;
  }

  static core::TimePoint At(double s) { return core::At(FromSeconds(s)); }

  // Named as the simulator names nodes in its reasons, so that the core's
  // reasons compare as text.
  static std::string Name(NodeId n) { return "node " + std::to_string(n.value); }

  void Register(NodeId n) { Feed(core::NodeUp{n, Name(n), 1, ""}); }

  // The slowdown of a step that starts at `t`: the slowest member's.
  double SlowestAt(double t) const {
    double f = 1;
    for (NodeId n : members_) f = std::max(f, FactorAt(n, t));
    return f;
  }
  double FactorAt(NodeId n, double t) const {
    auto it = slow_.find(n.value);
    return it != slow_.end() && it->second.second <= t ? it->second.first : 1.0;
  }
  core::Rank RankOf(NodeId n) const {
    auto it = std::find(members_.begin(), members_.end(), n);
    return core::Rank{static_cast<int>(it - members_.begin())};
  }
  bool InJob(NodeId n) const {
    return std::find(members_.begin(), members_.end(), n) != members_.end();
  }

  void EndStep() {
    const int64_t step = ++step_;
    const double began = step_start_;
    const core::Generation g = m_.generation();
    for (int r = 0; r < kNodes && running_; ++r) {
      core::StepEnd e{g,
                      core::Rank{r},
                      StepNumber{step},
                      2.0,
                      0,
                      StepNumber{r == 0 && step % kCkptEvery == 0 ? step : -1}};
      e.compute_s = kStep * FactorAt(members_[r], began);
      e.total_steps = kTotalSteps;
      Feed(e);
    }
    if (!running_) return;
    step_start_ = now_;
    if (step % kCkptEvery == 0) {
      checkpoints_.push_back(step);
      step_start_ += kCkptWrite;  // the next step waits for the write
    }
    if (step % kSdcEvery == 0) {
      for (int r = 0; r < kNodes && running_; ++r) {
        const bool bad = corrupt_ && corrupt_->first == members_[r] && corrupt_->second < now_;
        Feed(core::FingerprintReported{g, core::Rank{r}, StepNumber{step}, Fingerprint(step, bad)});
      }
    }
  }

  void Ready() {
    ready_at_.reset();
    for (int r = 0; r < kNodes; ++r) {
      Feed(core::WorkerReady{m_.generation(), core::Rank{r}, StepNumber{step_}, 0});
    }
    running_ = true;
    step_start_ = now_;
  }

  void OnScripted(const ScriptedEvent& e) {
    // As in the simulator: an event on a node that is not running the job
    // then is dropped.
    if (!running_ || !InJob(e.node)) return;
    switch (e.kind) {
      case ScriptedEvent::Kind::kStraggler:
        slow_[e.node.value] = {e.factor, now_};
        break;
      case ScriptedEvent::Kind::kSdc:
        corrupt_ = {e.node, now_};
        break;
      case ScriptedEvent::Kind::kFailure:
        // The step in flight never ends; the agent reports the exit when
        // the simulator's detection latency has passed.
        running_ = false;
        exit_ = {e.node, now_ + kDetect};
        exit_cause_ = e.cause;
        break;
    }
  }

  void Exit() {
    const NodeId node = exit_->first;
    exit_.reset();
    core::WorkerExitEvent e{m_.generation(), RankOf(node), node, 1, std::nullopt};
    // The simulator's soft hardware cause, as a site log rule would name it.
    // (The shipped rules' hardware causes all say evict_node, which isolates
    // the node at its first failure.)
    e.log_cause = exit_cause_;
    e.log_action = core::LogAction::kRestart;
    Feed(e);
  }

  void Feed(const core::JobEvent& event) {
    const size_t seen = m_.incidents().size();
    std::vector<JobAction> actions = m_.Step(event, At(now_));
    for (size_t i = seen; i < m_.incidents().size(); ++i) {
      const core::Incident& inc = m_.incidents()[i];
      decisions.push_back({now_, inc.cause.name, inc.node.value, inc.action, inc.reason});
    }
    Handle(actions);
  }

  // Carries out the machine's actions as the shell and the agents would.
  void Handle(const std::vector<JobAction>& actions) {
    const core::Generation g = m_.generation();
    bool stopped = false;
    std::vector<NodeId> evicted;
    std::vector<core::NodeQuarantined> posted;
    for (const JobAction& a : actions) {
      if (const auto* s = std::get_if<core::StrikeNodeAction>(&a)) {
        RecordStrike(*s, posted);
      } else if (const auto* e = std::get_if<core::EvictNodeAction>(&a)) {
        evicted.push_back(e->node);
        slow_.erase(e->node.value);  // a repair cures it
        back_.emplace(now_ + kRepair, e->node);
      } else if (std::holds_alternative<core::StopGenerationAction>(a)) {
        stopped = true;
        running_ = false;
        corrupt_.reset();  // the only stop after it is its own rollback
      } else if (const auto* s = std::get_if<core::StartGenerationAction>(&a)) {
        Start(*s);
      } else if (const auto* f = std::get_if<core::FinishAction>(&a)) {
        ADD_FAILURE() << "at " << now_ << "s the job finished: " << f->reason;
        done_ = true;
      }
    }
    // The shell posts its quarantines back; the agents' stops come later.
    for (const core::NodeQuarantined& q : posted) Feed(q);
    if (!stopped) return;
    const std::vector<NodeId> members = members_;
    for (NodeId n : members) {
      if (std::find(evicted.begin(), evicted.end(), n) == evicted.end()) {
        Feed(core::GenerationStoppedEvent{g, n});
      }
    }
    if (!ready_at_ && !done_) {
      ADD_FAILURE() << "at " << now_ << "s the job did not restart at once (phase "
                    << core::JobPhaseName(m_.phase()) << ")";
      done_ = true;
    }
  }

  // ControllerShell::RecordStrike.
  void RecordStrike(const core::StrikeNodeAction& a, std::vector<core::NodeQuarantined>& posted) {
    strikes.push_back(a);
    std::vector<core::Strike>& ledger = strikes_since_release_[a.node.value];
    ledger.push_back(core::StrikeFor(a.cause, Ms(now_), a.detail));
    if (a.hard) return;  // the machine has stopped using the node
    const core::NodeVerdict v = core::JudgeNode(ledger, Ms(now_), health_);
    if (v.state != core::HealthState::kQuarantined) return;
    decisions.push_back({now_, a.cause, a.node.value, "quarantine", v.reason});
    quarantine_verdict = v;
    posted.push_back({a.node, v.reason});
  }

  void Start(const core::StartGenerationAction& s) {
    starts.push_back(s);
    members_ = s.nodes;
    if (s.abandoned_from.value >= 0) {
      std::erase_if(checkpoints_, [&](int64_t c) { return c >= s.abandoned_from.value; });
    }
    // The newest checkpoint at or before the bound (-1: the newest).
    int64_t from = 0;
    for (int64_t c : checkpoints_) {
      if (s.restore_step.value < 0 || c <= s.restore_step.value) from = std::max(from, c);
    }
    step_ = from;
    restored.push_back(from);
    ready_at_ = now_ + kRestart;
  }

  const std::vector<ScriptedEvent> script_;
  core::JobMachine m_;
  core::NodeHealthOptions health_;
  double now_ = 0;
  size_t next_ = 0;
  bool done_ = false;
  std::vector<NodeId> members_;
  bool running_ = false;
  double step_start_ = 0;
  int64_t step_ = 0;  // the last step completed
  std::optional<double> ready_at_;
  std::vector<int64_t> checkpoints_;
  std::map<int32_t, std::pair<double, double>> slow_;  // node -> (factor, since)
  std::optional<std::pair<NodeId, double>> corrupt_;   // node, since
  std::optional<std::pair<NodeId, double>> exit_;      // node, reported at
  std::string exit_cause_;
  std::multimap<double, NodeId> back_;  // repaired nodes' return
  std::map<int32_t, std::vector<core::Strike>> strikes_since_release_;
};

// ---- The simulator path ----

std::vector<Decision> SimDecisions(const RunResult& r) {
  std::vector<Decision> out;
  for (const Incident& in : r.incidents) {
    out.push_back({Seconds(in.time), in.cause, in.node.value, in.action, in.reason});
  }
  return out;
}

TEST(CrossCheck, TheControllersCoreAndTheSimulatorDecideTheSameForOneScript) {
  const SimConfig c = Config();
  ControllerPath controller(c);
  // To the last restart and 20 steps into it: nothing is decided after it.
  controller.RunUntil(kLastStart + 20 * kStep + 1);
  const RunResult sim = SimulateRun(c, /*seed=*/1, /*max_incidents=*/100);

  const std::vector<Decision> expected = {
      {kFlagAt, "straggler", 2, "swap_spare", ""},
      {kSdcFound, "sdc", 1, "rollback_and_evict", ""},
      {kFail1 + kDetect, "node_failure", 3, "restart_in_place", ""},
      {kFail2 + kDetect, "node_failure", 3, "restart_in_place", ""},
      {kFail3 + kDetect, "node_failure", 3, "restart_in_place", ""},
      {kFail3 + kDetect, "node_failure", 3, "quarantine", ""},
  };
  const std::vector<Decision> sim_decisions = SimDecisions(sim);
  EXPECT_EQ(controller.decisions, expected);
  EXPECT_EQ(sim_decisions, expected);
  ASSERT_EQ(controller.decisions.size(), expected.size());
  ASSERT_EQ(sim_decisions.size(), expected.size());
  const std::vector<Decision>& ctl = controller.decisions;
  const std::vector<Decision>& sm = sim_decisions;

  // The straggler: DecideStraggler was given the same numbers on both paths.
  // The simulator's inputs are the script's: the controller measures a 15 s
  // step (compute 15 s against the peers' 10 s: 1.5x), 2940 steps to go, 20
  // steps since the checkpoint of step 40, one spare, and the configured
  // restart cost.
  const core::StragglerCosts& costs = sim.incidents[0].straggler_costs;
  EXPECT_EQ(costs.slowdown, kSlowFactor);
  EXPECT_EQ(costs.step_time, FromSeconds(kSlowFactor * kStep));
  EXPECT_EQ(costs.remaining, FromSeconds((kTotalSteps - 60) * kSlowFactor * kStep));
  EXPECT_EQ(costs.restart_cost, c.restart);
  EXPECT_EQ(costs.lost_work, FromSeconds(kWindow * kSlowFactor * kStep));
  EXPECT_EQ(costs.spares, kSpares);
  const core::StragglerDecision straggler = core::DecideStraggler(costs);
  EXPECT_THAT(sm[0].reason, EndsWith("; " + straggler.reason));
  EXPECT_THAT(ctl[0].reason, EndsWith("; " + straggler.reason));
  EXPECT_THAT(ctl[0].reason, HasSubstr("rank 2 computed 1.50x the peers' median (15.0s vs 10.0s)"));

  // The SDC: both roll back to the newest checkpoint at or before the last
  // check that agreed (1025: the checkpoint of step 1000, before the one of
  // 1040, which holds the corruption) and strike node 1 hard. The verdicts'
  // own words differ: the simulator's checker stands in with three replicas.
  const std::string rollback =
      "; rolling back to the newest checkpoint at or before step 1025, the last check that "
      "agreed; node 1 struck (sdc, hard) and evicted";
  EXPECT_THAT(sm[1].reason, EndsWith(rollback));
  EXPECT_THAT(ctl[1].reason, EndsWith(rollback));

  // Node 3's failures: RecoveryPolicy's reasons are the same text (step,
  // class, path); the controller's add the worker's exit before them.
  for (int i = 2; i <= 4; ++i) {
    EXPECT_THAT(sm[i].reason, HasSubstr("node 3 failed with node_failure at step"));
    EXPECT_THAT(ctl[i].reason, EndsWith("; " + sm[i].reason));
  }
  // The third soft strike within the window quarantines node 3: JudgeNode
  // over the same strikes at the same times says the same.
  ASSERT_TRUE(controller.quarantine_verdict.has_value());
  EXPECT_THAT(controller.quarantine_verdict->reason, HasSubstr("3 soft strikes within"));
  EXPECT_THAT(sm[5].reason, EndsWith(": " + controller.quarantine_verdict->reason));

  // The strikes the controller's core asked for.
  std::vector<std::string> strikes;
  for (const core::StrikeNodeAction& s : controller.strikes) {
    strikes.push_back(std::to_string(s.node.value) + " " + s.cause + (s.hard ? " hard" : " soft"));
  }
  EXPECT_EQ(strikes,
            (std::vector<std::string>{"2 straggler soft", "1 sdc hard", "3 node_failure soft",
                                      "3 node_failure soft", "3 node_failure soft"}));

  // Which nodes each generation ran on (as sets: the rank order is the
  // machine's, the simulator's slots are its own) and where it restored
  // from: the spare replaces the straggler, the repaired node 2 replaces
  // node 1, the repaired node 1 replaces the quarantined node 3. Three
  // replacements, as in the simulator.
  std::vector<std::vector<int>> nodes;
  for (const core::StartGenerationAction& s : controller.starts) {
    std::vector<int> ids;
    for (NodeId n : s.nodes) ids.push_back(n.value);
    std::sort(ids.begin(), ids.end());
    nodes.push_back(ids);
  }
  EXPECT_EQ(
      nodes,
      (std::vector<std::vector<int>>{
          {0, 1, 2, 3}, {0, 1, 3, 4}, {0, 2, 3, 4}, {0, 2, 3, 4}, {0, 2, 3, 4}, {0, 1, 2, 4}}));
  EXPECT_EQ(controller.restored, (std::vector<int64_t>{0, 40, 1000, 1640, 2040, 2440}));
  EXPECT_EQ(sim.replacements, 3);
  EXPECT_EQ(sim.quarantines, 1);
  EXPECT_EQ(sim.sdc_detected, 1);
  EXPECT_EQ(sim.straggler_moves, 1);
  EXPECT_EQ(controller.machine().phase(), core::JobPhase::kRunning);
}

}  // namespace
}  // namespace endure::sim
