#include "core/recovery_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace endure::core {
namespace {

using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;
using testing::HasSubstr;

RecoveryPolicyOptions Options() {
  RecoveryPolicyOptions o;
  o.paths["faulty_gpu"] = RecoveryPath::kEvictAndReplace;
  o.paths["switch"] = RecoveryPath::kWaitForRepair;
  return o;
}

FailureEvent Fail(int node, std::string_view cause, int64_t step, int spares = 0) {
  FailureEvent e;
  e.node = NodeId{node};
  e.cause = cause;
  e.step = StepNumber{step};
  e.spares_available = spares;
  return e;
}

TEST(RecoveryPolicy, FollowsTheCausePath) {
  RecoveryPolicy p(Options());
  RecoveryDecision d = p.Step(Fail(1, "software_bug", 10), At(hours(1)));
  EXPECT_EQ(d.action, RecoveryAction::kRestartInPlace);
  EXPECT_EQ(d.delay, Duration(0));
  EXPECT_THAT(d.reason, HasSubstr("node 1 failed with software_bug at step 10"));

  d = p.Step(Fail(2, "faulty_gpu", 20, /*spares=*/3), At(hours(2)));
  EXPECT_EQ(d.action, RecoveryAction::kReplaceWithSpare);
  EXPECT_THAT(d.reason, HasSubstr("swapping in a spare (3 available)"));

  d = p.Step(Fail(3, "faulty_gpu", 30, /*spares=*/0), At(hours(3)));
  EXPECT_EQ(d.action, RecoveryAction::kEvictAndWaitForRepair);
  EXPECT_THAT(d.reason, HasSubstr("no spare available"));

  d = p.Step(Fail(4, "switch", 40), At(hours(4)));
  EXPECT_EQ(d.action, RecoveryAction::kWaitForRepair);
}

TEST(RecoveryPolicy, StopsOnTheSameCauseAtTheSameStepThreeTimes) {
  RecoveryPolicy p(Options());
  // Different nodes, so that neither isolation nor backoff interferes.
  EXPECT_EQ(p.Step(Fail(1, "nan_loss", 500), At(hours(1))).action, RecoveryAction::kRestartInPlace);
  EXPECT_EQ(p.Step(Fail(2, "nan_loss", 500), At(hours(2))).action, RecoveryAction::kRestartInPlace);
  RecoveryDecision d = p.Step(Fail(3, "nan_loss", 500), At(hours(3)));
  EXPECT_EQ(d.action, RecoveryAction::kStop);
  EXPECT_THAT(d.reason, HasSubstr("3rd nan_loss failure at this step"));
  EXPECT_THAT(d.reason, HasSubstr("structural"));
}

TEST(RecoveryPolicy, ARepeatAtTheSameStepOnOneNodeIsNotIsolated) {
  RecoveryPolicyOptions o = Options();
  o.backoff_initial = Duration(0);
  RecoveryPolicy p(o);
  EXPECT_EQ(p.Step(Fail(1, "user_exception", 14), At(minutes(1))).action,
            RecoveryAction::kRestartInPlace);
  // The same node again, at the same step: the step is the problem, not the node.
  EXPECT_EQ(p.Step(Fail(1, "user_exception", 14), At(minutes(2))).action,
            RecoveryAction::kRestartInPlace);
  EXPECT_EQ(p.Step(Fail(1, "user_exception", 14), At(minutes(3))).action, RecoveryAction::kStop);
}

TEST(RecoveryPolicy, FailedRestartsAreNotStructural) {
  RecoveryPolicy p(Options());
  for (int i = 0; i < 5; ++i) {
    FailureEvent e = Fail(i, "software_bug", 500);
    e.during_recovery = true;
    EXPECT_EQ(p.Step(e, At(hours(i))).action, RecoveryAction::kRestartInPlace);
  }
  // Progress in between resets the count too.
  EXPECT_EQ(p.Step(Fail(10, "x", 1), At(hours(10))).action, RecoveryAction::kRestartInPlace);
  EXPECT_EQ(p.Step(Fail(11, "x", 1), At(hours(11))).action, RecoveryAction::kRestartInPlace);
  EXPECT_EQ(p.Step(Fail(12, "x", 2), At(hours(12))).action, RecoveryAction::kRestartInPlace);
}

TEST(RecoveryPolicy, RetryBudgetPerWindow) {
  RecoveryPolicyOptions o = Options();
  o.max_restarts_in_window = 3;
  o.restart_window = hours(1);
  RecoveryPolicy p(o);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.Step(Fail(i, "bug", 100 * i), At(minutes(10 * i))).action,
              RecoveryAction::kRestartInPlace);
  }
  RecoveryDecision d = p.Step(Fail(7, "bug", 1000), At(minutes(30)));
  EXPECT_EQ(d.action, RecoveryAction::kStop);
  EXPECT_THAT(d.reason, HasSubstr("retry budget exhausted (3 restarts within 1h00m, limit 3)"));
  // Once the oldest restarts leave the window, restarting is allowed again.
  EXPECT_EQ(p.Step(Fail(8, "bug", 2000), At(minutes(65))).action, RecoveryAction::kRestartInPlace);
}

TEST(RecoveryPolicy, BacksOffExponentiallyWithoutProgress) {
  RecoveryPolicyOptions o = Options();
  o.evict_node_after = 0;
  o.backoff_initial = seconds(30);
  o.backoff_max = minutes(2);
  RecoveryPolicy p(o);
  FailureEvent e = Fail(5, "oom", 100);
  e.during_recovery = true;
  EXPECT_EQ(p.Step(e, At(minutes(0))).delay, Duration(0));
  EXPECT_EQ(p.Step(e, At(minutes(1))).delay, seconds(30));
  RecoveryDecision d = p.Step(e, At(minutes(2)));
  EXPECT_EQ(d.delay, seconds(60));
  EXPECT_THAT(d.reason, HasSubstr("3rd oom on this node without progress, backing off 1m00s"));
  EXPECT_EQ(p.Step(e, At(minutes(3))).delay, minutes(2));
  EXPECT_EQ(p.Step(e, At(minutes(4))).delay, minutes(2));  // capped
  // Progress past the failing step resets the backoff.
  EXPECT_EQ(p.Step(Fail(5, "oom", 101), At(minutes(5))).delay, Duration(0));
  // Another node failing the same way is independent: no backoff.
  EXPECT_EQ(p.Step(Fail(6, "oom", 101), At(minutes(6))).delay, Duration(0));
}

TEST(RecoveryPolicy, EvictsARepeatOffender) {
  RecoveryPolicyOptions o = Options();
  o.evict_node_after = 2;
  RecoveryPolicy p(o);
  EXPECT_EQ(p.Step(Fail(9, "bug", 10), At(minutes(0))).action, RecoveryAction::kRestartInPlace);
  RecoveryDecision d = p.Step(Fail(9, "bug", 50, /*spares=*/1), At(minutes(20)));
  EXPECT_EQ(d.action, RecoveryAction::kReplaceWithSpare);
  EXPECT_THAT(d.reason, HasSubstr("2nd failure within 1h00m: isolating it"));
  // Outside the window the node starts with a clean slate.
  EXPECT_EQ(p.Step(Fail(9, "bug", 90), At(minutes(200))).action, RecoveryAction::kRestartInPlace);
}

TEST(RecoveryPolicy, DegradedNodesAreReplacedOnlyWhenASpareIsFree) {
  RecoveryPolicyOptions o = Options();
  o.paths["straggler"] = RecoveryPath::kEvictAndReplace;
  o.max_restarts_in_window = 1;
  RecoveryPolicy p(o);
  FailureEvent e = Fail(3, "straggler", 10);
  e.degraded = true;
  RecoveryDecision d = p.Step(e, At(minutes(1)));
  EXPECT_EQ(d.action, RecoveryAction::kTolerate);
  EXPECT_THAT(d.reason, HasSubstr("running slower beats stopping"));
  // Tolerating costs no restart from the budget.
  e.spares_available = 1;
  EXPECT_EQ(p.Step(e, At(minutes(2))).action, RecoveryAction::kReplaceWithSpare);
}

TEST(RecoveryPolicy, ParsesPathsAndValidatesOptions) {
  EXPECT_EQ(*ParseRecoveryPath("evict"), RecoveryPath::kEvictAndReplace);
  EXPECT_THAT(ParseRecoveryPath("reboot").status().message(),
              HasSubstr("expected restart, evict or wait"));
  RecoveryPolicyOptions o;
  o.backoff_max = seconds(1);
  EXPECT_FALSE(o.Validate().ok());
}

}  // namespace
}  // namespace endure::core
