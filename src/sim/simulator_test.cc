#include "sim/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/node_health.h"
#include "core/straggler.h"

namespace endure::sim {
namespace {

using core::LedgerCategory;
using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;

SimConfig Base() {
  SimConfig c;
  c.nodes = 200;
  c.duration = hours(24 * 30);
  c.failure_rate = 20;
  return c;
}

SimConfig Final(SimConfig c) {
  Status s = Finalize(c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

Duration LedgerSum(const RunResult& r) {
  Duration sum{0};
  for (Duration d : r.ledger) sum += d;
  return sum;
}

TEST(Simulator, DeterministicForASeed) {
  SimConfig c = Final(Base());
  RunResult a = SimulateRun(c, 42);
  RunResult b = SimulateRun(c, 42);
  RunResult other = SimulateRun(c, 43);
  EXPECT_EQ(a.failures, b.failures);
  EXPECT_EQ(a.ledger, b.ledger);
  EXPECT_EQ(a.events, b.events);
  EXPECT_NE(a.ledger, other.ledger);
  EXPECT_NE(RunSeed(1, 0), RunSeed(1, 1));
  EXPECT_NE(RunSeed(1, 0), RunSeed(2, 0));
}

TEST(Simulator, WithoutFailuresOnlyCheckpointsAndStartupCost) {
  SimConfig c = Base();
  c.failure_rate = 0;
  c.duration = hours(100);
  c.ckpt_interval = minutes(30);
  c.ckpt_write = minutes(1);
  c.startup = Duration(0);
  c = Final(c);
  RunResult r = SimulateRun(c, 1);
  EXPECT_EQ(r.failures, 0);
  EXPECT_EQ(r.wall, hours(100));
  EXPECT_EQ(LedgerSum(r), r.wall);
  EXPECT_EQ(r.checkpoints, 193);  // 100 h / 31 min
  EXPECT_NEAR(r.ettr(), 30.0 / 31.0, 1e-3);
  EXPECT_EQ(r.category(LedgerCategory::kRecompute), Duration(0));
}

TEST(Simulator, LedgerAddsUpUnderEveryMechanism) {
  SimConfig c = Base();
  c.cause_mix = "llama3";
  c.failure_rate = 30;
  c.spares = 2;
  c.repair = hours(6);
  c.straggler_share = 0.02;
  c = Final(c);
  RunResult r = SimulateRun(c, 7, /*max_incidents=*/1000);
  EXPECT_GT(r.failures, 100);
  EXPECT_EQ(LedgerSum(r), r.wall);
  EXPECT_EQ(r.wall, c.duration);
  for (LedgerCategory cat :
       {LedgerCategory::kProductive, LedgerCategory::kCheckpointStall, LedgerCategory::kDetection,
        LedgerCategory::kRecovery, LedgerCategory::kRecompute, LedgerCategory::kStartup,
        LedgerCategory::kOther}) {
    EXPECT_GT(r.category(cat), Duration(0)) << core::LedgerCategoryName(cat);
  }
  EXPECT_GT(r.replacements, 0);
  EXPECT_GT(r.stragglers, 0);
  int64_t by_cause = 0;
  for (int64_t n : r.failures_by_cause) by_cause += n;
  EXPECT_EQ(by_cause, r.failures);
  const Incident* failure = nullptr;
  for (const Incident& in : r.incidents) {
    if (in.kind == IncidentKind::kFailure && failure == nullptr) failure = &in;
  }
  ASSERT_NE(failure, nullptr);
  EXPECT_THAT(failure->reason, testing::HasSubstr("failed with"));
}

TEST(Simulator, SparesCutTheWaitForRepairs) {
  SimConfig c = Base();
  c.path_overrides = {{"node_failure", "evict"}};
  c.repair = hours(12);
  SimConfig no_spares = Final(c);
  c.spares = 8;
  SimConfig spares = Final(c);
  RunResult waiting = SimulateRun(no_spares, 3);
  RunResult swapping = SimulateRun(spares, 3);
  // Without spares every eviction waits for a repair.
  EXPECT_GT(waiting.category(LedgerCategory::kOther), hours(24));
  EXPECT_LT(swapping.category(LedgerCategory::kOther),
            waiting.category(LedgerCategory::kOther) / 4);
  EXPECT_GT(swapping.ettr(), waiting.ettr() + 0.1);
  EXPECT_GT(swapping.replacements, 0);
}

TEST(Simulator, StragglersSlowTheJobUntilReplaced) {
  SimConfig c = Base();
  c.failure_rate = 0;
  c.straggler_share = 0.05;
  c.straggler_factor = 2;
  c.startup = Duration(0);
  c.health_check = false;
  c.straggler_mitigation = false;
  SimConfig tolerated = Final(c);
  c.straggler_mitigation = true;
  c.spares = 50;
  SimConfig replaced = Final(c);
  RunResult slow = SimulateRun(tolerated, 5);
  RunResult fast = SimulateRun(replaced, 5);
  ASSERT_GT(slow.stragglers, 0);
  // Unmitigated, the stragglers stay and the job runs at half speed.
  EXPECT_NEAR(slow.ettr(), 0.5 * 1800 / 1810, 0.01);
  EXPECT_GT(slow.category(LedgerCategory::kDetection), Duration(0));
  // With spares each is swapped out once flagged (one per generation).
  EXPECT_GT(fast.ettr(), 0.93);
  EXPECT_GT(fast.replacements, 0);
}

TEST(Simulator, GivesUpWhenTheRetryBudgetIsExhausted) {
  SimConfig c = Base();
  c.failure_rate = 2000;  // 400 failures a day
  c.policy.max_restarts_in_window = 5;
  c = Final(c);
  RunResult r = SimulateRun(c, 1);
  EXPECT_TRUE(r.gave_up);
  EXPECT_THAT(r.stop_reason, testing::HasSubstr("retry budget exhausted"));
  EXPECT_EQ(LedgerSum(r), r.wall);
  EXPECT_GT(r.category(LedgerCategory::kOther), hours(24 * 25));
}

// Issue 12, item 7: independent hardware failures on different nodes never
// make a healthy job "structural". 12,500 nodes x 8 GPUs, 6.5 failures per
// 1000 node-days, 2-minute checkpoints and restarts, 30 days, 20 seeds.
TEST(Simulator, NoHealthyRunGivesUpAtScale) {
  for (const char* mix : {"none", "llama3"}) {
    SimConfig c;
    c.nodes = 12500;
    c.gpus_per_node = 8;
    c.failure_rate = 6.5;
    c.cause_mix = mix;
    c.ckpt_interval = minutes(2);
    c.restart = minutes(2);
    c.duration = hours(24 * 30);
    c = Final(c);
    for (int i = 0; i < 20; ++i) {
      RunResult r = SimulateRun(c, RunSeed(12, i));
      EXPECT_FALSE(r.gave_up) << mix << " seed " << RunSeed(12, i) << ": " << r.stop_reason;
      EXPECT_GT(r.failures, 1500) << mix;
    }
  }
}

const Incident* FindIncident(const RunResult& r, IncidentKind kind, int32_t node) {
  for (const Incident& in : r.incidents) {
    if (in.kind == kind && in.node.value == node) return &in;
  }
  return nullptr;
}

// How many failures of `node` the run had; each must have restarted in place.
int RestartsInPlaceOf(const RunResult& r, int32_t node) {
  int restarts = 0;
  for (const Incident& in : r.incidents) {
    if (in.kind == IncidentKind::kFailure && in.node.value == node) {
      EXPECT_EQ(in.action, "restart_in_place");
      ++restarts;
    }
  }
  return restarts;
}

int64_t Ms(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

// Issue 12, item 4: one scripted failure sequence; every decision in the
// incident log is the core's for the same inputs.
TEST(Simulator, ScriptedDecisionsAreTheCores) {
  SimConfig c;
  c.nodes = 8;
  c.spares = 2;
  c.failure_rate = 0;
  c.duration = hours(48);
  c.ckpt_interval = minutes(30);
  c.health_check = false;
  using K = ScriptedEvent::Kind;
  c.script = {
      {K::kStraggler, hours(1), core::NodeId{3}, "", 1.5},
      {K::kFailure, hours(2), core::NodeId{5}, "node_failure", 1},
      {K::kFailure, hours(5), core::NodeId{5}, "node_failure", 1},
      {K::kFailure, hours(8), core::NodeId{5}, "node_failure", 1},
      {K::kStraggler, hours(10), core::NodeId{1}, "", 1.05},  // below theta: never flagged
  };
  c = Final(c);
  RunResult r = SimulateRun(c, 1, 1000);

  // The straggler: flagged 20 steps of 15 s (10 s slowed 1.5x) after it
  // turned slow; DecideStraggler swaps it for a spare.
  const Incident* s = FindIncident(r, IncidentKind::kStraggler, 3);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->time, hours(1) + seconds(300));
  EXPECT_EQ(s->straggler_costs.slowdown, 1.5);
  EXPECT_EQ(s->straggler_costs.remaining, c.duration - s->time);
  EXPECT_EQ(s->straggler_costs.restart_cost, c.restart);
  // Since the checkpoint that ended at start-up (5m) + 30m + 10s.
  EXPECT_EQ(s->straggler_costs.lost_work, s->time - (minutes(35) + seconds(10)));
  EXPECT_EQ(s->straggler_costs.spares, 2);
  core::StragglerDecision d = core::DecideStraggler(s->straggler_costs);
  EXPECT_EQ(s->action, core::StragglerMoveName(d.move));
  EXPECT_EQ(s->action, "swap_spare");
  EXPECT_THAT(s->reason, testing::EndsWith(d.reason));
  EXPECT_EQ(r.straggler_moves, 1);
  EXPECT_EQ(FindIncident(r, IncidentKind::kStraggler, 1), nullptr);

  // Node 5: three soft strikes (node_failure) within 24h; the policy
  // restarts in place each time, JudgeNode quarantines it at the third.
  EXPECT_EQ(RestartsInPlaceOf(r, 5), 3);
  const Incident* q = FindIncident(r, IncidentKind::kQuarantine, 5);
  ASSERT_NE(q, nullptr);
  const Duration detect = c.detect;
  EXPECT_EQ(q->time, hours(8) + detect);
  std::vector<core::Strike> strikes;
  for (Duration t : {hours(2), hours(5), hours(8)}) {
    strikes.push_back(core::StrikeFor("node_failure", Ms(t + detect)));
  }
  core::NodeHealthOptions health;
  core::NodeVerdict v = core::JudgeNode(strikes, Ms(hours(8) + detect), health);
  EXPECT_EQ(v.state, core::HealthState::kQuarantined);
  EXPECT_THAT(q->reason, testing::EndsWith(": " + v.reason));
  // Two strikes are not enough.
  strikes.pop_back();
  EXPECT_EQ(core::JudgeNode(strikes, Ms(hours(5) + detect), health).state,
            core::HealthState::kSuspect);
  EXPECT_EQ(r.quarantines, 1);
}

// A collective timeout is no evidence against the node that reported it
// (core::DecideFailure, as the controller decides): three on one node within
// the soft window restart it in place and strike nothing, where three
// node_failures quarantine it (above). The simulator once struck every cause
// that was not software, so it quarantined nodes the controller keeps.
TEST(Simulator, AnAmbiguousCauseStrikesNoNode) {
  SimConfig c;
  c.nodes = 8;
  c.spares = 2;
  c.failure_rate = 0;
  c.duration = hours(24);
  c.ckpt_interval = minutes(30);
  c.health_check = false;
  c.cause_mix = "llama3";
  using K = ScriptedEvent::Kind;
  c.script = {
      {K::kFailure, hours(2), core::NodeId{5}, "nccl_watchdog_timeout", 1},
      {K::kFailure, hours(5), core::NodeId{5}, "nccl_watchdog_timeout", 1},
      {K::kFailure, hours(8), core::NodeId{5}, "nccl_watchdog_timeout", 1},
  };
  RunResult r = SimulateRun(Final(c), 1, 1000);
  EXPECT_EQ(RestartsInPlaceOf(r, 5), 3);
  EXPECT_EQ(FindIncident(r, IncidentKind::kQuarantine, 5), nullptr);
  EXPECT_EQ(r.quarantines, 0);
}

TEST(Simulator, SdcCheckRollsBackAndEvicts) {
  SimConfig c;
  c.nodes = 8;
  c.spares = 1;
  c.failure_rate = 0;
  c.duration = hours(24);
  c.ckpt_interval = minutes(10);
  c.sdc_check_every = 100;  // 1000 s
  c.health_check = false;
  c.script = {{ScriptedEvent::Kind::kSdc, hours(3), core::NodeId{2}, "", 1}};
  SimConfig checked = Final(c);
  RunResult r = SimulateRun(checked, 1, 100);
  EXPECT_EQ(r.sdc_events, 1);
  EXPECT_EQ(r.sdc_detected, 1);
  const Incident* in = FindIncident(r, IncidentKind::kSdc, 2);
  ASSERT_NE(in, nullptr);
  EXPECT_EQ(in->action, "rollback_and_evict");
  EXPECT_THAT(in->reason, testing::HasSubstr("rank 0's fingerprint"));
  EXPECT_EQ(r.replacements, 1);
  EXPECT_LT(r.category(LedgerCategory::kRecompute), minutes(40));
  EXPECT_EQ(LedgerSum(r), r.wall);

  // Unchecked, it costs the 6 h until a loss spike shows it.
  c.sdc_check_every = 0;
  RunResult late = SimulateRun(Final(c), 1, 100);
  EXPECT_EQ(late.sdc_undetected, 1);
  EXPECT_GE(late.category(LedgerCategory::kRecompute), hours(6));
  EXPECT_EQ(late.replacements, 0);
  EXPECT_EQ(LedgerSum(late), late.wall);
  EXPECT_LT(late.ettr(), r.ettr() - 0.2);
}

TEST(Simulator, MultiStrikeQuarantinesFlakyNodes) {
  SimConfig c = Base();
  c.failure_rate = 5;
  c.flaky_share = 0.05;
  c.flaky_factor = 200;  // a flaky node fails about once a day
  c.spares = 10;
  c.health_check = false;
  RunResult with = SimulateRun(Final(c), 3);
  EXPECT_GT(with.quarantines, 0);
  c.multi_strike = false;
  RunResult without = SimulateRun(Final(c), 3);
  EXPECT_EQ(without.quarantines, 0);
  EXPECT_GT(without.failures, with.failures);
}

TEST(Simulator, HealthCheckRefusesFlakyNodes) {
  SimConfig c = Base();
  c.flaky_share = 0.1;
  c.health_check_recall = 1;
  c.spares = 40;
  RunResult r = SimulateRun(Final(c), 4, 1000);
  EXPECT_GT(r.health_check_refusals, 5);
  const Incident& first = r.incidents.front();
  EXPECT_EQ(first.kind, IncidentKind::kHealthCheck);
  EXPECT_EQ(first.action, "refuse");
  EXPECT_THAT(first.reason, testing::HasSubstr("hard strike: health_check_failed"));
  EXPECT_EQ(LedgerSum(r), r.wall);
}

TEST(Simulator, StragglerMitigationIsWorthSomething) {
  SimConfig c = Base();
  c.straggler_share = 0.02;
  c.straggler_factor = 1.1;
  c.straggler_factor_max = 1.5;
  c.spares = 20;
  RunResult on = SimulateRun(Final(c), 9);
  c.straggler_mitigation = false;
  RunResult off = SimulateRun(Final(c), 9);
  EXPECT_GT(on.straggler_moves, 0);
  EXPECT_EQ(off.stragglers_flagged, 0);
  EXPECT_GT(on.ettr(), off.ettr() + 0.05);
}

}  // namespace
}  // namespace endure::sim

namespace endure::sim {
namespace {

// In-process restarts (core::ChooseRoute): a failure while training
// keeps the other ranks' state, so nothing since the checkpoint is lost and
// the recovery costs in_process_restart; a hang still restarts from the
// checkpoint (ChooseRoute wants every rank stopped for its stacks).
TEST(Simulator, InProcessRestartsLoseNoSegmentExceptWhereTheRouteSaysFull) {
  SimConfig c = Base();  // one cause, node_failure, restarted in place
  c.failure_rate = 30;
  c.restart = minutes(5);
  c.in_process_restart = seconds(30);
  SimConfig off = Final(c);
  c.in_process = true;
  SimConfig on = Final(c);
  RunResult a = SimulateRun(off, 3, 100), b = SimulateRun(on, 3, 100);
  ASSERT_GT(b.failures, 20);
  EXPECT_EQ(LedgerSum(b), b.wall);
  // Only a failure during a recovery (no rank is training) restarts from
  // the checkpoint, and loses its segment.
  EXPECT_GT(b.in_process_restarts, b.restarts * 9 / 10);
  EXPECT_LT(b.category(LedgerCategory::kRecompute), a.category(LedgerCategory::kRecompute) / 10);
  EXPECT_GT(b.ettr(), a.ettr());
  ASSERT_FALSE(b.incidents.empty());
  EXPECT_EQ(b.incidents[0].route, core::RecoveryRoute::kInProcess);
  EXPECT_THAT(b.incidents[0].route_reason, ::testing::HasSubstr("in-process restart"));
  EXPECT_EQ(a.incidents[0].route, core::RecoveryRoute::kFullRestart);

  // The same failures as hangs: every restart is a full one.
  SimConfig::CauseOverride none, hang;
  none.spec.name = "node_failure";
  none.spec.weight = 0;
  none.has_weight = true;
  hang.spec.name = "hang";
  hang.has_weight = true;
  c.cause_overrides = {none, hang};
  RunResult h = SimulateRun(Final(c), 3, 100);
  EXPECT_EQ(h.in_process_restarts, 0);
  EXPECT_GT(h.category(LedgerCategory::kRecompute), Duration(0));
  ASSERT_FALSE(h.incidents.empty());
  EXPECT_THAT(h.incidents[0].route_reason, ::testing::HasSubstr("a hang stops every rank"));
}

// Issue 14: with no spare, a lost node stops a job until its repair; an
// elastic one (min_nodes) goes on with the others at their pace and grows
// back, in process, when the node is repaired.
TEST(Simulator, AnElasticJobGoesOnWithFewerNodesAndGrowsBackWhenTheNodeIsRepaired) {
  SimConfig c;
  c.nodes = 4;
  c.spares = 0;
  c.failure_rate = 0;
  c.duration = hours(24);
  c.ckpt_interval = minutes(30);
  c.repair = hours(4);
  c.health_check = false;
  c.in_process = true;
  c.in_process_restart = seconds(30);
  c.cause_mix = "llama3";  // faulty_gpu: the node is evicted for repair
  c.script = {{ScriptedEvent::Kind::kFailure, hours(2), core::NodeId{1}, "faulty_gpu", 1}};
  RunResult waits = SimulateRun(Final(c), 1, 100);
  c.min_nodes = 3;
  RunResult elastic = SimulateRun(Final(c), 1, 100);

  // Without min_nodes: the node is evicted and the job waits for its repair.
  ASSERT_EQ(waits.failures, 1);
  EXPECT_EQ(waits.shrinks, 0);
  EXPECT_GE(waits.category(LedgerCategory::kOther), c.repair - minutes(1));

  ASSERT_EQ(elastic.failures, 1);
  EXPECT_EQ(elastic.shrinks, 1);
  EXPECT_EQ(elastic.regrows, 1);
  ASSERT_FALSE(elastic.incidents.empty());
  EXPECT_EQ(elastic.incidents[0].route, core::RecoveryRoute::kShrink);
  EXPECT_EQ(elastic.incidents[0].action, "evict_and_wait_for_repair");
  // Nothing recomputed: the failure and the regrow both kept the state.
  EXPECT_EQ(elastic.category(LedgerCategory::kRecompute), Duration(0));
  // Four hours on 3 nodes of 4: a quarter of them is lost to the slower
  // steps (booked as other), not all of them to waiting.
  const double other_h = Seconds(elastic.category(LedgerCategory::kOther)) / 3600;
  EXPECT_NEAR(other_h, 4.0 / 4, 0.05);
  EXPECT_EQ(LedgerSum(elastic), elastic.wall);
  EXPECT_GT(elastic.ettr(), waits.ettr() + 0.1);

  // Fewer nodes than min_nodes would leave: the job waits, as without it.
  c.min_nodes = 4;
  RunResult strict = SimulateRun(Final(c), 1, 100);
  EXPECT_EQ(strict.shrinks, 0);
  EXPECT_EQ(strict.ettr(), waits.ettr());
}

TEST(Simulator, MinNodesIsCheckedAgainstTheJob) {
  SimConfig c;
  c.nodes = 4;
  c.min_nodes = 5;
  c.in_process = true;
  EXPECT_THAT(Finalize(c).message(), ::testing::HasSubstr("min-nodes"));
  c.min_nodes = 2;
  c.in_process = false;
  EXPECT_THAT(Finalize(c).message(), ::testing::HasSubstr("set in-process too"));
}

}  // namespace
}  // namespace endure::sim
