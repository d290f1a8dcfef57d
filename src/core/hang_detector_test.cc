#include "core/hang_detector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace endure::core {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Duration Ms(int64_t ms) { return milliseconds(ms); }
StepNumber S(int64_t s) { return StepNumber{s}; }

// Drives a detector the way a shell does: before each event, it "sleeps" until
// NextDeadline() when that comes first, and calls Check() there. Times are
// given as time since the start of the test.
class Driver {
 public:
  explicit Driver(HangDetectorOptions options = {}) : detector_(options) {}

  void StartGeneration(int generation, int world_size, Duration now) {
    AdvanceTo(now);
    detector_.OnGenerationStart(generation, world_size, At(now));
  }
  void StepEnd(int rank, int64_t step, Duration now) {
    AdvanceTo(now);
    ASSERT_TRUE(detector_.OnStepEnd(rank, S(step), At(now)).ok());
  }
  void Phase(int rank, std::string_view phase, Duration now) {
    AdvanceTo(now);
    ASSERT_TRUE(detector_.OnPhase(rank, phase, At(now)).ok());
  }
  // Runs every deadline at or before `now`, then checks at `now` itself.
  void AdvanceTo(Duration now) {
    while (auto deadline = NextDeadline()) {
      if (*deadline > now) break;
      auto v = detector_.Check(At(*deadline));
      ASSERT_TRUE(v.has_value()) << "NextDeadline promised a verdict at "
                                 << FormatDuration(*deadline);
      verdicts_.push_back({*deadline, *v});
    }
    if (auto v = detector_.Check(At(now))) verdicts_.push_back({now, *v});
  }
  std::optional<Duration> NextDeadline() const {
    auto d = detector_.NextDeadline();
    if (!d.has_value()) return std::nullopt;
    return d->time_since_epoch();
  }

  HangDetector& detector() { return detector_; }
  struct Seen {
    Duration at;
    HangVerdict verdict;
  };
  const std::vector<Seen>& verdicts() const { return verdicts_; }

 private:
  HangDetector detector_;
  std::vector<Seen> verdicts_;
};

// All `world` ranks finish steps first..last, `step_time` apart, starting at
// `t`; returns the time of the last step end.
Duration RunSteps(Driver& d, int world, int64_t first, int64_t last, Duration t,
                  Duration step_time) {
  for (int64_t s = first; s <= last; ++s) {
    t += step_time;
    for (int r = 0; r < world; ++r) d.StepEnd(r, s, t + Ms(r));
  }
  return t;
}

TEST(HangDetectorOptions, ValidateNamesTheBadField) {
  HangDetectorOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.k = 0.5;
  EXPECT_THAT(o.Validate().message(), HasSubstr("k must be"));
  o = {};
  o.min_samples = o.window + 1;
  EXPECT_THAT(o.Validate().message(), HasSubstr("min_samples"));
  o = {};
  o.floor = Duration::zero();
  EXPECT_THAT(o.Validate().message(), HasSubstr("floor"));
}

TEST(HangDetector, NothingWatchedBeforeAGeneration) {
  HangDetector d({});
  EXPECT_FALSE(d.NextDeadline().has_value());
  EXPECT_FALSE(d.Check(At(seconds(1000))).has_value());
  EXPECT_FALSE(d.OnStepEnd(0, S(1), At(seconds(1))).ok());
}

TEST(HangDetector, RejectsRanksOutsideTheWorld) {
  HangDetector d({});
  d.OnGenerationStart(0, 2, At(Duration::zero()));
  EXPECT_EQ(d.OnStepEnd(2, S(1), At(Ms(100))).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.OnStepEnd(-1, S(1), At(Ms(100))).code(), StatusCode::kInvalidArgument);
}

TEST(HangDetector, DetectsAHangAtTheFloorForFastSteps) {
  Driver d;
  d.StartGeneration(0, 4, Duration::zero());
  const Duration last = RunSteps(d, 4, 1, 50, Duration::zero(), Ms(150));
  ASSERT_TRUE(d.verdicts().empty());
  // 3 × p99 (~150ms) is below the 2s floor.
  EXPECT_EQ(d.detector().StepTimeout(), seconds(2));
  // Rank 0 finished last at `last`; its deadline comes first.
  EXPECT_EQ(*d.NextDeadline(), last + seconds(2));
  d.AdvanceTo(last + seconds(2) - Ms(1));
  EXPECT_TRUE(d.verdicts().empty());
  d.AdvanceTo(last + seconds(3) + Ms(3));
  ASSERT_EQ(d.verdicts().size(), 1u);
  const HangVerdict& v = d.verdicts()[0].verdict;
  EXPECT_EQ(d.verdicts()[0].at, last + seconds(2));
  EXPECT_FALSE(v.during_startup);
  EXPECT_EQ(v.timeout, seconds(2));
  EXPECT_EQ(v.stalled_since, At(last));
  EXPECT_THAT(v.stalled_ranks, ElementsAre(0));  // the others stall 1-3ms later
  EXPECT_EQ(v.lowest_step, S(50));
  EXPECT_THAT(v.behind_ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(v.reason, HasSubstr("no step progress from rank 0 for 2.0s"));
  EXPECT_THAT(v.reason, HasSubstr("max(floor 2.0s, 3 x p99 150ms)"));
}

TEST(HangDetector, NamesTheRankThatIsBehind) {
  Driver d;
  d.StartGeneration(3, 4, Duration::zero());
  Duration t = RunSteps(d, 4, 1, 40, Duration::zero(), Ms(150));
  // Rank 2 never finishes step 41; the others finish it and block in step 42.
  t += Ms(150);
  for (int r : {0, 1, 3}) d.StepEnd(r, 41, t);
  d.AdvanceTo(t + seconds(10));
  ASSERT_EQ(d.verdicts().size(), 1u);
  const HangVerdict& v = d.verdicts()[0].verdict;
  EXPECT_EQ(v.generation, 3);
  EXPECT_THAT(v.stalled_ranks, ElementsAre(2));
  EXPECT_EQ(v.lowest_step, S(40));
  EXPECT_THAT(v.behind_ranks, ElementsAre(2));
  EXPECT_THAT(v.reason, HasSubstr("behind: rank 2 at step 40 (highest step 41)"));
}

TEST(HangDetector, LearnsALongerTimeoutForSlowSteps) {
  Driver d;
  d.StartGeneration(0, 2, Duration::zero());
  const Duration last = RunSteps(d, 2, 1, 20, Duration::zero(), seconds(10));
  EXPECT_EQ(d.detector().StepTimeout(), seconds(30));
  d.AdvanceTo(last + seconds(29));
  EXPECT_TRUE(d.verdicts().empty());
  d.AdvanceTo(last + seconds(31));
  ASSERT_EQ(d.verdicts().size(), 1u);
  EXPECT_EQ(d.verdicts()[0].at, last + seconds(30));
  EXPECT_THAT(d.verdicts()[0].verdict.reason, HasSubstr("max(floor 2.0s, 3 x p99 10.0s)"));
}

TEST(HangDetector, StartupTimeoutBeforeTheFirstStep) {
  HangDetectorOptions o;
  o.startup_timeout = seconds(60);
  Driver d(o);
  d.StartGeneration(0, 2, seconds(5));
  EXPECT_EQ(*d.NextDeadline(), seconds(65));
  d.AdvanceTo(seconds(64));
  EXPECT_TRUE(d.verdicts().empty());
  d.AdvanceTo(seconds(70));
  ASSERT_EQ(d.verdicts().size(), 1u);
  const HangVerdict& v = d.verdicts()[0].verdict;
  EXPECT_TRUE(v.during_startup);
  EXPECT_EQ(v.timeout, seconds(60));
  EXPECT_EQ(v.stalled_since, At(seconds(5)));
  EXPECT_FALSE(v.lowest_step.has_value());
  EXPECT_THAT(v.behind_ranks, ElementsAre(0, 1));
  EXPECT_THAT(v.reason, HasSubstr("no first step from ranks 0-1 within start-up timeout 1m"));
}

TEST(HangDetector, StartupIsOverOnlyWhenEveryRankHasStepped) {
  Driver d;
  d.StartGeneration(0, 3, Duration::zero());
  // Ranks 0 and 1 are quick to start, rank 2 is not: no step-sized timeout may
  // apply to the quick ones while they wait for it in the first collective.
  d.StepEnd(0, 1, seconds(10));
  d.StepEnd(1, 1, seconds(10));
  d.AdvanceTo(seconds(59));
  EXPECT_TRUE(d.verdicts().empty());
  d.AdvanceTo(seconds(61));
  ASSERT_EQ(d.verdicts().size(), 1u);
  const HangVerdict& v = d.verdicts()[0].verdict;
  EXPECT_TRUE(v.during_startup);
  EXPECT_THAT(v.behind_ranks, ElementsAre(2));
  EXPECT_THAT(v.reason, HasSubstr("no first step from rank 2"));
  EXPECT_THAT(v.reason, HasSubstr("other ranks reached step 1"));
}

TEST(HangDetector, WarmUpUsesTheStartupTimeoutUntilEnoughSamples) {
  HangDetectorOptions o;
  o.min_samples = 5;
  Driver d(o);
  d.StartGeneration(0, 1, Duration::zero());
  // Step 1 ends start-up; steps 2..4 give three samples: still warming up.
  const Duration last = RunSteps(d, 1, 1, 4, Duration::zero(), Ms(150));
  EXPECT_EQ(d.detector().StepTimeout(), o.startup_timeout);
  d.AdvanceTo(last + seconds(30));
  EXPECT_TRUE(d.verdicts().empty());
  d.AdvanceTo(last + seconds(61));
  ASSERT_EQ(d.verdicts().size(), 1u);
  EXPECT_THAT(d.verdicts()[0].verdict.reason, HasSubstr("while warming up (3 of 5"));
}

TEST(HangDetector, RestartGetsAFreshStartupTimeoutAndKeepsLearnedSteps) {
  Driver d;
  d.StartGeneration(0, 2, Duration::zero());
  Duration t = RunSteps(d, 2, 1, 30, Duration::zero(), Ms(150));
  // Generation 1 restores step 20 and takes 40s to get through its first step.
  t += seconds(1);
  d.StartGeneration(1, 2, t);
  d.AdvanceTo(t + seconds(40));
  EXPECT_TRUE(d.verdicts().empty());
  t = RunSteps(d, 2, 21, 21, t + seconds(40), Duration::zero());
  // The learned 2s timeout is back at once.
  EXPECT_EQ(*d.NextDeadline(), t + seconds(2));
  d.AdvanceTo(t + seconds(3));
  ASSERT_EQ(d.verdicts().size(), 1u);
  EXPECT_EQ(d.verdicts()[0].verdict.generation, 1);
  EXPECT_EQ(d.verdicts()[0].verdict.lowest_step, S(21));
}

TEST(HangDetector, ReportsOnceAndRearmsOnProgress) {
  Driver d;
  d.StartGeneration(0, 1, Duration::zero());
  Duration t = RunSteps(d, 1, 1, 20, Duration::zero(), Ms(100));
  d.AdvanceTo(t + seconds(5));
  EXPECT_EQ(d.verdicts().size(), 1u);
  EXPECT_FALSE(d.NextDeadline().has_value());
  d.AdvanceTo(t + seconds(50));
  EXPECT_EQ(d.verdicts().size(), 1u);
  // A duplicate report is no progress.
  d.StepEnd(0, 20, t + seconds(51));
  EXPECT_FALSE(d.NextDeadline().has_value());
  d.StepEnd(0, 21, t + seconds(52));
  EXPECT_TRUE(d.NextDeadline().has_value());
}

// A rank that is slower than the rest but keeps finishing steps is not hung,
// even when its step time exceeds the job-wide timeout.
TEST(HangDetector, SlowButProgressingRankIsNotFlagged) {
  Driver d;
  d.StartGeneration(0, 4, Duration::zero());
  for (int r = 0; r < 4; ++r) d.StepEnd(r, 1, seconds(1));
  // Ranks 0-2 take 1s per step (timeout 3s); rank 3 takes 4s per step.
  struct Ev {
    Duration at;
    int rank;
    int64_t step;
  };
  std::vector<Ev> events;
  for (int64_t s = 2; s <= 60; ++s) {
    for (int r = 0; r < 3; ++r) events.push_back({seconds(1) + seconds(s - 1), r, s});
  }
  for (int64_t s = 2; s <= 16; ++s) events.push_back({seconds(1) + seconds(4 * (s - 1)), 3, s});
  std::stable_sort(events.begin(), events.end(),
                   [](const Ev& a, const Ev& b) { return a.at < b.at; });
  for (const Ev& e : events) d.StepEnd(e.rank, e.step, e.at);
  EXPECT_EQ(d.detector().StepTimeout(), seconds(3));
  EXPECT_TRUE(d.verdicts().empty());
}

// A synchronous job slowed down 2x from step 100 (a fail-slow node drags the
// collective) keeps progressing and must not look hung.
TEST(HangDetector, SuddenTwoTimesSlowdownIsNotAHang) {
  Driver d;
  d.StartGeneration(0, 8, Duration::zero());
  Duration t = RunSteps(d, 8, 1, 99, Duration::zero(), seconds(1));
  t = RunSteps(d, 8, 100, 200, t, seconds(2));
  EXPECT_TRUE(d.verdicts().empty());
  d.AdvanceTo(t + seconds(5));
  EXPECT_TRUE(d.verdicts().empty());
}

// The no-false-positive case: 500 steps with natural jitter (lognormal step
// times, an occasional 2x slow step, per-rank skew) raise nothing.
void CleanRunRaisesNothing(uint32_t seed, double median_s) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ", median step " + std::to_string(median_s) + "s");
  std::mt19937 rng(seed);
  std::lognormal_distribution<double> step_time(std::log(median_s), 0.25);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  constexpr int kWorld = 8;
  Driver d;
  d.StartGeneration(0, kWorld, Duration::zero());
  Duration t = seconds(20);  // start-up
  for (int64_t s = 1; s <= 500; ++s) {
    double dt = step_time(rng);
    if (unit(rng) < 0.02) dt *= 2.0;
    t += FromSeconds(dt);
    for (int r = 0; r < kWorld; ++r) {
      d.StepEnd(r, s, t + FromSeconds(unit(rng) * 0.05 * median_s));
    }
  }
  for (const auto& seen : d.verdicts()) ADD_FAILURE() << seen.verdict.reason;
  EXPECT_TRUE(d.verdicts().empty());
}

TEST(HangDetector, CleanRunWithJitterRaisesNothing) {
  for (uint32_t seed : {1u, 2u, 3u}) CleanRunRaisesNothing(seed, 0.150);
  // With 1s steps the floor no longer hides the jitter: 3 × p99 decides.
  for (uint32_t seed : {4u, 5u, 6u}) CleanRunRaisesNothing(seed, 1.0);
}

// An evaluation ten times longer than a step raises nothing, the first
// time (the first-time phase timeout) and later (its learned timeout); a
// hang inside one is still a hang, reported in that phase.
TEST(HangDetectorPhases, ALongEvaluationIsNoHangAndAHangInsideOneIs) {
  HangDetectorOptions o;
  o.phase_first_timeout = seconds(60);
  Driver d(o);
  constexpr int kWorld = 4;
  d.StartGeneration(0, kWorld, Duration::zero());
  Duration t = RunSteps(d, kWorld, 1, 20, seconds(5), Ms(500));
  ASSERT_EQ(d.detector().StepTimeout(), seconds(2));
  for (int round = 0; round < 3; ++round) {
    for (int r = 0; r < kWorld; ++r) d.Phase(r, "eval", t + Ms(r));
    t += seconds(5);  // ten steps long, and past the 2s step timeout
    for (int r = 0; r < kWorld; ++r) d.Phase(r, "train", t + Ms(r));
    t = RunSteps(d, kWorld, 21 + 10 * round, 30 + 10 * round, t, Ms(500));
  }
  for (const auto& seen : d.verdicts()) ADD_FAILURE() << seen.verdict.reason;
  // Learned from three 5s evaluations: 3 x p99.
  EXPECT_EQ(d.detector().PhaseTimeout("eval"), seconds(15));
  // The fourth evaluation hangs on rank 2.
  for (int r = 0; r < kWorld; ++r) d.Phase(r, "eval", t);
  for (int r : {0, 1, 3}) d.Phase(r, "train", t + seconds(5));
  d.AdvanceTo(t + seconds(16));
  ASSERT_EQ(d.verdicts().size(), 1u);
  const HangVerdict& v = d.verdicts()[0].verdict;
  EXPECT_EQ(v.phase, "eval");
  // The others stall with it: they wait for it at their next collective.
  EXPECT_THAT(v.stalled_ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(v.behind_ranks, ElementsAre(2));
  EXPECT_EQ(d.verdicts()[0].at, t + seconds(15));
  EXPECT_THAT(v.reason, HasSubstr("in phase 'eval'"));
}

// One rank evaluates while the others wait for it at their next collective:
// they are given until its phase deadline, and their step clocks restart
// when it ends.
TEST(HangDetectorPhases, RanksWaitingForOneInAPhaseAreNotHung) {
  HangDetectorOptions o;
  o.phase_first_timeout = seconds(30);
  Driver d(o);
  d.StartGeneration(0, 2, Duration::zero());
  Duration t = RunSteps(d, 2, 1, 20, seconds(5), Ms(200));
  d.Phase(0, "eval", t);
  d.AdvanceTo(t + seconds(20));
  EXPECT_TRUE(d.verdicts().empty());
  d.Phase(0, "train", t + seconds(20));
  // From the evaluation's end the step timeout (the 2s floor) applies again.
  d.AdvanceTo(t + seconds(21));
  EXPECT_TRUE(d.verdicts().empty());
  d.AdvanceTo(t + seconds(23));
  ASSERT_EQ(d.verdicts().size(), 1u);
  EXPECT_EQ(d.verdicts()[0].at, t + seconds(22));
  EXPECT_EQ(d.verdicts()[0].verdict.phase, "train");
  // Phase reports are checked like step reports.
  EXPECT_FALSE(d.detector().OnPhase(2, "eval", At(t)).ok());
}

// Found by the demo: a checkpoint phase inside every step (a copy into node
// memory) restarted the step clocks at its end, so the learned step time was
// the few milliseconds from there to the step's report, and a slow step
// after a restart was taken for a hang. The phase's time comes out of the
// step samples, no more.
TEST(HangDetectorPhases, APhaseInsideEveryStepShortensTheStepSamplesByItsLengthOnly) {
  Driver d;
  constexpr int kWorld = 2;
  d.StartGeneration(0, kWorld, Duration::zero());
  Duration t = seconds(5);
  for (int64_t s = 1; s <= 60; ++s) {
    t += Ms(490);
    for (int r = 0; r < kWorld; ++r) d.Phase(r, "checkpoint", t + Ms(r));
    for (int r = 0; r < kWorld; ++r) d.Phase(r, "train", t + Ms(10 + r));
    t += Ms(10);
    for (int r = 0; r < kWorld; ++r) d.StepEnd(r, s, t + Ms(r));
  }
  EXPECT_TRUE(d.verdicts().empty());
  ASSERT_TRUE(d.detector().P99StepDuration().has_value());
  EXPECT_GE(*d.detector().P99StepDuration(), Ms(480));
  EXPECT_LE(*d.detector().P99StepDuration(), Ms(500));
}

// Found by the demo: after the last step rank 1 ended while rank 0 ran its
// final evaluation; rank 1, finished, was still watched and declared hung.
TEST(HangDetectorPhases, AFinishedRankIsNotWatched) {
  Driver d;
  d.StartGeneration(0, 2, Duration::zero());
  const Duration t = RunSteps(d, 2, 1, 30, seconds(5), Ms(200));
  ASSERT_TRUE(d.detector().OnRankFinished(1).ok());
  d.Phase(0, "eval", t + Ms(5));
  d.AdvanceTo(t + seconds(60));
  EXPECT_TRUE(d.verdicts().empty());
  ASSERT_TRUE(d.detector().OnRankFinished(0).ok());
  EXPECT_FALSE(d.NextDeadline().has_value());
  EXPECT_FALSE(d.detector().OnRankFinished(2).ok());
}

// Found on a loaded core: a trainer evaluated every 10 steps in phase "eval"
// (learned timeout: the floor) and, after its last step, ran its longer
// final validation and sample under the same name. What a rank does after
// its last step is its finish, whatever it calls it: judged by the
// first-time timeout, never by the learned one of a phase it names.
TEST(HangDetectorPhases, WhatARankDoesAfterItsLastStepIsItsFinishWhateverItCallsIt) {
  HangDetectorOptions o;
  o.phase_first_timeout = seconds(30);
  Driver d(o);
  d.StartGeneration(0, 2, Duration::zero());
  Duration t = RunSteps(d, 2, 1, 10, seconds(5), Ms(200));
  for (int r = 0; r < 2; ++r) d.Phase(r, "eval", t);
  t += Ms(100);
  for (int r = 0; r < 2; ++r) d.Phase(r, "train", t);
  ASSERT_EQ(d.detector().PhaseTimeout("eval"), o.floor);  // learned: 3 x 100 ms, at least 2 s
  t = RunSteps(d, 2, 11, 20, t, Ms(200));
  for (int r = 0; r < 2; ++r) d.Phase(r, kFinishPhase, t);  // the job machine: step 20 of 20
  d.Phase(0, "eval", t + Ms(1));  // validation and sample, 2.1 s on a loaded core
  d.AdvanceTo(t + seconds(29));
  EXPECT_TRUE(d.verdicts().empty());
  d.AdvanceTo(t + seconds(31));
  ASSERT_EQ(d.verdicts().size(), 1u);
  EXPECT_EQ(d.verdicts()[0].verdict.phase, kFinishPhase);
}

// A phase that never ends is judged by the first-time timeout.
TEST(HangDetectorPhases, AFirstPhaseThatNeverEndsTimesOut) {
  HangDetectorOptions o;
  o.phase_first_timeout = seconds(30);
  Driver d(o);
  d.StartGeneration(0, 2, Duration::zero());
  const Duration t = RunSteps(d, 2, 1, 10, seconds(5), Ms(200));
  d.Phase(0, "checkpoint", t);
  d.Phase(1, "checkpoint", t);
  d.AdvanceTo(t + seconds(31));
  ASSERT_EQ(d.verdicts().size(), 1u);
  EXPECT_EQ(d.verdicts()[0].at, t + seconds(30));
  EXPECT_EQ(d.verdicts()[0].verdict.phase, "checkpoint");
  EXPECT_THAT(d.verdicts()[0].verdict.reason, HasSubstr("the first time the phase is seen"));
}

// Two ranks stepping every 10 ms past warm-up: the step timeout is the
// floor (1 s), each rank's own last step far below it.
HangDetector WarmedUp(Duration& t) {
  HangDetectorOptions o;
  o.floor = seconds(1);
  o.k = 1;
  o.min_samples = 1;
  o.window = 4;
  o.startup_timeout = seconds(5);
  o.phase_first_timeout = seconds(100);
  HangDetector d(o);
  d.OnGenerationStart(0, 2, At(t));
  for (int64_t s = 1; s <= 5; ++s) {
    t += Ms(10);
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(d.OnStepEnd(r, S(s), At(t)).ok());
  }
  return d;
}

// A phase's time is taken out of every rank's clock, but never moves one
// past now: rank 0, which finished a step 40 s into rank 1's 50 s
// evaluation, is judged from the evaluation's end (its clock would
// otherwise stand 40 s in the future).
TEST(HangDetector, PhaseTimeTakenOutMovesNoClockPastNow) {
  Duration t{0};
  HangDetector d = WarmedUp(t);
  const Duration eval = t + Ms(10);
  ASSERT_TRUE(d.OnPhase(1, "eval", At(eval)).ok());
  ASSERT_TRUE(d.OnStepEnd(0, S(6), At(eval + seconds(40))).ok());
  ASSERT_TRUE(d.OnPhase(1, "train", At(eval + seconds(50))).ok());
  ASSERT_TRUE(d.OnRankFinished(1).ok());
  // Rank 0: from the end of the evaluation, k (1) x its own last step
  // (from its step 5 at t to its step 6).
  const Duration own = eval + seconds(40) - t;
  EXPECT_EQ(d.NextDeadline(), At(eval + seconds(50) + own));
}

// A watcher away for 100 s (a controller's restart) blames nobody for the
// silence: every clock restarts at the resume.
TEST(HangDetector, AResumeRestartsEveryClock) {
  Duration t{0};
  HangDetector d = WarmedUp(t);
  d.Resume(At(t + seconds(100)));
  EXPECT_EQ(d.NextDeadline(), At(t + seconds(100) + seconds(1)));
  EXPECT_FALSE(d.Check(At(t + seconds(100) + Ms(999))).has_value());
  EXPECT_TRUE(d.Check(At(t + seconds(101))).has_value());
}

// NextDeadline is kept by parts (the ranks in "train" by their progress,
// the ranks in a phase by phase) rather than by a walk over every rank: it
// must still be exactly the time from which Check gives a verdict, whatever
// the ranks did. Random steps, phases, ends, resumes and restarts, checked
// against Check on copies of the detector after every input.
// Small worlds reach every corner of phases and ends; large ones, with each
// rank's own step time, the walk for the earliest deadline past its first
// ranks.
class HangDetectorDeadlines : public ::testing::TestWithParam<int> {};

TEST_P(HangDetectorDeadlines, NextDeadlineIsExactlyWhenCheckFirstGivesAVerdict) {
  const int max_world = GetParam();
  // Other inputs than step ends as often per rank in a large world as in a
  // small one: a large world steps long enough between them.
  const int rarity = 20 * ((max_world + 5) / 6);
  std::mt19937_64 rng(28 + max_world);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const char* kPhases[] = {"train", "eval", "checkpoint"};
  HangDetectorOptions o;
  o.floor = Ms(200);
  o.min_samples = 3;
  o.window = 8;
  o.startup_timeout = seconds(2);
  o.phase_first_timeout = seconds(1);
  HangDetector d(o);
  Duration now{0};
  int world = 4;
  std::vector<int64_t> steps(world, 0);
  d.OnGenerationStart(0, world, At(now));
  for (int i = 0; i < 4000 * (rarity / 20); ++i) {
    now += Ms(pick(300));
    const int r = pick(world);
    switch (pick(rarity)) {
      case 0:
        world = 1 + pick(max_world);
        steps.assign(world, 0);
        d.OnGenerationStart(i, world, At(now));
        break;
      case 1:
        d.Resume(At(now));
        break;
      case 2:
        ASSERT_TRUE(d.OnRankFinished(r).ok());
        break;
      case 3:
      case 4:
      case 5:
        ASSERT_TRUE(d.OnPhase(r, kPhases[pick(3)], At(now)).ok());
        break;
      default:
        steps[r] += 1 + pick(2);
        ASSERT_TRUE(d.OnStepEnd(r, S(steps[r]), At(now)).ok());
    }
    const std::optional<TimePoint> next = d.NextDeadline();
    if (!next) {
      HangDetector probe = d;
      EXPECT_FALSE(probe.Check(At(now + seconds(3600))).has_value()) << "input " << i;
      continue;
    }
    HangDetector before = d, at = d;
    EXPECT_FALSE(before.Check(*next - Duration(1)).has_value()) << "input " << i;
    EXPECT_TRUE(at.Check(*next).has_value()) << "input " << i;
    // A verdict ends the watch until progress: start over from a fresh one.
    if (*next <= At(now)) {
      ASSERT_TRUE(d.Check(At(now)).has_value());
    }
  }
}

// The earliest deadline can belong to a rank whose progress is not the
// oldest: its own timeout (k x its last step) is shorter than an older
// rank's. k = 2, timeout = floor 1 s (p99 0.5 s): A progressed at 5 s with a
// 5 s step (deadline 15 s), B at 5.5 s with 3 s (11.5 s), U at 10 s with
// 0.5 s (11 s).
TEST(HangDetector, TheEarliestDeadlineIsARanksOwnWhereThatIsShorter) {
  HangDetectorOptions o;
  o.k = 2;
  o.floor = seconds(1);
  o.min_samples = 3;
  Driver d(o);
  d.StartGeneration(0, 3, Duration::zero());
  for (int r = 0; r < 3; ++r) d.StepEnd(r, 1, Duration::zero());
  for (int s = 2; s <= 21; ++s) {
    d.StepEnd(2, s, Ms(500) * (s - 1));
    if (s == 6) d.StepEnd(1, 2, Ms(2500));
    if (s == 11) d.StepEnd(0, 2, Ms(5000));
    if (s == 12) d.StepEnd(1, 3, Ms(5500));
  }
  ASSERT_EQ(d.detector().StepTimeout(), seconds(1));
  EXPECT_EQ(*d.NextDeadline(), seconds(11));
  // (A and B were judged before, at 1 s from their first steps.)
  const size_t before = d.verdicts().size();
  d.AdvanceTo(seconds(12));
  ASSERT_EQ(d.verdicts().size(), before + 1);
  EXPECT_EQ(d.verdicts().back().at, seconds(11));
  EXPECT_THAT(d.verdicts().back().verdict.stalled_ranks, ElementsAre(2));
}

INSTANTIATE_TEST_SUITE_P(Worlds, HangDetectorDeadlines, ::testing::Values(6, 64));

}  // namespace
}  // namespace endure::core
