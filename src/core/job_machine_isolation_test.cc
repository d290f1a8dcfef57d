// The job machine's implicit-failure detectors and isolation (issue 12):
// stragglers, the SDC check, hang localization, pairwise tests, phases,
// strikes and refused or quarantined nodes. Scripted time, no threads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/job_codec.h"
#include "core/job_machine.h"

namespace endure::core {
namespace {

TimePoint T(double s) { return At(FromSeconds(s)); }

template <typename A>
std::vector<A> Find(const std::vector<JobAction>& actions) {
  std::vector<A> out;
  for (const JobAction& a : actions) {
    if (const A* x = std::get_if<A>(&a)) out.push_back(*x);
  }
  return out;
}

JobMachineOptions Options(int nodes, int ranks_per_node) {
  JobMachineOptions o;
  o.nodes = nodes;
  o.ranks_per_node = ranks_per_node;
  o.recovery.backoff_initial = Duration(0);
  o.recovery.paths["node_lost"] = RecoveryPath::kEvictAndReplace;
  return o;
}

// `registered` nodes of `ranks_per_node` ranks each, for a job of `nodes`.
class Cluster {
 public:
  Cluster(JobMachineOptions o, int registered)
      : m(o, {}, T(0)), ranks_per_node_(o.ranks_per_node), world_(o.nodes * o.ranks_per_node) {
    for (int n = 0; n < registered; ++n) {
      Collect(Do(NodeUp{NodeId{n}, "node" + std::to_string(n), ranks_per_node_, ""}));
    }
  }

  std::vector<JobAction> Do(const JobEvent& e) { return m.Step(e, T(now)); }
  std::vector<JobAction> Collect(std::vector<JobAction> a) {
    log.insert(log.end(), a.begin(), a.end());
    return a;
  }
  std::vector<JobAction> Beat() {
    std::vector<JobAction> all;
    for (NodeId n : m.NodesUp()) {
      auto a = Do(NodeHeartbeat{n});
      all.insert(all.end(), a.begin(), a.end());
    }
    return all;
  }
  void Ready(int64_t start_step) {
    for (int r = 0; r < world_; ++r) Collect(Do(WorkerReady{m.generation(), r, start_step, 0}));
  }
  // Every rank finishes `step`; `compute(rank)` is its compute time.
  std::vector<JobAction> Step(int64_t step, const std::function<double(int)>& compute,
                              int64_t total_steps = 0, int ckpt_every = 10) {
    std::vector<JobAction> all = Beat();
    for (int r = 0; r < world_ && m.phase() == JobPhase::kRunning; ++r) {
      StepEnd e{m.generation(), r, step, 2.0, 0, (r == 0 && step % ckpt_every == 0) ? step : -1};
      e.compute_s = compute(r);
      e.total_steps = total_steps;
      auto a = Do(e);
      all.insert(all.end(), a.begin(), a.end());
    }
    Collect(all);
    return all;
  }
  std::vector<JobAction> StopAll() {
    std::vector<JobAction> all;
    for (NodeId n : m.NodesUp()) {
      auto a = Do(GenerationStoppedEvent{m.generation(), n});
      all.insert(all.end(), a.begin(), a.end());
    }
    Collect(all);
    return all;
  }

  JobMachine m;
  double now = 0;
  std::vector<JobAction> log;  // everything the machine did

 private:
  int ranks_per_node_;
  int world_;
};

// ---- Stragglers ----

TEST(JobMachineStragglers, ASlowRankIsFlaggedWithItsNodeAndKeptWhenMovingCostsMore) {
  for (double factor : {1.5, 3.0}) {
    SCOPED_TRACE("factor " + std::to_string(factor));
    Cluster c(Options(4, 1), 4);
    c.Ready(0);
    std::mt19937 rng(3);
    std::lognormal_distribution<double> jitter(0, 0.05);
    constexpr int kSlowFrom = 30;
    int flagged_at = -1;
    for (int s = 1; s <= 100 && flagged_at < 0; ++s) {
      c.now += 0.1 * (s >= kSlowFrom ? factor : 1.0);
      // 200 steps to go: keeping it costs seconds, a restart 30s.
      c.Step(
          s, [&](int r) { return 0.1 * jitter(rng) * (r == 2 && s >= kSlowFrom ? factor : 1); },
          /*total_steps=*/200);
      if (!c.m.stragglers().empty()) flagged_at = s;
    }
    ASSERT_GE(flagged_at, kSlowFrom);
    // Within the detector's window of 20 steps.
    EXPECT_LT(flagged_at, kSlowFrom + 20);
    // Kept: reported, no incident, no stop.
    EXPECT_TRUE(c.m.incidents().empty());
    const StragglerReport& kept = c.m.stragglers().back();
    EXPECT_EQ(kept.node_name, "node2");
    EXPECT_EQ(kept.rank, Rank{2});
    EXPECT_NE(kept.reason.find("keeping it costs"), std::string::npos) << kept.reason;
    EXPECT_NE(kept.reason.find("keep it running"), std::string::npos) << kept.reason;
    EXPECT_TRUE(Find<StopGenerationAction>(c.log).empty());
    auto strikes = Find<StrikeNodeAction>(c.log);
    ASSERT_EQ(strikes.size(), 1u);
    EXPECT_EQ(strikes[0].cause, "straggler");
    EXPECT_FALSE(strikes[0].hard);
    EXPECT_EQ(c.m.phase(), JobPhase::kRunning);
  }
}

TEST(JobMachineStragglers, ASpareIsSwappedInWhenTheRemainingRunIsLong) {
  Cluster c(Options(4, 1), 5);  // node4 is a spare
  c.Ready(0);
  for (int s = 1; s <= 60 && c.m.phase() == JobPhase::kRunning; ++s) {
    c.now += 0.2;
    c.Step(
        s, [&](int r) { return r == 1 && s > 10 ? 0.2 : 0.1; }, /*total_steps=*/1'000'000);
  }
  ASSERT_EQ(c.m.incidents().size(), 1u);
  EXPECT_EQ(c.m.incidents()[0].action, "swap_spare");
  EXPECT_NE(c.m.incidents()[0].reason.find("swap in a spare"), std::string::npos)
      << c.m.incidents()[0].reason;
  auto evict = Find<EvictNodeAction>(c.log);
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_EQ(evict[0].node, NodeId{1});
  auto start = Find<StartGenerationAction>(c.StopAll());
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0].nodes, (std::vector<NodeId>{NodeId{0}, NodeId{2}, NodeId{3}, NodeId{4}}));
}

// Found by an end-to-end run: a straggler flagged at the job's last step
// was weighed over the default horizon (an hour) and evicted; with nothing
// left to train, keeping it costs nothing.
TEST(JobMachineStragglers, AtTheLastStepNothingIsLeftToGainByMovingIt) {
  Cluster c(Options(2, 1), 3);  // a spare, so that a swap would be possible
  c.Ready(0);
  for (int s = 1; s <= 30; ++s) {
    c.now += 0.1;
    c.Step(
        s, [&](int r) { return r == 0 && s > 18 ? 0.2 : 0.1; }, /*total_steps=*/30);
  }
  EXPECT_TRUE(c.m.incidents().empty());
  ASSERT_EQ(c.m.stragglers().size(), 1u);
  EXPECT_EQ(c.m.stragglers()[0].step, StepNumber{30});
  EXPECT_NE(c.m.stragglers()[0].reason.find("keep it running"), std::string::npos)
      << c.m.stragglers()[0].reason;
}

TEST(JobMachineStragglers, ACleanRunWithNaturalJitterRaisesNothing) {
  Cluster c(Options(2, 4), 2);
  c.Ready(0);
  std::mt19937 rng(11);
  std::lognormal_distribution<double> jitter(0, 0.05);
  std::uniform_real_distribution<double> unit(0, 1);
  for (int s = 1; s <= 500; ++s) {
    c.now += 0.12;
    c.Step(s, [&](int) { return 0.1 * jitter(rng) * (unit(rng) < 0.02 ? 2 : 1); });
  }
  for (const Incident& inc : c.m.incidents()) ADD_FAILURE() << inc.reason;
  for (const StragglerReport& s : c.m.stragglers()) ADD_FAILURE() << s.reason;
  EXPECT_TRUE(Find<StrikeNodeAction>(c.log).empty());
}

// ---- Silent data corruption ----

void Fingerprints(Cluster& c, int world, int64_t step, const std::string& good,
                  const std::map<int, std::string>& bad = {}) {
  for (int r = 0; r < world; ++r) {
    auto it = bad.find(r);
    c.Collect(
        c.Do(FingerprintReported{c.m.generation(), r, step, it == bad.end() ? good : it->second}));
  }
}

TEST(JobMachineSdc, TheMinorityReplicaIsStruckHardAndTheJobRollsBackToTheLastAgreedCheck) {
  JobMachineOptions o = Options(2, 2);
  o.isolation.sdc_check_every = 10;
  Cluster c(o, 3);  // node2 stands by as the replacement
  c.Ready(0);
  for (int s = 1; s <= 30; ++s) {
    c.now += 0.1;
    c.Step(s, [](int) { return 0.05; });
    if (s % 10 == 0) {
      Fingerprints(c, 4, s, "00000000000000a" + std::to_string(s / 10),
                   s == 30 ? std::map<int, std::string>{{1, "ffffffffffffffff"}}
                           : std::map<int, std::string>{});
    }
  }
  ASSERT_EQ(c.m.incidents().size(), 1u);
  const Incident& inc = c.m.incidents()[0];
  EXPECT_EQ(inc.cause.name, "sdc");
  EXPECT_EQ(inc.action, "rollback_and_evict");
  EXPECT_EQ(inc.suspects, std::vector<std::string>{"node0"});
  auto strikes = Find<StrikeNodeAction>(c.log);
  ASSERT_EQ(strikes.size(), 1u);
  EXPECT_EQ(strikes[0].node, NodeId{0});
  EXPECT_EQ(strikes[0].cause, "sdc");
  EXPECT_TRUE(strikes[0].hard);
  auto evict = Find<EvictNodeAction>(c.log);
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_EQ(evict[0].node, NodeId{0});
  // Node 1 stops; the next generation runs on node1 and node2 from the
  // newest checkpoint at or before step 20, the last check that agreed.
  auto start = Find<StartGenerationAction>(c.StopAll());
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0].nodes, (std::vector<NodeId>{NodeId{1}, NodeId{2}}));
  EXPECT_EQ(start[0].restore_step, StepNumber{20});
  EXPECT_EQ(start[0].abandoned_from, StepNumber{21});
}

TEST(JobMachineSdc, TwoReplicasThatDisagreeAreBothSuspectsAndNeitherIsEvicted) {
  JobMachineOptions o = Options(2, 1);
  o.isolation.sdc_check_every = 5;
  Cluster c(o, 2);
  c.Ready(0);
  for (int s = 1; s <= 10; ++s) {
    c.now += 0.1;
    c.Step(s, [](int) { return 0.05; });
    if (s % 5 == 0) {
      Fingerprints(c, 2, s, "0123456789abcdef",
                   s == 10 ? std::map<int, std::string>{{0, "fedcba9876543210"}}
                           : std::map<int, std::string>{});
    }
  }
  ASSERT_EQ(c.m.incidents().size(), 1u);
  EXPECT_EQ(c.m.incidents()[0].action, "rollback");
  EXPECT_EQ(c.m.incidents()[0].suspects, (std::vector<std::string>{"node0", "node1"}));
  auto strikes = Find<StrikeNodeAction>(c.log);
  ASSERT_EQ(strikes.size(), 2u);
  for (const StrikeNodeAction& s : strikes) {
    EXPECT_EQ(s.cause, "sdc_suspect");
    EXPECT_FALSE(s.hard);
  }
  EXPECT_TRUE(Find<EvictNodeAction>(c.log).empty());
  auto start = Find<StartGenerationAction>(c.StopAll());
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0].restore_step, StepNumber{5});
}

// With two replicas and a spare, a recomputation decides: one suspect is
// swapped out and the steps recomputed; agreement convicts the one swapped
// out, a second disagreement the one that stayed.
TEST(JobMachineSdc, TwoReplicasAreDecidedByARecomputationOnASpare) {
  for (bool agree_after : {true, false}) {
    SCOPED_TRACE(agree_after ? "agrees after the swap" : "disagrees again");
    JobMachineOptions o = Options(2, 1);
    o.isolation.sdc_check_every = 5;
    Cluster c(o, 3);  // node2: the spare
    c.Ready(0);
    for (int s = 1; s <= 10; ++s) {
      c.now += 0.1;
      c.Step(s, [](int) { return 0.05; });
      if (s % 5 == 0) {
        Fingerprints(c, 2, s, "0123456789abcdef",
                     s == 10 ? std::map<int, std::string>{{1, "fedcba9876543210"}}
                             : std::map<int, std::string>{});
      }
    }
    ASSERT_EQ(c.m.incidents().size(), 1u);
    EXPECT_EQ(c.m.incidents()[0].action, "rollback_and_recompute");
    auto evict = Find<EvictNodeAction>(c.log);
    ASSERT_EQ(evict.size(), 1u);
    EXPECT_EQ(evict[0].node, NodeId{1});
    auto start = Find<StartGenerationAction>(c.StopAll());
    ASSERT_EQ(start.size(), 1u);
    EXPECT_EQ(start[0].nodes, (std::vector<NodeId>{NodeId{0}, NodeId{2}}));
    EXPECT_EQ(start[0].restore_step, StepNumber{5});
    c.log.clear();
    c.Ready(5);
    for (int s = 6; s <= 10; ++s) {
      c.now += 0.1;
      c.Step(s, [](int) { return 0.05; });
    }
    Fingerprints(c, 2, 10, "0123456789abcdef",
                 agree_after ? std::map<int, std::string>{}
                             : std::map<int, std::string>{{0, "fedcba9876543210"}});
    auto strikes = Find<StrikeNodeAction>(c.log);
    ASSERT_EQ(strikes.size(), 1u);
    EXPECT_EQ(strikes[0].cause, "sdc");
    EXPECT_TRUE(strikes[0].hard);
    if (agree_after) {
      EXPECT_EQ(strikes[0].node, NodeId{1});  // the one swapped out
      EXPECT_EQ(c.m.incidents().size(), 1u);
    } else {
      EXPECT_EQ(strikes[0].node, NodeId{0});  // the one that stayed
      ASSERT_EQ(c.m.incidents().size(), 2u);
      EXPECT_EQ(c.m.incidents()[1].action, "rollback_and_evict");
      EXPECT_EQ(c.m.incidents()[1].suspects, std::vector<std::string>{"node0"});
    }
  }
}

// ---- Hangs: stacks, then pairs ----

constexpr char kAllreduceStack[] =
    "Thread 1 (Thread 0x7f00aa (LWP 101)):\n"
    "#0  0x00007f1 in syscall () from /lib/libc.so.6\n"
    "#1  0x00007f2 in gloo::transport::tcp::UnboundBuffer::waitRecv(int*, "
    "std::chrono::duration<long, std::ratio<1l, 1000l> >) ()\n"
    "#2  0x00007f3 in c10d::ProcessGroupGloo::AsyncAllreduceWork::run() ()\n"
    "#3  0x00007f4 in Trainer::Step(long) ()\n"
    "#4  0x00007f5 in main ()\n";
constexpr char kSleepStack[] =
    "Thread 1 (Thread 0x7f00bb (LWP 202)):\n"
    "#0  0x00007f9 in clock_nanosleep () from /lib/libc.so.6\n"
    "#1  0x00007fa in nanosleep () from /lib/libc.so.6\n"
    "#2  0x00007fb in endure::Session::BeginStep(long) ()\n"
    "#3  0x00007f4 in Trainer::Step(long) ()\n"
    "#4  0x00007f5 in main ()\n";

// Runs a clean job to step 20, then lets every rank stall until the hang
// is declared; returns the hang's actions.
std::vector<JobAction> HangAfter20(Cluster& c) {
  c.Ready(0);
  for (int s = 1; s <= 20; ++s) {
    c.now += 0.15;
    c.Step(s, [](int) { return 0.1; });
  }
  std::vector<JobAction> hang;
  for (int i = 0; i < 40 && Find<StopGenerationAction>(hang).empty(); ++i) {
    c.now += 0.1;
    hang = c.Collect(c.Beat());
    auto t = c.Collect(c.Do(Tick{}));
    hang.insert(hang.end(), t.begin(), t.end());
  }
  return hang;
}

TEST(JobMachineHangs, TheRankWhoseStackDiffersNamesItsNodeAndItsNodeIsEvicted) {
  Cluster c(Options(2, 2), 2);
  auto hang = HangAfter20(c);
  auto stop = Find<StopGenerationAction>(hang);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_TRUE(stop[0].dump_stacks);
  for (int r = 0; r < 4; ++r) {
    c.Collect(c.Do(StackDumpEvent{c.m.generation(), r, r == 1 ? kSleepStack : kAllreduceStack}));
  }
  c.StopAll();
  const Incident& inc = c.m.incidents().back();
  EXPECT_EQ(inc.cause.name, "hang");
  EXPECT_EQ(inc.suspects, std::vector<std::string>{"node0"});
  EXPECT_EQ(inc.action, "evict_suspects");
  EXPECT_NE(inc.reason.find("rank 1 differs"), std::string::npos) << inc.reason;
  auto evict = Find<EvictNodeAction>(c.log);
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_EQ(evict[0].node, NodeId{0});
  auto strikes = Find<StrikeNodeAction>(c.log);
  ASSERT_EQ(strikes.size(), 1u);
  EXPECT_EQ(strikes[0].cause, "hang_suspect");
}

TEST(JobMachineHangs, WithoutOverEvictionTheSuspectIsNamedAndRestartedInPlace) {
  JobMachineOptions o = Options(2, 2);
  o.isolation.over_evict = false;
  Cluster c(o, 2);
  HangAfter20(c);
  for (int r = 0; r < 4; ++r) {
    c.Collect(c.Do(StackDumpEvent{c.m.generation(), r, r == 3 ? kSleepStack : kAllreduceStack}));
  }
  auto start = Find<StartGenerationAction>(c.StopAll());
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(c.m.incidents().back().suspects, std::vector<std::string>{"node1"});
  EXPECT_TRUE(Find<EvictNodeAction>(c.log).empty());
}

TEST(JobMachineHangs, NoStackOutlierRunsThePairwiseTestWhichNamesTheFaultyNode) {
  Cluster c(Options(4, 1), 5);  // node4: the replacement
  HangAfter20(c);
  for (int r = 0; r < 4; ++r) c.Collect(c.Do(StackDumpEvent{c.m.generation(), r, kAllreduceStack}));
  auto round1 = Find<RunPairTestAction>(c.StopAll());
  ASSERT_EQ(round1.size(), 1u);
  EXPECT_EQ(c.m.phase(), JobPhase::kTesting);
  EXPECT_EQ(round1[0].round, 1);
  ASSERT_EQ(round1[0].pairs.size(), 2u);
  // Node 3's link is broken: every pair with it fails.
  auto answer = [&](const RunPairTestAction& a) {
    std::vector<JobAction> all;
    for (auto [x, y] : a.pairs) {
      const bool bad = x == NodeId{3} || y == NodeId{3};
      auto r = c.Collect(c.Do(PairTestResult{a.test, a.round, x, y, !bad, bad ? 0.01 : 0.1,
                                             bad ? "Connection reset by peer" : ""}));
      all.insert(all.end(), r.begin(), r.end());
    }
    return all;
  };
  auto after1 = answer(round1[0]);
  auto round2 = Find<RunPairTestAction>(after1);
  ASSERT_EQ(round2.size(), 1u);
  EXPECT_EQ(round2[0].round, 2);
  auto after2 = answer(round2[0]);
  auto evict = Find<EvictNodeAction>(after2);
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_EQ(evict[0].node, NodeId{3});
  EXPECT_EQ(c.m.incidents().back().suspects, std::vector<std::string>{"node3"});
  EXPECT_NE(c.m.incidents().back().reason.find("pairwise test"), std::string::npos);
  auto start = Find<StartGenerationAction>(after2);
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0].nodes, (std::vector<NodeId>{NodeId{0}, NodeId{1}, NodeId{2}, NodeId{4}}));
}

TEST(JobMachineHangs, APairwiseRoundThatIsNotAnsweredFailsItsPairsAtTheTimeout) {
  JobMachineOptions o = Options(4, 1);
  o.isolation.pairwise_timeout = std::chrono::seconds(2);
  Cluster c(o, 4);
  HangAfter20(c);
  for (int r = 0; r < 4; ++r) c.Collect(c.Do(StackDumpEvent{c.m.generation(), r, kAllreduceStack}));
  auto round1 = Find<RunPairTestAction>(c.StopAll());
  ASSERT_EQ(round1.size(), 1u);
  ASSERT_TRUE(c.m.NextDeadline().has_value());
  // Only the first pair answers.
  auto [x, y] = round1[0].pairs[0];
  c.Collect(c.Do(PairTestResult{round1[0].test, 1, x, y, true, 0.1, ""}));
  c.now += 2.5;
  auto t = c.Collect(c.Do(Tick{}));
  // Round 2 re-pairs the silent pair's nodes with the good ones.
  auto round2 = Find<RunPairTestAction>(t);
  ASSERT_EQ(round2.size(), 1u);
  EXPECT_EQ(round2[0].round, 2);
}

TEST(JobMachineHangs, ACommunicationErrorIsAmbiguousAndTestedPairwise) {
  Cluster c(Options(3, 1), 3);
  c.Ready(0);
  for (int s = 1; s <= 5; ++s) {
    c.now += 0.1;
    c.Step(s, [](int) { return 0.05; });
  }
  WorkerExitEvent exit{c.m.generation(), 0, NodeId{0}, 1, std::nullopt};
  exit.log_cause = "gloo_error";
  exit.log_action = LogAction::kRestart;
  c.Collect(c.Do(exit));
  auto tests = Find<RunPairTestAction>(c.StopAll());
  ASSERT_EQ(tests.size(), 1u);
  // An odd node out is paired with the first.
  EXPECT_EQ(tests[0].pairs.size(), 2u);
}

// Rank 3's link fails (node 3); rank 1's gloo error, a victim's, comes
// first and opens the incident; rank 3's own report comes while the
// generation stops. The pairwise test names node 3, so the cause is rank 3's.
// (Had node 3's report come first, nothing would change.)
TEST(JobMachineHangs, ThePairwiseVerdictMakesTheCulpritsOwnReportTheCause) {
  for (const bool culprit_first : {false, true}) {
    SCOPED_TRACE(culprit_first ? "culprit first" : "victim first");
    Cluster c(Options(4, 1), 5);  // node4: the replacement
    c.Ready(0);
    for (int s = 1; s <= 5; ++s) {
      c.now += 0.1;
      c.Step(s, [](int) { return 0.05; });
    }
    WorkerExitEvent victim{c.m.generation(), 1, NodeId{1}, 1, std::nullopt};
    victim.log_cause = "gloo_error";
    victim.log_action = LogAction::kRestart;
    victim.log_line = "RuntimeError: Connection closed by peer";
    WorkerExitEvent culprit{c.m.generation(), 3, NodeId{3}, 1, std::nullopt};
    culprit.log_cause = "comm_error";
    culprit.log_action = LogAction::kRestart;
    culprit.log_line = "endure fault: collective failed: Connection reset by peer (comm-fail)";
    c.Collect(c.Do(culprit_first ? culprit : victim));
    c.Collect(c.Do(culprit_first ? victim : culprit));
    auto round = Find<RunPairTestAction>(c.StopAll());
    std::vector<JobAction> after;
    while (!round.empty()) {
      after.clear();
      for (auto [x, y] : round[0].pairs) {
        const bool bad = x == NodeId{3} || y == NodeId{3};
        auto r = c.Collect(c.Do(PairTestResult{round[0].test, round[0].round, x, y, !bad,
                                               bad ? 0.01 : 0.1, bad ? "reset" : ""}));
        after.insert(after.end(), r.begin(), r.end());
      }
      round = Find<RunPairTestAction>(after);
    }
    ASSERT_EQ(c.m.incidents().size(), 1u);
    const Incident& inc = c.m.incidents()[0];
    EXPECT_EQ(inc.suspects, std::vector<std::string>{"node3"});
    EXPECT_EQ(inc.cause.name, "comm_error");
    EXPECT_EQ(inc.rank, Rank{3});
    EXPECT_EQ(inc.node, NodeId{3});
    EXPECT_EQ(inc.log_line, culprit.log_line);
    EXPECT_EQ(inc.reason.find("was a victim's") != std::string::npos, !culprit_first) << inc.reason;
  }
}

// ---- Phases ----

TEST(JobMachinePhases, AnEvaluationTenTimesAStepRaisesNothingAndAHangInsideOneDoes) {
  JobMachineOptions o = Options(2, 1);
  o.hang.phase_first_timeout = std::chrono::seconds(30);
  Cluster c(o, 2);
  c.Ready(0);
  int64_t step = 0;
  auto train = [&](int n) {
    for (int i = 0; i < n; ++i) {
      c.now += 0.1;
      c.Step(++step, [](int) { return 0.05; });
      c.Collect(c.Do(Tick{}));
    }
  };
  auto eval = [&](double seconds, bool rank1_hangs) {
    for (int r = 0; r < 2; ++r) c.Collect(c.Do(PhaseChanged{c.m.generation(), r, "eval"}));
    for (double t = 0; t < seconds; t += 0.1) {
      c.now += 0.1;
      c.Beat();
      c.Collect(c.Do(Tick{}));
    }
    for (int r = 0; r < (rank1_hangs ? 1 : 2); ++r) {
      c.Collect(c.Do(PhaseChanged{c.m.generation(), r, "train"}));
    }
  };
  train(20);
  for (int i = 0; i < 3; ++i) {
    eval(1.0, false);  // ten steps long; the step timeout is the 2s floor
    train(10);
  }
  EXPECT_TRUE(c.m.incidents().empty());
  // Learned from three 1s evaluations: 3 s; the fourth hangs on rank 1.
  eval(1.0, true);
  for (int i = 0; i < 40 && c.m.incidents().empty(); ++i) {
    c.now += 0.1;
    c.Beat();
    c.Collect(c.Do(Tick{}));
  }
  ASSERT_EQ(c.m.incidents().size(), 1u);
  EXPECT_EQ(c.m.incidents()[0].cause.name, "hang");
  EXPECT_NE(c.m.incidents()[0].reason.find("in phase 'eval'"), std::string::npos)
      << c.m.incidents()[0].reason;
}

// ---- Refused and quarantined nodes ----

TEST(JobMachineNodes, ARefusedNodeNeverRunsTheJobAndAQuarantinedOneLeavesAtTheNextStart) {
  JobMachine m(Options(2, 1), {}, T(0));
  m.Step(NodeUp{NodeId{0}, "node0", 1, ""}, T(0));
  m.Step(NodeUp{NodeId{1}, "node1", 1, "its health check failed: matmul FAILED"}, T(0));
  EXPECT_TRUE(Find<StartGenerationAction>(m.Step(Tick{}, T(1))).empty());
  auto start = Find<StartGenerationAction>(m.Step(NodeUp{NodeId{2}, "node2", 1, ""}, T(1)));
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0].nodes, (std::vector<NodeId>{NodeId{0}, NodeId{2}}));
  // Quarantined while it runs: it runs on, and is passed over after the next stop.
  m.Step(NodeUp{NodeId{3}, "node3", 1, ""}, T(1));
  m.Step(NodeQuarantined{NodeId{2}, "3 soft strikes within 24h"}, T(2));
  EXPECT_EQ(m.phase(), JobPhase::kRunning);
  for (int r = 0; r < 2; ++r) m.Step(WorkerReady{m.generation(), r, 0, 0}, T(2));
  m.Step(WorkerExitEvent{m.generation(), 0, NodeId{0}, std::nullopt, 11}, T(3));
  m.Step(GenerationStoppedEvent{m.generation(), NodeId{0}}, T(3));
  auto next =
      Find<StartGenerationAction>(m.Step(GenerationStoppedEvent{m.generation(), NodeId{2}}, T(3)));
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].nodes, (std::vector<NodeId>{NodeId{0}, NodeId{3}}));
}

// ---- The codec ----

TEST(JobCodecIsolation, TheNewEventsRoundTripAndOlderLinesWithoutTheNewFieldsStillRead) {
  StepEnd step{Generation{1}, Rank{2}, StepNumber{3}, 2.5, 0, StepNumber{-1}, false};
  step.compute_s = 0.125;
  step.total_steps = 1000;
  for (const JobEvent& e : std::vector<JobEvent>{
           step, PhaseChanged{Generation{1}, Rank{0}, "eval"},
           FingerprintReported{Generation{1}, Rank{3}, StepNumber{40}, "0123456789abcdef"},
           PairTestResult{2, 1, NodeId{0}, NodeId{1}, false, 0.5, "Connection reset by peer"},
           NodeQuarantined{NodeId{4}, "hard strike: sdc"},
           NodeUp{NodeId{1}, "node1", 8, "its health check failed"}}) {
    const std::string line = EncodeEvent(e);
    Result<JobEvent> back = DecodeEvent(line);
    ASSERT_TRUE(back.ok()) << line << ": " << back.status().message();
    EXPECT_EQ(EncodeEvent(*back), line);
  }
  // As a journal before issue 12 wrote them.
  Result<JobEvent> old = DecodeEvent(
      "step_end generation=0 rank=1 step=12 loss=2.5 ckpt_stall_s=0 checkpoint_step=-1 "
      "skipped=false");
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(std::get<StepEnd>(*old).compute_s, 0);
  Result<JobEvent> up = DecodeEvent("node_up node=0 name=\"node0\" slots=1");
  ASSERT_TRUE(up.ok()) << up.status().message();
  EXPECT_TRUE(std::get<NodeUp>(*up).refused.empty());
  // Other fields are still required.
  EXPECT_FALSE(DecodeEvent("node_up node=0 slots=1").ok());
}

}  // namespace
}  // namespace endure::core
