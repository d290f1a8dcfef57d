#include "core/anomaly_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

namespace endure::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

StepNumber S(int64_t s) { return StepNumber{s}; }

LossAnomaly NaNAt(int64_t step) {
  LossAnomalyDetector d({});
  return *d.Observe(S(step), std::numeric_limits<double>::quiet_NaN());
}

LossAnomaly SpikeAt(int64_t step) {
  LossAnomaly a;
  a.step = S(step);
  a.kind = LossAnomalyKind::kSpike;
  a.loss = 9;
  a.reason = "loss 9 at step " + std::to_string(step) + " is a spike";
  return a;
}

const std::vector<StepNumber> kCheckpoints = {S(100), S(60), S(80), S(120)};

TEST(AnomalyPolicy, RollsBackToTheNewestCheckpointBeforeTheAnomaly) {
  AnomalyPolicy p({});
  AnomalyDecision d = p.Decide(NaNAt(120), kCheckpoints);
  EXPECT_EQ(d.action, AnomalyAction::kRollBack);
  EXPECT_EQ(d.restore_step, S(100));  // not 120 itself: that state is suspect
  EXPECT_TRUE(d.skip_steps.empty());
  EXPECT_EQ(d.reason,
            "loss is NaN at step 120: rolling back to the checkpoint of step 100, the newest "
            "before step 120");
}

TEST(AnomalyPolicy, NoCheckpointMeansTheInitialParameters) {
  AnomalyPolicy p({});
  AnomalyDecision d = p.Decide(NaNAt(30), kCheckpoints);
  EXPECT_EQ(d.action, AnomalyAction::kRollBack);
  EXPECT_FALSE(d.restore_step.has_value());
  EXPECT_THAT(d.reason, HasSubstr("the initial parameters (no checkpoint precedes step 30)"));
}

TEST(AnomalyPolicy, RecurrenceAtTheSameStepSkipsItsData) {
  AnomalyPolicy p({});
  EXPECT_EQ(p.Decide(NaNAt(113), kCheckpoints).action, AnomalyAction::kRollBack);
  // Another step in between is a new anomaly, not a recurrence.
  EXPECT_EQ(p.Decide(SpikeAt(105), kCheckpoints).action, AnomalyAction::kRollBack);
  AnomalyDecision d = p.Decide(SpikeAt(113), kCheckpoints);
  EXPECT_EQ(d.action, AnomalyAction::kRollBackAndSkip);
  EXPECT_EQ(d.restore_step, S(100));
  EXPECT_THAT(d.skip_steps, ElementsAre(S(113)));
  EXPECT_EQ(d.reason,
            "loss 9 at step 113 is a spike again after a rollback (first time: loss_nan): "
            "skipping the data of step 113 and rolling back to the checkpoint of step 100, the "
            "newest before step 113 (steps skipped so far: 113)");
  // The skip list is cumulative.
  p.Decide(NaNAt(107), kCheckpoints);
  d = p.Decide(NaNAt(107), kCheckpoints);
  EXPECT_EQ(d.action, AnomalyAction::kRollBackAndSkip);
  EXPECT_THAT(d.skip_steps, ElementsAre(S(107), S(113)));
  EXPECT_THAT(p.skipped_steps(), ElementsAre(S(107), S(113)));
}

TEST(AnomalyPolicy, RecurrenceStopsWhenConfigured) {
  AnomalyPolicyOptions o;
  o.on_recurrence = AnomalyRecurrence::kStop;
  AnomalyPolicy p(o);
  p.Decide(NaNAt(113), kCheckpoints);
  AnomalyDecision d = p.Decide(NaNAt(113), kCheckpoints);
  EXPECT_EQ(d.action, AnomalyAction::kStop);
  EXPECT_FALSE(d.restore_step.has_value());
  EXPECT_THAT(d.reason, HasSubstr("again after a rollback"));
  EXPECT_THAT(d.reason, HasSubstr("configured to stop rather than skip data"));
}

TEST(AnomalyPolicy, AnomalyAtASkippedStepStops) {
  AnomalyPolicy p({});
  p.Decide(NaNAt(113), kCheckpoints);
  p.Decide(NaNAt(113), kCheckpoints);
  AnomalyDecision d = p.Decide(NaNAt(113), kCheckpoints);
  EXPECT_EQ(d.action, AnomalyAction::kStop);
  EXPECT_THAT(d.reason, HasSubstr("although its data is skipped"));
}

TEST(AnomalyPolicy, TooManySkippedStepsStop) {
  AnomalyPolicyOptions o;
  o.max_skipped_steps = 2;
  AnomalyPolicy p(o);
  for (int64_t s : {101, 102}) {
    p.Decide(NaNAt(s), kCheckpoints);
    ASSERT_EQ(p.Decide(NaNAt(s), kCheckpoints).action, AnomalyAction::kRollBackAndSkip);
  }
  EXPECT_EQ(p.Decide(NaNAt(103), kCheckpoints).action, AnomalyAction::kRollBack);
  AnomalyDecision d = p.Decide(NaNAt(103), kCheckpoints);
  EXPECT_EQ(d.action, AnomalyAction::kStop);
  EXPECT_THAT(d.reason, HasSubstr("2 steps were skipped already (101, 102; at most 2)"));
  EXPECT_THAT(d.skip_steps, ElementsAre(S(101), S(102)));
}

TEST(AnomalyPolicy, ParsesTheRecurrenceSetting) {
  EXPECT_EQ(*ParseAnomalyRecurrence("skip"), AnomalyRecurrence::kSkipStep);
  EXPECT_EQ(*ParseAnomalyRecurrence("stop"), AnomalyRecurrence::kStop);
  EXPECT_THAT(ParseAnomalyRecurrence("ignore").status().message(),
              HasSubstr("\"skip\" or \"stop\""));
  EXPECT_EQ(AnomalyActionName(AnomalyAction::kRollBackAndSkip), "roll_back_and_skip");
}

}  // namespace
}  // namespace endure::core
