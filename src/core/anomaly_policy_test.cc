#include "core/anomaly_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

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

// ---- Verdicts by replay (deterministic programs) ----

const Generation G0{0}, G1{1}, G2{2};

TEST(AnomalyPolicy, ADeterministicProgramsSpikeIsReplayedFirst) {
  AnomalyPolicy p({});
  const std::vector<RankLoss> losses = {{Rank{0}, 9.0}, {Rank{1}, 9.0}};
  AnomalyDecision d = p.Decide(SpikeAt(120), kCheckpoints, /*replay=*/true, losses, G0);
  EXPECT_EQ(d.action, AnomalyAction::kRollBack);
  EXPECT_EQ(d.restore_step, S(100));
  EXPECT_THAT(d.reason, HasSubstr(", and replaying the step: the program is deterministic"));
  EXPECT_EQ(p.replaying(), S(120));
  // Reports of other steps, of the generation that saw it, or of ranks that
  // were not recorded decide nothing.
  EXPECT_FALSE(p.ReplayedLoss(G0, Rank{0}, S(120), 9.0));
  EXPECT_FALSE(p.ReplayedLoss(G1, Rank{0}, S(119), 2.0));
  EXPECT_FALSE(p.ReplayedLoss(G1, Rank{2}, S(120), 9.0));
  EXPECT_FALSE(p.ReplayedLoss(G1, Rank{1}, S(120), 9.0));
  std::optional<ReplayVerdict> v = p.ReplayedLoss(G1, Rank{0}, S(120), 9.0);
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->reproduced);
  EXPECT_TRUE(v->changed.empty());
  EXPECT_EQ(v->decision.action, AnomalyAction::kContinue);
  EXPECT_THAT(v->decision.reason,
              HasSubstr("replay of step 120: every rank's loss came back bit for bit (rank 0 9, "
                        "rank 1 9): the loss_spike is the data's; training goes on through it, "
                        "nothing skipped"));
  EXPECT_TRUE(v->decision.skip_steps.empty());
  EXPECT_FALSE(p.replaying().has_value());
  ASSERT_EQ(p.data_anomalies().size(), 1u);
  EXPECT_EQ(p.data_anomalies()[0].step, S(120));
  EXPECT_EQ(p.data_anomalies()[0].loss, 9.0);
}

TEST(AnomalyPolicy, AReplayThatDiffersInOneBitIsAFaultNamingTheRank) {
  AnomalyPolicy p({});
  const double first = 2.5;
  const double next = std::nextafter(first, 3.0);  // one bit apart
  p.Decide(NaNAt(120), kCheckpoints, true,
           std::vector<RankLoss>{{Rank{0}, first}, {Rank{1}, std::nan("")}}, G0);
  EXPECT_FALSE(p.ReplayedLoss(G1, Rank{1}, S(120), next));
  std::optional<ReplayVerdict> v = p.ReplayedLoss(G1, Rank{0}, S(120), first);
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->reproduced);
  EXPECT_THAT(v->changed, ElementsAre(Rank{1}));
  EXPECT_EQ(v->decision.action, AnomalyAction::kContinue);
  EXPECT_THAT(v->decision.reason,
              HasSubstr("the loss changed (rank 1 nan then 2.5000000000000004): the loss_nan "
                        "was a fault, not the data"));
  EXPECT_TRUE(p.data_anomalies().empty());

  // One bit is enough: the same with a spike on rank 0.
  AnomalyPolicy q({});
  q.Decide(SpikeAt(130), kCheckpoints, true, std::vector<RankLoss>{{Rank{0}, first}}, G0);
  v = q.ReplayedLoss(G2, Rank{0}, S(130), next);
  ASSERT_TRUE(v.has_value());
  EXPECT_THAT(v->changed, ElementsAre(Rank{0}));
}

TEST(AnomalyPolicy, AReproducedNaNStopsNamingTheStep) {
  AnomalyPolicy p({});
  p.Decide(NaNAt(120), kCheckpoints, true, std::vector<RankLoss>{{Rank{1}, std::nan("")}}, G0);
  std::optional<ReplayVerdict> v = p.ReplayedLoss(G1, Rank{1}, S(120), -std::nan(""));
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->reproduced);
  EXPECT_EQ(v->decision.action, AnomalyAction::kStop);
  EXPECT_THAT(v->decision.reason,
              HasSubstr("training cannot go on through a NaN loss at step 120"));
}

TEST(AnomalyPolicy, AReproducedSpikeIsSkippedOrStopsWhenConfigured) {
  AnomalyPolicyOptions skip;
  skip.on_data_spike = DataSpikeAction::kSkip;
  AnomalyPolicy p(skip);
  p.Decide(SpikeAt(120), kCheckpoints, true, std::vector<RankLoss>{{Rank{0}, 9.0}}, G0);
  std::optional<ReplayVerdict> v = p.ReplayedLoss(G1, Rank{0}, S(120), 9.0);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->decision.action, AnomalyAction::kRollBackAndSkip);
  EXPECT_EQ(v->decision.restore_step, S(100));
  EXPECT_THAT(v->decision.skip_steps, ElementsAre(S(120)));
  EXPECT_THAT(v->decision.reason, HasSubstr("skipping the data of step 120"));
  EXPECT_TRUE(p.data_anomalies().empty());

  AnomalyPolicyOptions stop;
  stop.on_data_spike = DataSpikeAction::kStop;
  AnomalyPolicy q(stop);
  q.Decide(SpikeAt(120), kCheckpoints, true, std::vector<RankLoss>{{Rank{0}, 9.0}}, G0);
  v = q.ReplayedLoss(G1, Rank{0}, S(120), 9.0);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->decision.action, AnomalyAction::kStop);
  EXPECT_THAT(v->decision.reason, HasSubstr("on_data_spike = \"stop\""));
}

TEST(AnomalyPolicy, WithoutReplayARecurrenceIsJudgedAsBefore) {
  AnomalyPolicy p({});
  p.Decide(SpikeAt(120), kCheckpoints, /*replay=*/false, std::vector<RankLoss>{{Rank{0}, 9.0}}, G0);
  EXPECT_FALSE(p.replaying().has_value());
  // A replay dropped (the world changed size) is the same.
  AnomalyPolicy q({});
  q.Decide(SpikeAt(120), kCheckpoints, true, std::vector<RankLoss>{{Rank{0}, 9.0}}, G0);
  q.ForgetReplay();
  EXPECT_FALSE(q.ReplayedLoss(G1, Rank{0}, S(120), 9.0));
  EXPECT_EQ(q.Decide(SpikeAt(120), kCheckpoints).action, AnomalyAction::kRollBackAndSkip);
}

TEST(DataSpikeAction, NamesRoundTripAndBadNamesAreListed) {
  for (DataSpikeAction a :
       {DataSpikeAction::kContinue, DataSpikeAction::kSkip, DataSpikeAction::kStop}) {
    EXPECT_EQ(*ParseDataSpikeAction(DataSpikeActionName(a)), a);
  }
  EXPECT_THAT(ParseDataSpikeAction("ignore").status().message(),
              HasSubstr("expected \"continue\", \"skip\" or \"stop\""));
}

}  // namespace
}  // namespace endure::core
