#include "core/straggler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace endure::core {
namespace {

using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr double kBaseComputeS = 0.1;

// A scripted job: every step, each rank reports kBaseComputeS times lognormal
// jitter, times `slow_factor` for `slow_rank` from `slow_from`, and with
// probability `spike_p` per step one random rank takes twice as long.
struct ScriptedJob {
  int world = 4;
  int steps = 500;
  uint64_t seed = 1;
  double sigma = 0.05;
  int slow_rank = -1;
  double slow_factor = 1;
  int64_t slow_from = 0;
  double spike_p = 0;
};

std::vector<StragglerFlag> Drive(StragglerDetector& detector, const ScriptedJob& run) {
  std::mt19937_64 rng(run.seed);
  std::lognormal_distribution<double> jitter(0.0, run.sigma);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::uniform_int_distribution<int> any_rank(0, run.world - 1);
  std::vector<StragglerFlag> flags;
  for (int64_t step = 1; step <= run.steps; ++step) {
    const int spiked = coin(rng) < run.spike_p ? any_rank(rng) : -1;
    for (int r = 0; r < run.world; ++r) {
      double s = kBaseComputeS * jitter(rng);
      if (r == run.slow_rank && step >= run.slow_from) s *= run.slow_factor;
      if (r == spiked) s *= 2;
      for (StragglerFlag& f : detector.OnStepCompute(Rank{r}, StepNumber{step}, s)) {
        flags.push_back(std::move(f));
      }
    }
  }
  return flags;
}

TEST(StragglerDetector, FlagsASlowRankWithinTheWindow) {
  const StragglerOptions options;  // theta 0.1, M = 12 of N = 20
  for (double factor : {1.5, 3.0}) {
    for (int world : {4, 64}) {
      const ScriptedJob run{.world = world,
                            .steps = 300,
                            .seed = 42,
                            .slow_rank = world - 2,
                            .slow_factor = factor,
                            .slow_from = 100};
      SCOPED_TRACE("factor " + std::to_string(factor) + ", world " + std::to_string(world) +
                   ", seed " + std::to_string(run.seed));
      StragglerDetector detector(options);
      detector.OnGenerationStart(world);
      const std::vector<StragglerFlag> flags = Drive(detector, run);
      ASSERT_EQ(flags.size(), 1u);
      const StragglerFlag& f = flags[0];
      EXPECT_EQ(f.rank, Rank{world - 2});
      // Not before the onset (a natural slow step or two before it may count
      // towards M), and within N steps of it.
      EXPECT_GE(f.step.value, run.slow_from);
      EXPECT_LE(f.step.value, run.slow_from + options.window - 1);
      EXPECT_GE(f.slow_steps, options.min_slow);
      EXPECT_EQ(f.window, options.window);
      // The window still holds the clean steps before the onset, but its
      // median is taken over a majority of slow ones.
      EXPECT_NEAR(f.slowdown, factor, 0.1 * factor);
      EXPECT_NEAR(f.peers_compute_s, kBaseComputeS, 0.01);
      EXPECT_NEAR(f.rank_compute_s, factor * kBaseComputeS, 0.1 * factor * kBaseComputeS);
      EXPECT_THAT(f.reason, HasSubstr("rank " + std::to_string(world - 2) + " computed "));
      EXPECT_THAT(f.reason, HasSubstr("of the last 20 steps"));
    }
  }
}

TEST(StragglerDetector, ReasonStatesTheNumbers) {
  StragglerDetector detector(StragglerOptions{});
  detector.OnGenerationStart(4);
  std::vector<StragglerFlag> flags;
  for (int64_t step = 1; step <= 12 && flags.empty(); ++step) {
    for (int r = 0; r < 4; ++r) {
      flags = detector.OnStepCompute(Rank{r}, StepNumber{step}, r == 3 ? 0.152 : 0.1);
      if (!flags.empty()) break;
    }
  }
  ASSERT_EQ(flags.size(), 1u);
  EXPECT_EQ(flags[0].step, StepNumber{12});
  EXPECT_EQ(flags[0].reason,
            "rank 3 computed 1.52x the peers' median (152ms vs 100ms); slower than 1.10x of it "
            "in 12 of the last 12 steps");
}

TEST(StragglerDetector, CleanRunsWithNaturalJitterRaiseNoFlag) {
  for (int world : {4, 64}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      SCOPED_TRACE("world " + std::to_string(world) + ", seed " + std::to_string(seed));
      StragglerDetector detector(StragglerOptions{});
      detector.OnGenerationStart(world);
      const ScriptedJob run{.world = world, .steps = 500, .seed = seed, .spike_p = 0.05};
      EXPECT_TRUE(Drive(detector, run).empty());
      EXPECT_EQ(detector.pending_steps(), 0u);
    }
  }
}

TEST(StragglerDetector, AWholeJobSlowingDownIsNoStraggler) {
  StragglerDetector detector(StragglerOptions{});
  detector.OnGenerationStart(8);
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> jitter(0.0, 0.05);
  for (int64_t step = 1; step <= 200; ++step) {
    // A longer phase of the model: every rank takes 3x as long.
    const double base = step >= 100 ? 0.3 : 0.1;
    for (int r = 0; r < 8; ++r) {
      EXPECT_TRUE(detector.OnStepCompute(Rank{r}, StepNumber{step}, base * jitter(rng)).empty());
    }
  }
}

TEST(StragglerDetector, NeedsMinSlowOfTheLastWindowSteps) {
  // Slow in every other step: 10 of 20 < M = 12.
  {
    StragglerDetector detector(StragglerOptions{});
    detector.OnGenerationStart(4);
    for (int64_t step = 1; step <= 200; ++step) {
      for (int r = 0; r < 4; ++r) {
        const double s = r == 1 && step % 2 == 0 ? 0.2 : 0.1;
        EXPECT_TRUE(detector.OnStepCompute(Rank{r}, StepNumber{step}, s).empty());
      }
    }
  }
  // Slow in two of every three: 13 or 14 of 20 >= 12.
  {
    StragglerDetector detector(StragglerOptions{});
    detector.OnGenerationStart(4);
    std::vector<StragglerFlag> flags;
    for (int64_t step = 1; step <= 200; ++step) {
      for (int r = 0; r < 4; ++r) {
        const double s = r == 1 && step % 3 != 0 ? 0.2 : 0.1;
        for (StragglerFlag& f : detector.OnStepCompute(Rank{r}, StepNumber{step}, s)) {
          flags.push_back(f);
        }
      }
    }
    ASSERT_EQ(flags.size(), 1u);
    EXPECT_EQ(flags[0].rank, Rank{1});
    // The 12th slow step is step 17 (steps 3, 6, 9, 12 and 15 were not slow).
    EXPECT_EQ(flags[0].step, StepNumber{17});
    EXPECT_EQ(flags[0].slow_steps, 12);
    EXPECT_EQ(flags[0].window, 17);
  }
}

TEST(StragglerDetector, StepsBelowMinComputeAreNotJudged) {
  for (double base : {0.001, 0.01}) {
    StragglerDetector detector(StragglerOptions{});  // min_compute_s 5ms
    detector.OnGenerationStart(4);
    int flagged = 0;
    for (int64_t step = 1; step <= 50; ++step) {
      for (int r = 0; r < 4; ++r) {
        flagged +=
            detector.OnStepCompute(Rank{r}, StepNumber{step}, r == 2 ? 3 * base : base).size();
      }
    }
    EXPECT_EQ(flagged, base < 0.005 ? 0 : 1) << "base " << base;
  }
}

// The false alarm of a clean run: one rank computed 7 ms a step against its
// peer's 6 ms, every step (it logs). 1.17x passes the ratio, but a
// millisecond is timer resolution and scheduling, not a straggler: no flag.
// The same run with the floor at 0 flags it, so the floor is what holds.
TEST(StragglerDetector, AMillisecondAboveItsPeersIsNoStraggler) {
  for (double floor : {StragglerOptions{}.min_excess_s, 0.0}) {
    StragglerOptions o;
    o.min_excess_s = floor;
    StragglerDetector detector(o);
    detector.OnGenerationStart(2);
    int flagged = 0;
    for (int64_t step = 1; step <= 200; ++step) {
      flagged += detector.OnStepCompute(Rank{0}, StepNumber{step}, 0.007).size();
      flagged += detector.OnStepCompute(Rank{1}, StepNumber{step}, 0.006).size();
    }
    EXPECT_EQ(flagged, floor > 0 ? 0 : 1) << "floor " << floor;
  }
}

TEST(StragglerDetector, FlagsEachRankOncePerGeneration) {
  StragglerDetector detector(StragglerOptions{});
  auto run_generation = [&](int64_t first_step) {
    detector.OnGenerationStart(4);
    std::vector<StragglerFlag> flags;
    for (int64_t step = first_step; step < first_step + 100; ++step) {
      for (int r = 0; r < 4; ++r) {
        for (StragglerFlag& f :
             detector.OnStepCompute(Rank{r}, StepNumber{step}, r == 0 ? 0.3 : 0.1)) {
          flags.push_back(f);
        }
      }
    }
    return flags;
  };
  std::vector<StragglerFlag> first = run_generation(1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].step, StepNumber{12});
  // A new generation forgets the flag and the window: flagged again after M
  // steps of its own (its rank 0 may run on another node).
  std::vector<StragglerFlag> second = run_generation(81);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].rank, Rank{0});
  EXPECT_EQ(second[0].step, StepNumber{92});
}

TEST(StragglerDetector, TwoRanksCompareWithEachOther) {
  StragglerDetector detector(StragglerOptions{});
  detector.OnGenerationStart(2);
  std::vector<StragglerFlag> flags;
  for (int64_t step = 1; step <= 30; ++step) {
    for (int r = 0; r < 2; ++r) {
      for (StragglerFlag& f :
           detector.OnStepCompute(Rank{r}, StepNumber{step}, r == 1 ? 0.15 : 0.1)) {
        flags.push_back(f);
      }
    }
  }
  ASSERT_EQ(flags.size(), 1u);
  EXPECT_EQ(flags[0].rank, Rank{1});
  EXPECT_NEAR(flags[0].slowdown, 1.5, 1e-9);
}

TEST(StragglerDetector, IgnoresOutOfWorldDuplicateAndInvalidReports) {
  StragglerDetector detector(StragglerOptions{.min_slow = 1});
  // Before any generation: nothing is recorded.
  EXPECT_TRUE(detector.OnStepCompute(Rank{0}, StepNumber{1}, 0.1).empty());
  EXPECT_EQ(detector.pending_steps(), 0u);

  detector.OnGenerationStart(3);
  EXPECT_TRUE(detector.OnStepCompute(Rank{-1}, StepNumber{1}, 9.0).empty());
  EXPECT_TRUE(detector.OnStepCompute(Rank{3}, StepNumber{1}, 9.0).empty());
  EXPECT_EQ(detector.pending_steps(), 0u);
  EXPECT_TRUE(detector.OnStepCompute(Rank{0}, StepNumber{1}, 0.1).empty());
  // A duplicate neither overwrites the first report nor counts as rank 1's.
  EXPECT_TRUE(detector.OnStepCompute(Rank{0}, StepNumber{1}, 9.0).empty());
  EXPECT_TRUE(detector.OnStepCompute(Rank{1}, StepNumber{1}, NAN).empty());
  EXPECT_TRUE(detector.OnStepCompute(Rank{1}, StepNumber{1}, -1.0).empty());
  EXPECT_TRUE(detector.OnStepCompute(Rank{1}, StepNumber{1}, INFINITY).empty());
  EXPECT_TRUE(detector.OnStepCompute(Rank{1}, StepNumber{1}, 0.1).empty());
  EXPECT_EQ(detector.pending_steps(), 1u);
  // The last report completes the step: rank 2 is slow and M = 1.
  std::vector<StragglerFlag> flags = detector.OnStepCompute(Rank{2}, StepNumber{1}, 0.2);
  ASSERT_EQ(flags.size(), 1u);
  EXPECT_EQ(flags[0].rank, Rank{2});
  EXPECT_EQ(detector.pending_steps(), 0u);
}

TEST(StragglerDetector, DisabledFlagsNothing) {
  StragglerDetector detector(StragglerOptions{.enabled = false});
  detector.OnGenerationStart(4);
  const ScriptedJob run{.world = 4, .steps = 100, .slow_rank = 1, .slow_factor = 3};
  EXPECT_TRUE(Drive(detector, run).empty());
  EXPECT_EQ(detector.pending_steps(), 0u);
}

TEST(StragglerDetector, JudgesStepsCompletedOutOfOrder) {
  StragglerDetector detector(StragglerOptions{.min_slow = 2});
  detector.OnGenerationStart(3);
  // Ranks 0 and 1 report steps 1 and 2 before rank 2 reports either.
  for (int64_t step : {1, 2}) {
    for (int r : {0, 1}) {
      EXPECT_TRUE(detector.OnStepCompute(Rank{r}, StepNumber{step}, 0.1).empty());
    }
  }
  EXPECT_EQ(detector.pending_steps(), 2u);
  EXPECT_TRUE(detector.OnStepCompute(Rank{2}, StepNumber{1}, 0.2).empty());
  std::vector<StragglerFlag> flags = detector.OnStepCompute(Rank{2}, StepNumber{2}, 0.2);
  ASSERT_EQ(flags.size(), 1u);
  EXPECT_EQ(flags[0].step, StepNumber{2});
}

TEST(StragglerDetector, BoundsPendingStepsWhenARankStopsReporting) {
  const StragglerOptions options;
  StragglerDetector detector(options);
  detector.OnGenerationStart(4);
  size_t most = 0;
  for (int64_t step = 1; step <= 2000; ++step) {
    for (int r = 0; r < 4; ++r) {
      // Rank 3's reports stop after step 10 (lost datagrams, say).
      if (r == 3 && step > 10) continue;
      EXPECT_TRUE(detector.OnStepCompute(Rank{r}, StepNumber{step}, 0.1).empty());
      most = std::max(most, detector.pending_steps());
    }
  }
  EXPECT_EQ(most, static_cast<size_t>(2 * options.window + 1));
  // A report far behind the newest step is dropped, not kept.
  EXPECT_TRUE(detector.OnStepCompute(Rank{3}, StepNumber{11}, 0.1).empty());
  EXPECT_EQ(detector.pending_steps(), static_cast<size_t>(2 * options.window + 1));
  // Rank 3 catching up again completes the steps still pending.
  EXPECT_TRUE(detector.OnStepCompute(Rank{3}, StepNumber{1995}, 0.1).empty());
  EXPECT_EQ(detector.pending_steps(), static_cast<size_t>(2 * options.window));
}

TEST(StragglerOptions, ValidateNamesTheField) {
  EXPECT_TRUE(StragglerOptions{}.Validate().ok());
  auto message = [](StragglerOptions o) { return o.Validate().message(); };
  EXPECT_THAT(message({.theta = 0}),
              HasSubstr("straggler detector: theta must be in (0, 10], got 0"));
  EXPECT_THAT(message({.theta = 10.5}), HasSubstr("theta must be in (0, 10], got 10.5"));
  EXPECT_THAT(message({.theta = NAN}), HasSubstr("theta must be in (0, 10]"));
  EXPECT_TRUE(StragglerOptions{.theta = 10}.Validate().ok());
  EXPECT_THAT(message({.window = 0}), HasSubstr("window must be in [1, 10000] steps, got 0"));
  EXPECT_THAT(message({.window = 10001}), HasSubstr("window must be in [1, 10000]"));
  EXPECT_THAT(message({.min_slow = 0}), HasSubstr("min_slow must be in [1, window=20], got 0"));
  EXPECT_THAT(message({.window = 10, .min_slow = 11}),
              HasSubstr("min_slow must be in [1, window=10], got 11"));
  EXPECT_TRUE((StragglerOptions{.window = 10, .min_slow = 10}.Validate().ok()));
  EXPECT_THAT(message({.min_compute_s = -1}),
              HasSubstr("min_compute_s must be a number >= 0, got -1"));
  EXPECT_THAT(message({.min_compute_s = INFINITY}), HasSubstr("min_compute_s"));
  EXPECT_THAT(message({.min_excess_s = -0.5}),
              HasSubstr("min_excess_s must be a number >= 0, got -0.5"));
  EXPECT_EQ(StragglerOptions{.theta = -1}.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(DecideStraggler, SwapsInASpareWhenKeepingCostsMore) {
  const StragglerDecision d = DecideStraggler({.slowdown = 1.52,
                                               .step_time = seconds(1),
                                               .remaining = hours(2),
                                               .restart_cost = seconds(30),
                                               .lost_work = seconds(5),
                                               .spares = 1});
  EXPECT_EQ(d.move, StragglerMove::kSwapSpare);
  // 2h x (1 - 1/1.52) = 2463s.
  EXPECT_NEAR(Seconds(d.keep_cost), 7200 * (1 - 1 / 1.52), 1e-3);
  EXPECT_EQ(d.move_cost, seconds(35));
  EXPECT_EQ(d.reason,
            "keeping it costs 41m03s of the remaining 2h00m (1.52x); a swap costs 35.0s "
            "(restart 30.0s + lost work 5.0s): swap in a spare");
  EXPECT_EQ(StragglerMoveName(d.move), "swap_spare");
}

TEST(DecideStraggler, EvictsAndWaitsWithNoSpareWhenTheWaitPays) {
  const StragglerDecision d = DecideStraggler({.slowdown = 1.52,
                                               .remaining = hours(2),
                                               .restart_cost = seconds(30),
                                               .lost_work = seconds(5),
                                               .spares = 0,
                                               .replacement_wait = minutes(10)});
  EXPECT_EQ(d.move, StragglerMove::kEvictAndWait);
  EXPECT_EQ(d.move_cost, minutes(10) + seconds(35));
  EXPECT_EQ(d.reason,
            "keeping it costs 41m03s of the remaining 2h00m (1.52x); with no spare, evicting "
            "it costs 10m35s (restart 30.0s + lost work 5.0s + waiting 10m00s for a "
            "replacement): evict it and wait for a replacement");
  EXPECT_EQ(StragglerMoveName(d.move), "evict_and_wait");
}

TEST(DecideStraggler, KeepsWhenTheMoveCostsMore) {
  // A mild straggler near the end of the job: 30m x (1 - 1/1.02) = 35s lost,
  // a swap costs 90s.
  StragglerDecision d = DecideStraggler({.slowdown = 1.02,
                                         .remaining = minutes(30),
                                         .restart_cost = seconds(60),
                                         .lost_work = seconds(30),
                                         .spares = 2});
  EXPECT_EQ(d.move, StragglerMove::kKeep);
  EXPECT_NEAR(Seconds(d.keep_cost), 1800 * (1 - 1 / 1.02), 1e-3);
  EXPECT_EQ(d.move_cost, seconds(90));
  EXPECT_THAT(d.reason, HasSubstr("keeping it costs 35.3s of the remaining 30m00s (1.02x)"));
  EXPECT_THAT(d.reason, HasSubstr("a swap costs 1m30s"));
  EXPECT_THAT(d.reason, HasSubstr(": keep it running and report it"));
  EXPECT_EQ(StragglerMoveName(d.move), "keep");

  // The straggler that pays for a swap, but not for an hour's wait.
  d = DecideStraggler({.slowdown = 1.52,
                       .remaining = hours(2),
                       .restart_cost = seconds(30),
                       .lost_work = seconds(5),
                       .spares = 0,
                       .replacement_wait = hours(1)});
  EXPECT_EQ(d.move, StragglerMove::kKeep);
  EXPECT_EQ(d.move_cost, hours(1) + seconds(35));

  // Equal costs: no move.
  d = DecideStraggler(
      {.slowdown = 2, .remaining = minutes(2), .restart_cost = minutes(1), .spares = 1});
  EXPECT_EQ(d.keep_cost, minutes(1));
  EXPECT_EQ(d.move, StragglerMove::kKeep);
}

TEST(DecideStraggler, NoSlowdownCostsNothingToKeep) {
  for (double slowdown : {1.0, 0.5, static_cast<double>(NAN)}) {
    const StragglerDecision d =
        DecideStraggler({.slowdown = slowdown, .remaining = hours(100), .spares = 1});
    EXPECT_EQ(d.keep_cost, Duration::zero()) << slowdown;
    EXPECT_EQ(d.move, StragglerMove::kKeep) << slowdown;
    EXPECT_THAT(d.reason, HasSubstr("(1.00x)"));
  }
  // A rank that no longer finishes its steps costs all of the remaining time.
  EXPECT_EQ(DecideStraggler({.slowdown = INFINITY, .remaining = hours(1)}).keep_cost, hours(1));
  // Negative inputs count as zero.
  const StragglerDecision d = DecideStraggler(
      {.slowdown = 2, .remaining = hours(1), .restart_cost = -hours(5), .spares = 1});
  EXPECT_EQ(d.move_cost, Duration::zero());
  EXPECT_EQ(d.move, StragglerMove::kSwapSpare);
}

}  // namespace
}  // namespace endure::core
