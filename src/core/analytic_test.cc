#include "core/analytic.h"

#include <gtest/gtest.h>

#include <cmath>

namespace endure::core {
namespace {

using std::chrono::hours;
using std::chrono::minutes;

double Min(Duration d) { return Seconds(d) / 60; }

// Daly (2006): Ts = 500 h, R = 10 min, delta = 5 min.
TEST(Analytic, DalyPublishedOptima) {
  EXPECT_NEAR(Min(DalyInterval(minutes(5), hours(24))), 117, 0.5);
  EXPECT_NEAR(Min(DalyInterval(minutes(5), hours(6))), 57, 0.5);
  EXPECT_NEAR(Min(DalyInterval(minutes(5), minutes(15))), 9.1, 0.1);
}

TEST(Analytic, ExactOptimumMatchesDaly) {
  // papers.md section 11: maximizing the exact ETTR gives 116.7 / 56.7 / 9.2 min.
  EXPECT_NEAR(Min(ExactOptimalInterval(minutes(5), minutes(10), hours(24))), 116.7, 0.1);
  EXPECT_NEAR(Min(ExactOptimalInterval(minutes(5), minutes(10), hours(6))), 56.7, 0.1);
  EXPECT_NEAR(Min(ExactOptimalInterval(minutes(5), minutes(10), minutes(15))), 9.2, 0.1);
}

TEST(Analytic, YoungIsSqrtTwoDeltaM) {
  EXPECT_NEAR(Min(YoungInterval(minutes(5), hours(24))), 120, 1e-6);
  EXPECT_EQ(YoungInterval(minutes(5), kNeverFails), kNeverFails);
  // Daly caps the interval at M when the checkpoint costs more than 2M.
  EXPECT_EQ(DalyInterval(hours(1), minutes(20)), minutes(20));
}

TEST(Analytic, MttfIsOneOverNodesTimesRate) {
  // Kokolis et al.: 6.5 failures per 1000 node-days, 8 GPUs per node.
  EXPECT_NEAR(Seconds(Mttf(16384 / 8, 6.5)) / 3600, 1.80, 0.01);
  EXPECT_NEAR(Seconds(Mttf(131072 / 8, 6.5)) / 3600, 0.225, 0.001);
  EXPECT_EQ(Mttf(100, 0), kNeverFails);
}

TEST(Analytic, ExactEttrLimits) {
  // No failures: only the checkpoint cost remains.
  EXPECT_DOUBLE_EQ(ExactEttr(minutes(30), minutes(1), minutes(5), kNeverFails), 30.0 / 31.0);
  // Hand-computed: tau = 30 min, delta = 1 min, R = 5 min, M = 10 h.
  double m = 600, tau = 30, delta = 1, r = 5;
  double expected = tau / (m * std::exp(r / m) * (std::exp((tau + delta) / m) - 1));
  EXPECT_NEAR(ExactEttr(minutes(30), minutes(1), minutes(5), hours(10)), expected, 1e-12);
  // Tiny M underflows to zero instead of overflowing.
  EXPECT_EQ(ExactEttr(hours(10), minutes(1), hours(10), std::chrono::seconds(1)), 0.0);
}

TEST(Analytic, FirstOrderApproachesExactForRareFailures) {
  for (auto m : {hours(100), hours(1000)}) {
    double exact = ExactEttr(minutes(30), std::chrono::seconds(10), minutes(5), m);
    double first = FirstOrderEttr(minutes(30), std::chrono::seconds(10), minutes(5), m);
    EXPECT_NEAR(first, exact, 0.002) << Seconds(m);
  }
  EXPECT_EQ(FirstOrderEttr(hours(10), minutes(5), hours(10), hours(1)), 0.0);
}

}  // namespace
}  // namespace endure::core
