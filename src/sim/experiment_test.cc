#include "sim/experiment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/analytic.h"

namespace endure::sim {
namespace {

using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;
using testing::HasSubstr;

// The exact renewal model's assumptions: one cause restarting in place, no
// startup, and no policy mechanism that the model lacks (backoff, isolation,
// budgets).
SimConfig ModelConfig(double rate, Duration interval, Duration write, Duration detect,
                      Duration restart) {
  SimConfig c;
  c.nodes = 100;
  c.failure_rate = rate;
  c.ckpt_interval = interval;
  c.ckpt_write = write;
  c.detect = detect;
  c.restart = restart;
  c.startup = Duration(0);
  c.duration = hours(24 * 200);
  c.runs = 20;
  c.seed = 2024;
  c.policy.backoff_initial = Duration(0);
  c.policy.evict_node_after = 0;
  c.policy.max_restarts_in_window = 0;
  c.policy.structural_repeats = 0;
  c.multi_strike = false;
  c.health_check = false;
  Status s = Finalize(c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

TEST(Validation, SimulatedEttrAgreesWithTheExactModel) {
  int points = 0;
  for (double rate : {50.0, 200.0}) {  // MTTF 4.8 h and 1.2 h on 100 nodes
    for (Duration interval : {Duration(minutes(10)), Duration(minutes(60))}) {
      for (auto [detect, restart] : {std::pair<Duration, Duration>{seconds(30), minutes(5)},
                                     std::pair<Duration, Duration>{Duration(0), minutes(30)}}) {
        SimConfig c = ModelConfig(rate, interval, minutes(1), detect, restart);
        Summary sim = RunExperiment(c);
        AnalyticSummary a = Analyze(c);
        EXPECT_EQ(a.recovery, detect + restart);
        EXPECT_GT(sim.ettr_stderr, 0);
        EXPECT_LT(std::abs(sim.ettr - a.exact_ettr), 3 * sim.ettr_stderr)
            << "rate " << rate << " interval " << FormatDuration(interval) << " R "
            << FormatDuration(detect + restart) << ": simulated " << sim.ettr << " +- "
            << sim.ettr_stderr << ", exact " << a.exact_ettr;
        ++points;
      }
    }
  }
  EXPECT_EQ(points, 8);
}

TEST(Experiment, SummaryStatistics) {
  SimConfig c = ModelConfig(100, minutes(30), seconds(10), seconds(30), minutes(5));
  c.duration = hours(24 * 10);
  c.runs = 5;
  Summary s = RunExperiment(c, /*max_incidents=*/3);
  EXPECT_EQ(s.runs, 5);
  EXPECT_EQ(s.seed, 2024u);
  EXPECT_NEAR(s.wall_s, 10 * 86400, 1e-6);
  double ledger = 0;
  for (double v : s.ledger_s) ledger += v;
  EXPECT_NEAR(ledger, s.wall_s, 1e-3);
  EXPECT_NEAR(s.productive_s / s.wall_s, s.ettr, 1e-9);
  EXPECT_NEAR(s.failures, 100, 30);  // 100 nodes * 0.1 / day * 10 days
  EXPECT_LT(s.ci95_low, s.ettr);
  EXPECT_NEAR(s.ci95_high - s.ettr, StudentT95(4) * s.ettr_stderr, 1e-12);
  EXPECT_EQ(s.incidents.size(), 3u);
  // Same seed, same answer.
  EXPECT_EQ(RunExperiment(c).ettr, s.ettr);
}

TEST(Experiment, StudentT) {
  EXPECT_DOUBLE_EQ(StudentT95(1), 12.706);
  EXPECT_DOUBLE_EQ(StudentT95(19), 2.093);
  EXPECT_NEAR(StudentT95(60), 2.000, 0.001);
  EXPECT_NEAR(StudentT95(100000), 1.960, 0.001);
}

TEST(Experiment, AnalyticSummary) {
  SimConfig c;
  c.nodes = 12500;
  c.failure_rate = 6.5;
  ASSERT_TRUE(Finalize(c).ok());
  AnalyticSummary a = Analyze(c);
  EXPECT_EQ(a.mttf, core::Mttf(12500, 6.5));
  EXPECT_NEAR(Seconds(a.mttf) / 60, 17.72, 0.01);
  EXPECT_EQ(a.recovery, minutes(5) + seconds(30));
  EXPECT_EQ(a.young, core::YoungInterval(seconds(10), a.mttf));
  EXPECT_DOUBLE_EQ(a.exact_ettr, core::ExactEttr(minutes(30), seconds(10), a.recovery, a.mttf));
  EXPECT_GE(a.exact_ettr_at_optimum, a.exact_ettr);
}

TEST(Sweep, ParsesRanges) {
  Result<SweepSpec> s = ParseSweep("ckpt-interval=1m:120m:30");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->values.size(), 30u);
  EXPECT_EQ(s->values.front(), "60000000000ns");
  EXPECT_DOUBLE_EQ(s->x.front(), 1);
  EXPECT_DOUBLE_EQ(s->x.back(), 120);
  Result<SweepSpec> n = ParseSweep("nodes=100:1000:4");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->values, (std::vector<std::string>{"100", "400", "700", "1000"}));

  EXPECT_THAT(ParseSweep("colour=1:2:3").status().message(),
              HasSubstr("--sweep: cannot sweep 'colour'"));
  EXPECT_THAT(ParseSweep("ckpt-interval=1m:2m").status().message(),
              HasSubstr("--sweep: expected FROM:TO:POINTS"));
  EXPECT_THAT(ParseSweep("ckpt-interval=1m:2m:0").status().message(),
              HasSubstr("POINTS must be an integer from 1 to 10000"));
  EXPECT_THAT(ParseSweep("restart=-1m:2m:3").status().message(),
              HasSubstr("durations cannot be negative"));
}

TEST(Sweep, RunsAndRenders) {
  SimConfig c = ModelConfig(100, minutes(30), seconds(10), seconds(30), minutes(5));
  c.duration = hours(24 * 5);
  c.runs = 3;
  Result<SweepSpec> spec = ParseSweep("ckpt-interval=5m:60m:4");
  ASSERT_TRUE(spec.ok());
  Result<std::vector<SweepRow>> rows = RunSweep(c, *spec);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 4u);
  EXPECT_GT(rows->at(1).sim.ettr, 0.5);

  std::string csv = SweepCsv(*spec, *rows);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "ckpt_interval_min,ettr_sim,ettr_ci95_low,ettr_ci95_high,ettr_stderr,ettr_exact,"
            "ettr_first_order,failures,runs");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);

  // An invalid point names the sweep.
  Result<SweepSpec> bad = ParseSweep("ckpt-interval=1s:1m:2");
  ASSERT_TRUE(bad.ok());
  EXPECT_THAT(RunSweep(c, *bad).status().message(),
              HasSubstr("--sweep: 1.0s is shorter than the checkpoint write cost"));
}

TEST(Experiment, CompareMechanismsPairsTheSeeds) {
  SimConfig c;
  c.nodes = 500;
  c.duration = hours(24 * 10);
  c.runs = 4;
  c.seed = 5;
  c.straggler_share = 0.01;
  c.straggler_factor = 1.3;
  c.sdc_rate = 2;
  c.spares = 10;
  ASSERT_TRUE(Finalize(c).ok());
  std::vector<MechanismRow> rows = CompareMechanisms(c);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].mechanism, Mechanism::kStragglerMitigation);
  EXPECT_GT(rows[0].diff, 0);
  EXPECT_EQ(rows[1].mechanism, Mechanism::kSdcCheck);
  EXPECT_GT(rows[1].diff, 0);
  EXPECT_GT(rows[1].on.sdc_detected, 0);
  EXPECT_EQ(rows[1].off.sdc_detected, 0);
  for (const MechanismRow& r : rows) {
    EXPECT_LE(r.diff_ci95_low, r.diff);
    EXPECT_GE(r.diff_ci95_high, r.diff);
    EXPECT_NEAR(r.diff, r.on.ettr - r.off.ettr, 1e-12);
  }
}

}  // namespace
}  // namespace endure::sim
