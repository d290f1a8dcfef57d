#include "sim/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
  ASSERT_FALSE(r.incidents.empty());
  EXPECT_THAT(r.incidents.front().reason, testing::HasSubstr("failed with"));
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
  c.straggler_detect = minutes(10);
  c.startup = Duration(0);
  SimConfig tolerated = Final(c);
  c.spares = 50;
  SimConfig replaced = Final(c);
  RunResult slow = SimulateRun(tolerated, 5);
  RunResult fast = SimulateRun(replaced, 5);
  ASSERT_GT(slow.stragglers, 0);
  // Without spares the stragglers stay and the job runs at half speed.
  EXPECT_NEAR(slow.ettr(), 0.5 * 1800 / 1810, 0.01);
  EXPECT_GT(slow.category(LedgerCategory::kDetection), Duration(0));
  // With spares they leave at the first checkpoint after detection.
  EXPECT_GT(fast.ettr(), 0.95);
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

}  // namespace
}  // namespace endure::sim
