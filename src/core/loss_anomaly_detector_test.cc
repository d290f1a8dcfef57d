#include "core/loss_anomaly_detector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace endure::core {
namespace {

using ::testing::HasSubstr;

StepNumber S(int64_t s) { return StepNumber{s}; }

// A realistic language-model loss curve: a steep fall from ~10.8 (ln of a
// 50k vocabulary) towards ~2.5, with per-step batch noise.
double CurveLoss(int64_t step, std::mt19937& rng) {
  std::normal_distribution<double> noise(0.0, 1.0);
  const double mean = 2.5 + 8.3 * std::exp(-static_cast<double>(step) / 80.0);
  const double sd = 0.04 + 0.3 * std::exp(-static_cast<double>(step) / 80.0);
  return mean + sd * noise(rng);
}

TEST(LossAnomalyOptions, ValidateNamesTheBadField) {
  LossAnomalyOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.min_count = o.window + 1;
  EXPECT_THAT(o.Validate().message(), HasSubstr("min_count"));
  o = {};
  o.z_threshold = -1;
  EXPECT_THAT(o.Validate().message(), HasSubstr("z_threshold"));
  o = {};
  o.min_jump = -0.5;
  EXPECT_THAT(o.Validate().message(), HasSubstr("min_jump"));
  o = {};
  o.window = 1;
  EXPECT_THAT(o.Validate().message(), HasSubstr("window"));
}

TEST(LossAnomalyDetector, NaNAndInfAreAnomaliesFromTheFirstStep) {
  LossAnomalyDetector d({});
  auto a = d.Observe(S(0), std::numeric_limits<double>::quiet_NaN());
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->kind, LossAnomalyKind::kNaN);
  EXPECT_EQ(LossAnomalyCause(a->kind), "loss_nan");
  EXPECT_EQ(a->reason, "loss is NaN at step 0");
  a = d.Observe(S(1), std::numeric_limits<double>::infinity());
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->kind, LossAnomalyKind::kInf);
  EXPECT_EQ(a->reason, "loss is +Inf at step 1");
  a = d.Observe(S(2), -std::numeric_limits<double>::infinity());
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->reason, "loss is -Inf at step 2");
  EXPECT_EQ(d.count(), 0);  // anomalies never enter the window
}

TEST(LossAnomalyDetector, CleanTrainingRunRaisesNothing) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    LossAnomalyDetector d({});
    for (int64_t s = 0; s < 3000; ++s) {
      auto a = d.Observe(S(s), CurveLoss(s, rng));
      ASSERT_FALSE(a.has_value()) << a->reason;
    }
  }
}

TEST(LossAnomalyDetector, WarmUpIsTolerated) {
  // A loss that falls fast and wobbles hard in the first steps: the early
  // values are far from one another but not from the noisy window.
  LossAnomalyDetector d({});
  const double early[] = {10.9, 10.2, 11.4, 9.1, 8.3, 9.9, 7.2, 8.8, 6.4, 7.9, 5.9, 6.8, 5.1,
                          6.6,  4.8,  5.9,  4.4, 5.3, 4.1, 4.9, 3.9, 5.2, 3.7, 4.6, 3.5, 4.1};
  int64_t s = 0;
  for (double loss : early) {
    auto a = d.Observe(S(s++), loss);
    EXPECT_FALSE(a.has_value()) << a->reason;
  }
}

TEST(LossAnomalyDetector, DetectsASpikeAndNamesTheStatistics) {
  std::mt19937 rng(7);
  LossAnomalyDetector d({});
  for (int64_t s = 0; s < 1000; ++s) ASSERT_FALSE(d.Observe(S(s), CurveLoss(s, rng)));
  auto a = d.Observe(S(1000), 7.5);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->kind, LossAnomalyKind::kSpike);
  EXPECT_EQ(a->step, S(1000));
  EXPECT_GT(a->z, 8.0);
  EXPECT_NEAR(a->median, 2.5, 0.05);
  EXPECT_THAT(a->reason, HasSubstr("loss 7.5 at step 1000 is 3"));
  EXPECT_THAT(a->reason, HasSubstr("x the median 2.5"));
  EXPECT_THAT(a->reason, HasSubstr("of the last 200 steps"));
  EXPECT_THAT(a->reason, HasSubstr("(thresholds: 8 deviations and 2x the median)"));
  // The spike did not enter the window: the next normal step is fine and a
  // second spike is still seen.
  EXPECT_FALSE(d.Observe(S(1001), 2.51).has_value());
  EXPECT_TRUE(d.Observe(S(1002), 7.5).has_value());
}

// Small-batch losses are heavy-tailed: a batch lands many standard
// deviations above the mean every few thousand steps (the run below saw 6.85
// at a 5% noise level). 100,000 steps of noise of that level with tails far
// heavier than a normal's (Student's t with 4 degrees of freedom, and a
// log-normal) raise nothing, and a loss 3x its recent level among them is
// still flagged at its step.
TEST(LossAnomalyDetector, HeavyTailedNoiseRaisesNothingAndAThreefoldSpikeIsFlaggedAtOnce) {
  std::mt19937 rng(27);
  std::student_t_distribution<double> t4(4.0);
  std::lognormal_distribution<double> lognormal(0.0, 0.1);
  for (int shape = 0; shape < 2; ++shape) {
    SCOPED_TRACE(shape == 0 ? "Student's t(4), stddev 0.117" : "log-normal, shape 0.1");
    LossAnomalyDetector d({});
    double sum = 0, sq = 0, biggest = 0;
    int64_t n = 0;
    for (int64_t s = 0; s < 100000; ++s) {
      if (s % 10000 == 5000) {
        auto a = d.Observe(S(s), 3 * 2.4);
        ASSERT_TRUE(a.has_value()) << "a 3x spike at step " << s;
        EXPECT_EQ(a->step, S(s));
        continue;
      }
      const double loss = shape == 0 ? 2.4 + 0.083 * t4(rng) : 2.4 * lognormal(rng);
      sum += loss, sq += loss * loss, ++n;
      biggest = std::max(biggest, loss);
      auto a = d.Observe(S(s), loss);
      ASSERT_FALSE(a.has_value()) << a->reason;
    }
    // The noise did reach far into its tail.
    const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    EXPECT_GT((biggest - mean) / sd, shape == 0 ? 7.0 : 5.0) << biggest << " " << mean << " " << sd;
  }
}

// The false alarm of a real run (2 nodes x 1 rank, global batch 8, 3000
// steps): a loss of 3.19 at step 1013, 6.85 standard deviations above the
// mean 2.39 of the 50 steps before it, was the batch's. It is no spike now.
TEST(LossAnomalyDetector, ANaturalOutlierOfSevenSigmaIsNoSpike) {
  std::mt19937 rng(1013);
  std::normal_distribution<double> noise(2.39, 0.117);
  LossAnomalyDetector d({});
  for (int64_t s = 0; s < 1013; ++s) ASSERT_FALSE(d.Observe(S(s), noise(rng)));
  auto a = d.Observe(S(1013), 3.19);
  EXPECT_FALSE(a.has_value()) << a->reason;
}

TEST(LossAnomalyDetector, DropsAndSmallBumpsAreNotSpikes) {
  std::mt19937 rng(8);
  LossAnomalyDetector d({});
  for (int64_t s = 0; s < 1000; ++s) ASSERT_FALSE(d.Observe(S(s), CurveLoss(s, rng)));
  EXPECT_FALSE(d.Observe(S(1000), 0.5).has_value());   // a sudden drop
  EXPECT_FALSE(d.Observe(S(1001), 2.65).has_value());  // +0.15 on noise 0.04
}

TEST(LossAnomalyDetector, NoSpikesBeforeMinCount) {
  LossAnomalyOptions o;
  o.min_count = 20;
  LossAnomalyDetector d(o);
  for (int64_t s = 0; s < 19; ++s) ASSERT_FALSE(d.Observe(S(s), 2.0 + 0.01 * (s % 3)));
  EXPECT_FALSE(d.Observe(S(19), 50.0).has_value());
}

TEST(LossAnomalyDetector, FlatCurveUsesTheRelativeFloor) {
  LossAnomalyDetector d({});
  for (int64_t s = 0; s < 50; ++s) ASSERT_FALSE(d.Observe(S(s), 2.0));
  // The deviation is 0; floored at 1% of 2.0 = 0.02. A bump that is not
  // twice the level is no spike, however many deviations it is.
  EXPECT_FALSE(d.Observe(S(50), 3.9).has_value());
  auto a = d.Observe(S(51), 4.1);
  ASSERT_TRUE(a.has_value());
  EXPECT_THAT(a->reason, HasSubstr("floored at 0.01 x |median|"));
}

TEST(LossAnomalyDetector, TheJumpBarCanBeLowered) {
  LossAnomalyOptions o;
  o.min_jump = 0.25;
  LossAnomalyDetector d(o);
  for (int64_t s = 0; s < 50; ++s) ASSERT_FALSE(d.Observe(S(s), 2.0 + 0.01 * (s % 3)));
  EXPECT_TRUE(d.Observe(S(50), 2.6).has_value());
}

TEST(LossAnomalyDetector, RollbackForgetsLaterSteps) {
  LossAnomalyDetector d({});
  for (int64_t s = 0; s < 40; ++s) ASSERT_FALSE(d.Observe(S(s), 2.0 + 0.05 * (s % 5)));
  EXPECT_EQ(d.count(), 40);
  d.RollBackTo(S(29));
  EXPECT_EQ(d.count(), 30);
  // Re-observing an earlier step rewinds implicitly.
  ASSERT_FALSE(d.Observe(S(10), 2.1));
  EXPECT_EQ(d.count(), 11);
}

}  // namespace
}  // namespace endure::core
