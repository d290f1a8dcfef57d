#include "core/job_machine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace endure::core {
namespace {

using namespace std::chrono_literals;
using faults::FaultKind;

TimePoint T(double s) { return At(FromSeconds(s)); }

JobMachineOptions Options() {
  JobMachineOptions o;
  o.nodes = 2;
  o.ranks_per_node = 1;
  o.recovery.backoff_initial = Duration(0);
  o.recovery.paths["node_lost"] = RecoveryPath::kEvictAndReplace;
  return o;
}

template <typename A>
std::vector<A> Find(const std::vector<JobAction>& actions) {
  std::vector<A> out;
  for (const JobAction& a : actions) {
    if (const A* x = std::get_if<A>(&a)) out.push_back(*x);
  }
  return out;
}

// Drives a machine through scripted time, two nodes of one rank each.
class Job {
 public:
  explicit Job(JobMachineOptions o = Options(), std::vector<ExternalFault> faults = {})
      : m(std::move(o), std::move(faults), T(0)) {}

  std::vector<JobAction> Do(const JobEvent& e) { return m.Step(e, T(now)); }

  // Both nodes register; returns the first StartGeneration.
  StartGenerationAction Up() {
    Do(NodeUp{NodeId{0}, "node0", 1});
    auto a = Find<StartGenerationAction>(Do(NodeUp{NodeId{1}, "node1", 1}));
    EXPECT_EQ(a.size(), 1u);
    return a.at(0);
  }
  void Ready(int64_t start_step, double restore_s = 0) {
    for (int r = 0; r < 2; ++r) Do(WorkerReady{m.generation(), r, start_step, restore_s});
  }
  // Both ranks finish `step`; checkpoint every `every` steps.
  std::vector<JobAction> StepBoth(int64_t step, double loss = 2.0, int every = 10) {
    std::vector<JobAction> all;
    // Agents beat every second; here, with every step.
    Do(NodeHeartbeat{NodeId{0}});
    Do(NodeHeartbeat{NodeId{1}});
    for (int r = 0; r < 2; ++r) {
      StepEnd e{m.generation(), r, step, loss, 0, (r == 0 && step % every == 0) ? step : -1};
      auto a = Do(e);
      all.insert(all.end(), a.begin(), a.end());
    }
    return all;
  }
  void Run(int64_t from, int64_t to, double step_s = 0.15) {
    for (int64_t s = from; s <= to; ++s) {
      now += step_s;
      StepBoth(s);
    }
  }
  std::vector<JobAction> StopBoth() {
    Do(GenerationStoppedEvent{m.generation(), NodeId{0}});
    return Do(GenerationStoppedEvent{m.generation(), NodeId{1}});
  }

  JobMachine m;
  double now = 0;
};

TEST(JobMachine, CleanRunWithJitterHasNoIncidentAndFinishes) {
  Job job;
  StartGenerationAction start = job.Up();
  EXPECT_EQ(start.generation.value, 0);
  EXPECT_EQ(start.restore_step.value, -1);
  job.now = 2;
  job.Ready(0);
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> jitter(std::log(0.15), 0.2);
  for (int64_t s = 1; s <= 500; ++s) {
    job.now += jitter(rng) * (s % 97 == 0 ? 2 : 1);
    job.StepBoth(s, 3.0 - s * 0.002);
    auto a = job.Do(Tick{});
    ASSERT_TRUE(Find<StopGenerationAction>(a).empty()) << "false positive at step " << s;
  }
  job.Do(WorkerExitEvent{0, 0, NodeId{0}, 0, std::nullopt});
  auto fin = Find<FinishAction>(job.Do(WorkerExitEvent{0, 1, NodeId{1}, 0, std::nullopt}));
  ASSERT_EQ(fin.size(), 1u);
  EXPECT_EQ(fin[0].exit_code, 0);
  EXPECT_TRUE(job.m.incidents().empty());
  const EttrLedger& l = job.m.ledger();
  // Start-up lasts until both ranks finished step 1; the rest is productive.
  EXPECT_GT(l.total(LedgerCategory::kStartup), 2s);
  EXPECT_LT(l.total(LedgerCategory::kStartup), 3s);
  EXPECT_EQ(l.total(LedgerCategory::kStartup) + l.total(LedgerCategory::kProductive), l.wall());
  EXPECT_GT(l.Ettr(), 0.95);
}

// A rank's last step (the step its total_steps names) is followed by what the
// program does before it exits: a final evaluation, a sample, the teardown of
// its process group. On a loaded machine that took longer than the step
// timeout and was called a hang. It is the phase "finish", judged by the
// phase timeout (10 minutes the first time): a rank that never exits is
// still a hang, after that.
TEST(JobMachine, TheTimeAfterTheLastStepIsNoHangUntilThePhaseTimeout) {
  Job job;
  job.Up();
  job.Ready(0);
  for (int64_t s = 1; s <= 30; ++s) {
    job.now += 0.15;
    job.Do(NodeHeartbeat{NodeId{0}});
    job.Do(NodeHeartbeat{NodeId{1}});
    for (int r = 0; r < 2; ++r) {
      StepEnd e{job.m.generation(), r, s, 2.0, 0, -1};
      e.total_steps = 30;
      job.Do(e);
    }
  }
  const double last = job.now;
  // Rank 0 goes on into its final evaluation at once (leaving "finish"
  // after a few milliseconds, which is no sample to learn its timeout from)
  // and exits; rank 1 takes 5 minutes (beats continue).
  job.now += 0.01;
  job.Do(PhaseChanged{job.m.generation(), Rank{0}, "eval"});
  job.now += 0.5;
  job.Do(WorkerExitEvent{0, 0, NodeId{0}, 0, std::nullopt});
  while (job.now < last + 300) {
    job.now += 0.5;
    job.Do(NodeHeartbeat{NodeId{0}});
    job.Do(NodeHeartbeat{NodeId{1}});
    ASSERT_TRUE(Find<StopGenerationAction>(job.Do(Tick{})).empty()) << "at " << job.now - last;
  }
  EXPECT_TRUE(job.m.incidents().empty());
  // Never exiting at all is a hang once the phase's first timeout passed.
  double stopped_at = -1;
  while (job.now < last + 700 && stopped_at < 0) {
    job.now += 0.5;
    job.Do(NodeHeartbeat{NodeId{0}});
    job.Do(NodeHeartbeat{NodeId{1}});
    if (!Find<StopGenerationAction>(job.Do(Tick{})).empty()) stopped_at = job.now;
  }
  EXPECT_NEAR(stopped_at - last, 600.0, 1.0);
  ASSERT_EQ(job.m.incidents().size(), 1u);
  EXPECT_EQ(job.m.incidents()[0].cause.name, "hang");
  EXPECT_NE(job.m.incidents()[0].reason.find("in phase 'finish'"), std::string::npos)
      << job.m.incidents()[0].reason;
}

// Rank 0 is killed; rank 1's allreduce fails, and on a loaded machine its
// gloo error is reported first. Rank 0's death, reported while the
// generation stops, is the cause: the collective failure was its
// consequence. Exits the agents caused by stopping (`stopped`) are no
// evidence, and a death that is itself a collective failure changes nothing.
TEST(JobMachine, ADeathReportedAfterAVictimsCollectiveFailureIsTheCause) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0   ? "killed"
                 : variant == 1 ? "stopped by the agent"
                                : "collective too");
    Job job;
    job.Up();
    job.Ready(0);
    job.Run(1, 20);
    WorkerExitEvent victim{job.m.generation(), Rank{1}, NodeId{1}, 1, std::nullopt};
    victim.log_cause = "gloo_error";
    victim.log_action = LogAction::kRestart;
    victim.log_line =
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
        "Connection closed by peer";
    job.now += 0.01;
    ASSERT_EQ(Find<StopGenerationAction>(job.Do(victim)).size(), 1u);
    WorkerExitEvent culprit{job.m.generation(), Rank{0}, NodeId{0}, std::nullopt, 9};
    if (variant == 1) culprit.stopped = true;
    if (variant == 2) {
      culprit.signal.reset();
      culprit.exit_code = 1;
      culprit.log_cause = "gloo_error";
    }
    job.now += 0.05;
    job.Do(culprit);
    job.StopBoth();
    ASSERT_EQ(job.m.incidents().size(), 1u);
    const Incident& inc = job.m.incidents()[0];
    if (variant == 0) {
      EXPECT_EQ(inc.cause.name, "signal 9 SIGKILL");
      EXPECT_EQ(inc.rank, Rank{0});
      EXPECT_EQ(inc.node, NodeId{0});
      EXPECT_NE(inc.reason.find("reported while the generation stopped: the gloo_error of rank 1 "
                                "was its consequence"),
                std::string::npos)
          << inc.reason;
    } else {
      EXPECT_EQ(inc.cause.name, "gloo_error");
      EXPECT_EQ(inc.rank, Rank{1});
    }
  }
}

// Node 1 dies with its agent: rank 0's allreduce fails at once, while node
// 1's stream is held for its grace (no goodbye), so its loss is known only
// while the generation stops. The loss is the cause, and is handled as one:
// a strike, and no restart before a replacement. A loss after a failure that
// is no collective one (variant 1) changes nothing.
TEST(JobMachine, ANodeLostAfterAPeersCollectiveFailureIsTheCause) {
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "collective failure first" : "a failure of its own first");
    Job job;
    job.Up();
    job.Ready(0);
    job.Run(1, 20);
    WorkerExitEvent first{job.m.generation(), Rank{0}, NodeId{0}, 1, std::nullopt};
    first.log_cause = variant == 0 ? "gloo_error" : "user_exception";
    first.log_action = LogAction::kRestart;
    job.now += 0.01;
    ASSERT_EQ(Find<StopGenerationAction>(job.Do(first)).size(), 1u);
    job.Do(GenerationStoppedEvent{job.m.generation(), NodeId{0}});
    job.now += 2;
    std::vector<JobAction> lost = job.Do(NodeDown{NodeId{1}, "stream closed"});
    // Stopped: the next generation waits for a node to replace node 1.
    EXPECT_TRUE(Find<StartGenerationAction>(lost).empty());
    ASSERT_EQ(job.m.incidents().size(), 1u);
    const Incident& inc = job.m.incidents()[0];
    if (variant == 0) {
      EXPECT_EQ(inc.cause.name, "node_lost");
      EXPECT_EQ(inc.rank, Rank{1});
      EXPECT_EQ(inc.node, NodeId{1});
      EXPECT_EQ(inc.node_name, "node1");
      EXPECT_EQ(inc.action, "evict_and_wait_for_repair");
      ASSERT_EQ(Find<StrikeNodeAction>(lost).size(), 1u);
      EXPECT_EQ(Find<StrikeNodeAction>(lost)[0].node, NodeId{1});
      EXPECT_NE(inc.reason.find("then node1 was lost (stream closed), reported while the "
                                "generation stopped: the gloo_error of rank 0 was its consequence"),
                std::string::npos)
          << inc.reason;
    } else {
      EXPECT_EQ(inc.cause.name, "user_exception");
      EXPECT_EQ(inc.node, NodeId{0});
      EXPECT_TRUE(Find<StrikeNodeAction>(lost).empty());
    }
  }
}

// A node that dies (an injected kill-agent) kills its workers just before
// its agent goes, and the agent's report of a worker it killed itself
// (`stopped`) can reach the controller first. That exit is no failure of the
// rank's own: the job goes on until the node's loss is known, and the loss
// is the one incident. (The loaded CI saw two incidents: an in-process
// restart for "signal 9, which the agent did not send", then the loss.)
TEST(JobMachine, AnExitTheAgentCausedOutsideAStopIsNoFailure) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 20);
  WorkerExitEvent killed{job.m.generation(), Rank{1}, NodeId{1}, std::nullopt, 9};
  killed.stopped = true;
  job.now += 0.01;
  EXPECT_TRUE(job.Do(killed).empty());
  EXPECT_TRUE(job.m.incidents().empty());
  job.now += 0.05;
  std::vector<JobAction> lost = job.Do(NodeDown{NodeId{1}, "the agent's stream closed"});
  ASSERT_EQ(Find<StopGenerationAction>(lost).size(), 1u);
  ASSERT_EQ(job.m.incidents().size(), 1u);
  EXPECT_EQ(job.m.incidents()[0].cause.name, "node_lost");
  EXPECT_EQ(job.m.incidents()[0].node, NodeId{1});
}

// A node whose stream broke is declared lost only after the grace for its
// agent to come back (the shell's): the fault was the break, and the time
// since then was detection, not training.
TEST(JobMachine, ALostNodesFaultIsWhenItsStreamBroke) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 20);
  const double broke = job.now + 0.05;
  job.now = broke + 2.0;
  auto a = job.Do(NodeDown{NodeId{1}, "the agent's stream closed", T(broke)});
  ASSERT_EQ(Find<StopGenerationAction>(a).size(), 1u);
  ASSERT_EQ(job.m.incidents().size(), 1u);
  const Incident& inc = job.m.incidents()[0];
  EXPECT_EQ(inc.cause.name, "node_lost");
  EXPECT_NEAR(Seconds(inc.detected_at - inc.fault_at), 2.0, 1e-9);
  EXPECT_NEAR(Seconds(job.m.ledger().total(LedgerCategory::kDetection)), 2.0, 1e-9);
}

// A collective failure reported long after the training stopped (a peer
// died silently; the survivors' collective timed out 5 s later): no step
// completed after the last one's end plus a step, so that time was the
// fault's, not training. Found by the cluster simulation (endure_simtest):
// it was booked productive.
TEST(JobMachine, AStallBeforeACollectiveFailureIsNotProductive) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 20);  // steps of 0.15 s; step 20 ends at job.now
  const double last = job.now;
  const Duration productive = job.m.ledger().total(LedgerCategory::kProductive);
  job.now = last + 5.0;
  auto a = job.Do(WorkerExitEvent{0, 0, NodeId{0}, 1, std::nullopt});
  ASSERT_EQ(Find<StopGenerationAction>(a).size(), 1u);
  // Of the 5 s, the step in flight (0.15 s) counts as it did; the rest is
  // detection.
  EXPECT_NEAR(Seconds(job.m.ledger().total(LedgerCategory::kDetection)), 4.85, 1e-6);
  EXPECT_NEAR(Seconds(job.m.ledger().total(LedgerCategory::kProductive) +
                      job.m.ledger().total(LedgerCategory::kRecompute) - productive),
              0.15, 1e-6);
}

// The same before the job has measured a step time: the generation's first
// step (from every rank ready to its end) stands in. A rank hung after step
// 1, unnoticed under the start-up timeout, until a node's stream broke 30 s
// later (endure_simtest --nodes 8 --ranks 4 --faults 20 --steps 300, seed
// 536, booked those 30 s as productive).
TEST(JobMachine, AStallAfterTheFirstStepIsNotProductive) {
  Job job;
  job.Up();
  job.now = 1;
  job.Ready(0);
  job.now = 1.2;
  job.StepBoth(1);
  job.now = 31.2;
  auto a = job.Do(NodeDown{NodeId{1}, "the agent's stream closed", T(29.2)});
  ASSERT_EQ(Find<StopGenerationAction>(a).size(), 1u);
  // Step 1 took 0.2 s: from 1.4 on, nothing trained.
  EXPECT_NEAR(Seconds(job.m.ledger().total(LedgerCategory::kDetection)), 29.8, 1e-6);
}

// An in-process restart keeps the steps since the last checkpoint only if
// the ranks come back at the step they had. When they come back at an older
// step (they restored the checkpoint instead), those steps are recompute:
// the ledger once credited them when the route was decided, and counted
// them twice. Found by the cluster simulation (endure_simtest).
TEST(JobMachine, AnInProcessRestartThatRestoredACheckpointRecomputesTheStepsSinceIt) {
  for (const bool kept : {true, false}) {
    SCOPED_TRACE(kept ? "ready at the step it had" : "ready at the checkpoint");
    Job job;
    job.Up();
    job.now = 1;
    for (int r = 0; r < 2; ++r) job.Do(WorkerReady{0, r, 0, 0, /*rejoin=*/true});
    job.Run(1, 25);  // a checkpoint at 10 and 20
    job.now += 0.05;
    auto a = job.Do(WorkerExitEvent{0, 1, NodeId{1}, std::nullopt, 9});
    auto start = Find<StartGenerationAction>(a);
    ASSERT_EQ(start.size(), 1u);
    ASSERT_TRUE(start[0].rejoin);
    const Duration recompute = job.m.ledger().total(LedgerCategory::kRecompute);
    job.now += 0.3;
    const int64_t at = kept ? 25 : 20;
    for (int r = 0; r < 2; ++r) job.Do(WorkerReady{1, r, at, 0.05, true});
    const Duration lost = job.m.ledger().total(LedgerCategory::kRecompute) - recompute;
    if (kept) {
      EXPECT_EQ(lost, Duration(0));
    } else {
      // Steps 21 to 25 (0.75 s), trained after the checkpoint of step 20,
      // and the step in flight when the rank died (0.05 s).
      EXPECT_NEAR(Seconds(lost), 0.80, 1e-6);
    }
  }
}

// Ranks that hold each a part of the state (sharded) and restore it from the
// tiers after a rejoin: the in-process restart says so, and its generation
// is marked for a restore plan; ranks that do not say it get none.
TEST(JobMachine, AnInProcessRestartOfShardedRanksRestoresFromTheTiers) {
  for (const bool sharded : {true, false}) {
    SCOPED_TRACE(sharded ? "sharded" : "data parallel");
    Job job;
    job.Up();
    job.now = 1;
    for (int r = 0; r < 2; ++r) {
      WorkerReady ready{0, r, 0, 0, /*rejoin=*/true};
      ready.rejoin_from_tiers = sharded;
      job.Do(ready);
    }
    job.Run(1, 5);
    job.now += 0.05;
    auto a = job.Do(WorkerExitEvent{0, 1, NodeId{1}, std::nullopt, 9});
    auto start = Find<StartGenerationAction>(a);
    ASSERT_EQ(start.size(), 1u);
    EXPECT_TRUE(start[0].rejoin);
    EXPECT_EQ(start[0].rejoin_from_tiers, sharded);
    const std::string why = job.m.incidents().back().route_reason;
    EXPECT_EQ(
        why.find("restores its part of the (sharded) state from the tiers") != std::string::npos,
        sharded)
        << why;
  }
}

// A rule whose action is stop_if_repeated (a full disk): the first failure
// restarts, and says that this restart confirms it; the same cause in that
// restart stops the job with a verdict. Another cause in between, or a
// productive generation between two, starts afresh (variant 1).
TEST(JobMachine, AFailureCertainToRecurStopsAfterOneConfirmingRestart) {
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "the same again" : "another cause between");
    Job job;
    job.Up();
    job.Ready(0);
    job.Run(1, 12);
    auto disk_full = [&](Rank rank) {
      WorkerExitEvent e{job.m.generation(), rank, NodeId{rank.value}, 1, std::nullopt};
      e.log_cause = "disk_full";
      e.log_action = LogAction::kStopIfRepeated;
      e.log_rule = "disk_full";
      e.log_line = "endure-train: cannot write /ckpt/export.bin: No space left on device";
      return e;
    };
    job.now += 0.01;
    ASSERT_EQ(Find<StopGenerationAction>(job.Do(disk_full(Rank{1}))).size(), 1u);
    ASSERT_EQ(Find<StartGenerationAction>(job.StopBoth()).size(), 1u);
    ASSERT_EQ(job.m.incidents().size(), 1u);
    EXPECT_EQ(job.m.incidents()[0].action, "restart_in_place");
    EXPECT_NE(job.m.incidents()[0].reason.find("disk_full recurs unless what caused it changes: "
                                               "this restart confirms it"),
              std::string::npos)
        << job.m.incidents()[0].reason;
    job.now += 0.5;
    job.Ready(10);
    job.Run(11, 12);
    if (variant == 1) {
      WorkerExitEvent other{job.m.generation(), Rank{0}, NodeId{0}, std::nullopt, 9};
      job.now += 0.01;
      job.Do(other);
      ASSERT_EQ(Find<StartGenerationAction>(job.StopBoth()).size(), 1u);
      job.now += 0.5;
      job.Ready(10);
      job.Run(11, 12);
    }
    job.now += 0.01;
    std::vector<JobAction> a = job.Do(disk_full(Rank{1}));
    std::vector<JobAction> stopped = job.StopBoth();
    a.insert(a.end(), stopped.begin(), stopped.end());
    if (variant == 0) {
      const Incident& inc = job.m.incidents().back();
      EXPECT_EQ(inc.action, "stop");
      EXPECT_NE(inc.reason.find("disk_full again, in the restart that was to confirm it "
                                "(incident 1): a restart cannot fix it"),
                std::string::npos)
          << inc.reason;
      EXPECT_NE(inc.reason.find("No space left on device"), std::string::npos) << inc.reason;
      std::vector<FinishAction> finish = Find<FinishAction>(a);
      ASSERT_EQ(finish.size(), 1u);
      EXPECT_EQ(finish[0].exit_code, 3);
    } else {
      EXPECT_EQ(job.m.incidents().back().action, "restart_in_place");
      EXPECT_TRUE(Find<FinishAction>(a).empty());
    }
  }
}

TEST(JobMachine, KilledRankIsDetectedAtOnceAndRestartedFromTheLastCheckpoint) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 39);
  const double fault_at = job.now + 0.05;
  job.Do(FaultFiredEvent{0, 1, "f1", FaultKind::kKill, 40, T(fault_at)});
  job.now = fault_at + 0.01;
  auto a = job.Do(WorkerExitEvent{0, 1, NodeId{1}, std::nullopt, 9});
  ASSERT_EQ(Find<StopGenerationAction>(a).size(), 1u);
  EXPECT_FALSE(Find<StopGenerationAction>(a)[0].dump_stacks);
  // The peer failing in turn is a consequence, not a new incident.
  job.Do(WorkerExitEvent{0, 0, NodeId{0}, 1, std::nullopt});
  job.now += 0.2;
  auto restart = Find<StartGenerationAction>(job.StopBoth());
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(restart[0].generation.value, 1);
  // The newest checkpoint that verifies (the tiers hold step 30); nothing is
  // abandoned by a crash.
  EXPECT_EQ(restart[0].restore_step.value, -1);
  EXPECT_EQ(restart[0].abandoned_from.value, -1);
  EXPECT_TRUE(restart[0].fired_faults.count("f1"));
  job.now += 0.5;
  job.Ready(30, 0.05);
  job.Run(31, 45);
  ASSERT_EQ(job.m.incidents().size(), 1u);
  const Incident& inc = job.m.incidents()[0];
  EXPECT_EQ(inc.cause.name, "signal 9 SIGKILL");
  EXPECT_EQ(inc.rank.value, 1);
  EXPECT_EQ(inc.node_name, "node1");
  EXPECT_NEAR(Seconds(inc.detected_at - inc.fault_at), 0.01, 1e-9);
  EXPECT_EQ(inc.steps_lost(), 9);
  ASSERT_TRUE(inc.recovered_at.has_value());
  EXPECT_EQ(inc.restored_step.value, 30);
  EXPECT_EQ(inc.action, "restart_in_place");
  const EttrLedger& l = job.m.ledger();
  EXPECT_GT(l.total(LedgerCategory::kRecompute), Duration(0));
  EXPECT_GT(l.total(LedgerCategory::kRecovery), Duration(0));
}

// A job resumed from step 20, which an earlier run in the same state
// directory committed, hits a NaN at step 25 before its own first checkpoint.
// It used to roll back to "the initial parameters" (restore_step 0), and the
// shell then deleted every durable step: the machine knew only the
// checkpoints this run reported.
TEST(JobMachine, ARollbackBeforeTheRunsFirstCheckpointAsksForTheEarlierRunsOne) {
  Job job;
  job.Do(DurableListed{{{StepNumber{10}, 2}, {StepNumber{15}, 2}, {StepNumber{20}, 2}}, {}});
  job.Up();
  job.Ready(20);
  job.Run(21, 24);
  job.now += 0.15;
  job.StepBoth(25, std::nan(""));
  auto restart = Find<StartGenerationAction>(job.StopBoth());
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(restart[0].restore_step.value, 24);
  EXPECT_EQ(restart[0].abandoned_from.value, 25);
  ASSERT_EQ(job.m.incidents().size(), 1u);
  EXPECT_EQ(job.m.incidents()[0].action, "roll_back");
  EXPECT_NE(
      job.m.incidents()[0].reason.find("the checkpoint of step 20, the newest before step 25"),
      std::string::npos)
      << job.m.incidents()[0].reason;
  // A crash afterwards abandons nothing and asks for the newest.
  job.Ready(20);
  job.Run(21, 22);
  job.now += 0.05;
  job.Do(WorkerExitEvent{job.m.generation(), 0, NodeId{0}, std::nullopt, 9});
  restart = Find<StartGenerationAction>(job.StopBoth());
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(restart[0].restore_step.value, -1);
  EXPECT_EQ(restart[0].abandoned_from.value, -1);
  // The earlier run's steps are not this run's checkpoints in the report.
  EXPECT_EQ(job.m.checkpoints().totals().copies_taken, 0);
  EXPECT_EQ(job.m.checkpoints().totals().durable_commits, 0);
}

// Rank 0's report of step 10, the one that says its copy was taken,
// arrives 5 s after rank 1's (its link was partitioned); the ranks go on to
// step 12, rank 1 crashes, and the restart restores step 10. The copy is
// safe as of step 10, not as of its report: the 6 s of steps 11 and 12 are
// recomputed (not 1 s, as when the late report counted as the copy's time),
// and what stays productive is steps 2 to 10 (the first is start-up).
TEST(JobMachine, ACopyReportedLateIsSafeAsOfItsStepNotItsReport) {
  JobMachineOptions o = Options();
  o.in_process = false;
  Job job(o);
  job.Up();
  job.Ready(0);
  for (int64_t s = 1; s <= 9; ++s) {
    job.now += 1;
    job.StepBoth(s);
  }
  job.now += 1;  // 10 s: rank 1 ends step 10
  job.Do(NodeHeartbeat{NodeId{0}});
  job.Do(NodeHeartbeat{NodeId{1}});
  job.Do(StepEnd{job.m.generation(), 1, 10, 2.0, 0, -1});
  job.now += 5;  // 15 s: rank 0's, held by the partition
  job.Do(StepEnd{job.m.generation(), 0, 10, 2.0, 0, 10});
  for (int64_t s = 11; s <= 12; ++s) {
    job.now += 0.5;
    job.StepBoth(s);
  }
  job.Do(WorkerExitEvent{job.m.generation(), 1, NodeId{1}, std::nullopt, 9});
  job.now += 0.1;
  ASSERT_EQ(Find<StartGenerationAction>(job.StopBoth()).size(), 1u);
  job.now += 1;
  job.Ready(10);
  const EttrLedger& l = job.m.ledger();
  EXPECT_EQ(l.total(LedgerCategory::kRecompute), 6s);
  EXPECT_EQ(l.total(LedgerCategory::kProductive), 9s);
}

// An unmodified program (its steps read from its output; it reports no
// copy and does not say what it restored) saves its own snapshot every 10
// steps. Killed after step 25, it resumes from its snapshot of step 20 and
// prints step 21 first: the restore point is 20, only steps 21 to 25 are
// recompute (5 s), and the 19 s of steps 2 to 20 stay productive. Before,
// every step since the start was booked as recompute and the restore point
// as step 0.
void ReadyUnannounced(Job& job) {
  for (int r = 0; r < 2; ++r) {
    WorkerReady ready{job.m.generation(), r, 0, 0};
    ready.start_step_unknown = true;
    job.Do(ready);
  }
}
void StepsFromOutput(Job& job, int64_t from, int64_t to, int64_t every = 1) {
  for (int64_t s = from; s <= to; s += every) {
    job.now += static_cast<double>(every);
    job.Do(NodeHeartbeat{NodeId{0}});
    job.Do(NodeHeartbeat{NodeId{1}});
    for (int r = 0; r < 2; ++r) job.Do(StepEnd{job.m.generation(), r, s, 2.0, 0, -1});
  }
}
// `rank` is killed; the restart's workers are ready, the restore point open.
void KillAndRestart(Job& job, int rank) {
  job.Do(WorkerExitEvent{job.m.generation(), rank, NodeId{rank}, std::nullopt, 9});
  job.now += 0.1;
  ASSERT_EQ(Find<StartGenerationAction>(job.StopBoth()).size(), 1u);
  job.now += 1;
  ReadyUnannounced(job);
}
// Such a program's job (restarts only: it does not rejoin) after `steps`
// steps printed every `every`, rank 1 killed and restarted.
Job KilledAfter(int64_t steps, int64_t every = 1) {
  JobMachineOptions o = Options();
  o.in_process = false;
  Job job(o);
  job.Up();
  ReadyUnannounced(job);
  StepsFromOutput(job, every, steps, every);
  KillAndRestart(job, 1);
  return job;
}

TEST(JobMachine, AProgramThatSaysNothingRestoredTheStepBeforeTheFirstItReports) {
  Job job = KilledAfter(25);
  // Nothing rolled back yet: what survived is not known.
  EXPECT_EQ(job.m.ledger().total(LedgerCategory::kRecompute), 0s);
  ASSERT_EQ(job.m.incidents().size(), 1u);
  EXPECT_EQ(job.m.incidents()[0].restored_step.value, -1);  // not known yet
  StepsFromOutput(job, 21, 30);
  const EttrLedger& l = job.m.ledger();
  EXPECT_EQ(job.m.incidents()[0].restored_step.value, 20);
  EXPECT_EQ(l.total(LedgerCategory::kRecompute), 5s);
  // Steps 2-20 of the first run and 22-30 of the second (step 21 is the
  // recovery's, up to the first step).
  EXPECT_EQ(l.total(LedgerCategory::kProductive), 19s + 9s);
}

// The same program printing every 5th step, resumed from its step 20: it
// prints 25 first, and one stride of its reports back is step 20. A
// program that keeps no snapshot starts over and prints 5: the restore
// point is 0, and everything it did is recompute.
TEST(JobMachine, AProgramThatPrintsEveryFifthStepRestoredOneStrideBeforeItsFirst) {
  for (const int64_t resumed : {20, 0}) {
    SCOPED_TRACE("resumed from " + std::to_string(resumed));
    Job job = KilledAfter(25, 5);
    StepsFromOutput(job, resumed + 5, 40, 5);
    ASSERT_EQ(job.m.incidents().size(), 1u);
    EXPECT_EQ(job.m.incidents()[0].restored_step.value, resumed);
    // 5 s a report: the first run's reports after the first were 20 s
    // productive, of which those after the restore point are recompute.
    EXPECT_EQ(job.m.ledger().total(LedgerCategory::kRecompute), resumed == 20 ? 5s : 20s);
  }
}

// A generation that fails before its first step leaves the restore point
// open, and the program's own copy is still the one the next generation
// takes: the rollback waits for it, once.
TEST(JobMachine, AFailureBeforeTheFirstStepKeepsTheRollbackPending) {
  Job job = KilledAfter(25);
  job.now += 1;
  KillAndRestart(job, 0);
  StepsFromOutput(job, 21, 30);
  ASSERT_EQ(job.m.incidents().size(), 2u);
  EXPECT_EQ(job.m.incidents()[1].restored_step.value, 20);
  EXPECT_EQ(job.m.ledger().total(LedgerCategory::kRecompute), 5s);
}

// The same when the restarted program dies before its ranks say ready (a
// crash while loading its checkpoint).
TEST(JobMachine, AFailureBeforeReadyKeepsTheRollbackPending) {
  JobMachineOptions o = Options();
  o.in_process = false;
  Job job(o);
  job.Up();
  ReadyUnannounced(job);
  StepsFromOutput(job, 1, 25);
  job.Do(WorkerExitEvent{job.m.generation(), 1, NodeId{1}, std::nullopt, 9});
  job.now += 0.1;
  ASSERT_EQ(Find<StartGenerationAction>(job.StopBoth()).size(), 1u);
  job.now += 2;
  job.Do(NodeHeartbeat{NodeId{0}});
  job.Do(NodeHeartbeat{NodeId{1}});
  KillAndRestart(job, 0);  // generation 1 never got ready
  StepsFromOutput(job, 21, 30);
  ASSERT_EQ(job.m.incidents().size(), 2u);
  EXPECT_EQ(job.m.incidents()[1].restored_step.value, 20);
  EXPECT_EQ(job.m.ledger().total(LedgerCategory::kRecompute), 5s);
}

// The machine's state survives a snapshot with the restore point open.
TEST(JobMachine, AnOpenRestorePointSurvivesASnapshot) {
  Job job = KilledAfter(25);
  Result<JobMachine> moved = JobMachine::FromSnapshot(job.m.Snapshot(), T(0));
  ASSERT_TRUE(moved.ok()) << moved.status().message();
  JobMachineOptions o = Options();
  o.in_process = false;
  Job restored(o);
  restored.m = std::move(moved).value();
  restored.now = job.now;
  StepsFromOutput(restored, 21, 30);
  EXPECT_EQ(restored.m.incidents()[0].restored_step.value, 20);
  EXPECT_EQ(restored.m.ledger().total(LedgerCategory::kRecompute), 5s);
}

TEST(JobMachine, HangIsDetectedAfterTheTimeoutWithStacks) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 20);
  const double last = job.now;
  job.Do(FaultFiredEvent{0, 0, "h", FaultKind::kHang, 21, T(last + 0.01)});
  std::optional<TimePoint> deadline = job.m.NextDeadline();
  ASSERT_TRUE(deadline.has_value());
  // The floor of 2 s dominates 3 x p99 of 0.15 s steps.
  EXPECT_NEAR(Seconds(*deadline - T(last)), 2.0, 1e-6);
  // The agents beat meanwhile (a hang is judged only while they are heard).
  while (job.now + 0.5 < Seconds(*deadline - T(0))) {
    job.now += 0.5;
    job.Do(NodeHeartbeat{NodeId{0}});
    job.Do(NodeHeartbeat{NodeId{1}});
  }
  job.now = Seconds(*deadline - T(0));
  auto a = job.Do(Tick{});
  auto stop = Find<StopGenerationAction>(a);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_TRUE(stop[0].dump_stacks);
  job.Do(StackDumpEvent{0, 0, "#0 nanosleep\n#1 endure::Session::BeginStep"});
  ASSERT_EQ(job.m.incidents().size(), 1u);
  const Incident& inc = job.m.incidents()[0];
  EXPECT_EQ(inc.cause.name, "hang");
  EXPECT_EQ(inc.rank.value, 0);
  EXPECT_LE(Seconds(inc.detected_at - inc.fault_at), 2.0 + 1.0);
  ASSERT_EQ(inc.stacks.size(), 1u);
  EXPECT_NE(inc.stacks[0].find("BeginStep"), std::string::npos);
}

TEST(JobMachine, NanRollsBackThenSkipsTheStepWhenItRecurs) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 24);
  job.now += 0.15;
  job.StepBoth(25, std::nan(""));
  auto restart = Find<StartGenerationAction>(job.StopBoth());
  ASSERT_EQ(restart.size(), 1u);
  // The newest checkpoint before step 25, whichever the tiers hold (step 20
  // here); checkpoints of step 25 and later hold the NaN update.
  EXPECT_EQ(restart[0].restore_step.value, 24);
  EXPECT_EQ(restart[0].abandoned_from.value, 25);
  EXPECT_TRUE(restart[0].skip_steps.empty());
  job.Ready(20);
  job.Run(21, 24);
  job.now += 0.15;
  job.StepBoth(25, std::nan(""));
  restart = Find<StartGenerationAction>(job.StopBoth());
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(restart[0].restore_step.value, 24);
  EXPECT_EQ(restart[0].abandoned_from.value, 25);
  EXPECT_EQ(restart[0].skip_steps, std::vector<StepNumber>{StepNumber{25}});
  // The re-run skips step 25: reported as skipped, it is not judged.
  job.Ready(20);
  job.Run(21, 24);
  for (int r = 0; r < 2; ++r) job.Do(StepEnd{job.m.generation(), r, 25, 0, 0, -1, true});
  job.Run(26, 30);
  EXPECT_EQ(job.m.step().value, 30);
  EXPECT_EQ(job.m.phase(), JobPhase::kRunning);
  ASSERT_EQ(job.m.incidents().size(), 2u);
  EXPECT_EQ(job.m.incidents()[0].cause.name, "loss_nan");
  EXPECT_EQ(job.m.incidents()[0].action, "roll_back");
  EXPECT_EQ(job.m.incidents()[1].action, "roll_back_and_skip");
}

TEST(JobMachine, LostNodeIsEvictedAndAReplacementJoins) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 12);
  auto a = job.Do(NodeDown{NodeId{1}, "stream dropped"});
  ASSERT_EQ(Find<EvictNodeAction>(a).size(), 1u);
  // Only node0 needs to confirm the stop; then the job waits for a node.
  a = job.Do(GenerationStoppedEvent{0, NodeId{0}});
  EXPECT_TRUE(Find<StartGenerationAction>(a).empty());
  EXPECT_EQ(job.m.phase(), JobPhase::kWaiting);
  job.now += 5;
  auto start = Find<StartGenerationAction>(job.Do(NodeUp{NodeId{2}, "node2", 1}));
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0].nodes, (std::vector<NodeId>{NodeId{0}, NodeId{2}}));
  EXPECT_EQ(job.m.incidents()[0].cause.name, "node_lost");
  EXPECT_GT(job.m.ledger().total(LedgerCategory::kOther), Duration(0));
}

// A lost host with no replacement used to leave the job waiting forever.
TEST(JobMachine, WithoutAReplacementWithinItsTimeoutTheJobGivesUpNamingItsNodes) {
  JobMachineOptions o = Options();
  o.replacement_timeout = std::chrono::minutes(10);
  Job job(o);
  job.Up();
  job.Ready(0);
  job.Run(1, 12);
  ASSERT_EQ(Find<EvictNodeAction>(job.Do(NodeDown{NodeId{1}, "stream dropped"})).size(), 1u);
  job.Do(GenerationStoppedEvent{0, NodeId{0}});
  ASSERT_EQ(job.m.phase(), JobPhase::kWaiting);
  const double waiting_since = job.now;
  // node0 stays healthy all along (its agent beats).
  auto tick_at = [&](double t) {
    job.now = t;
    job.Do(NodeHeartbeat{NodeId{0}});
    return job.Do(Tick{});
  };
  // The deadline is 10 minutes after the wait began, and the machine asks
  // for a tick then.
  tick_at(waiting_since + 1);
  ASSERT_TRUE(job.m.NextDeadline().has_value());
  EXPECT_LE(*job.m.NextDeadline(), T(waiting_since + 600));
  EXPECT_TRUE(Find<FinishAction>(tick_at(waiting_since + 599.5)).empty());
  std::vector<FinishAction> finish = Find<FinishAction>(tick_at(waiting_since + 600.5));
  ASSERT_EQ(finish.size(), 1u);
  EXPECT_EQ(finish[0].exit_code, 3);
  EXPECT_NE(finish[0].reason.find("no replacement node within 10m"), std::string::npos)
      << finish[0].reason;
  EXPECT_NE(finish[0].reason.find("1 of the 2 nodes"), std::string::npos) << finish[0].reason;
  EXPECT_NE(finish[0].reason.find("(node0)"), std::string::npos) << finish[0].reason;
  EXPECT_EQ(job.m.phase(), JobPhase::kDone);
}

TEST(JobMachine, AReplacementWithinTheTimeoutStartsAndZeroWaitsForever) {
  for (const Duration timeout : {Duration(std::chrono::minutes(10)), Duration(0)}) {
    JobMachineOptions o = Options();
    o.replacement_timeout = timeout;
    Job job(o);
    job.Up();
    job.Ready(0);
    job.Run(1, 12);
    job.Do(NodeDown{NodeId{1}, "stream dropped"});
    job.Do(GenerationStoppedEvent{0, NodeId{0}});
    job.now += timeout > Duration(0) ? 599 : 86400;
    job.Do(NodeHeartbeat{NodeId{0}});
    EXPECT_TRUE(Find<FinishAction>(job.Do(Tick{})).empty());
    EXPECT_EQ(Find<StartGenerationAction>(job.Do(NodeUp{NodeId{2}, "node2", 1})).size(), 1u);
    EXPECT_EQ(job.m.phase(), JobPhase::kRunning);
  }
}

// A controller carrying on a state directory numbers its generations after
// the earlier runs': its first is a first (restore from the newest
// checkpoint, no recovery time), and an exit of the previous controller's
// generation is no failure of its own.
TEST(JobMachine, AMachineStartsAtItsFirstGenerationAndIgnoresEarlierOnes) {
  JobMachineOptions o = Options();
  o.first_generation = Generation{5};
  Job job(o);
  const StartGenerationAction start = job.Up();
  EXPECT_EQ(start.generation.value, 5);
  EXPECT_EQ(start.restore_step.value, -1);
  EXPECT_EQ(job.m.generations_started(), 1);
  job.Ready(0);
  job.Run(1, 3);
  const std::vector<JobAction> a = job.Do(WorkerExitEvent{4, 1, NodeId{1}, std::nullopt, 15});
  EXPECT_TRUE(a.empty());
  EXPECT_TRUE(job.m.incidents().empty());
  EXPECT_EQ(job.m.ledger().total(LedgerCategory::kRecovery), Duration(0));
}

TEST(JobMachine, ASilentAgentIsLostAfterTheHeartbeatTimeout) {
  JobMachineOptions o = Options();
  o.hang.floor = std::chrono::seconds(60);  // only the heartbeat decides here
  o.hang.startup_timeout = std::chrono::seconds(120);
  Job job(o);
  job.Up();
  job.Ready(0);
  job.Run(1, 5);
  // node0 keeps beating; node1's last heartbeat came with step 5 (t = 0.75).
  for (double t = 1; t <= 10.5; t += 1) {
    job.now = t;
    job.Do(NodeHeartbeat{NodeId{0}});
    EXPECT_TRUE(Find<StopGenerationAction>(job.Do(Tick{})).empty()) << t;
  }
  job.now = 10.8;
  job.Do(NodeHeartbeat{NodeId{0}});
  auto a = job.Do(Tick{});
  ASSERT_EQ(Find<StopGenerationAction>(a).size(), 1u);
  auto evict = Find<EvictNodeAction>(a);
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_EQ(evict[0].node, NodeId{1});
  const Incident& inc = job.m.incidents().at(0);
  EXPECT_EQ(inc.cause.name, "node_lost");
  // The fault is dated to the last heartbeat, not to its verdict: the
  // silence was detection time (it used to be 0, and the silent seconds were
  // booked as productive, then recomputed).
  EXPECT_EQ(inc.fault_at, T(0.75));
  EXPECT_NEAR(Seconds(inc.detected_at - inc.fault_at), 10.05, 1e-9);
  EXPECT_NEAR(Seconds(job.m.ledger().total(LedgerCategory::kDetection)), 10.05, 1e-9);
}

// A job that gives up after a failure stops its generation once (it used to
// ask the agents twice: the failure's stop, then the finish's).
TEST(JobMachine, GivingUpAfterAFailureStopsTheGenerationOnce) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 5);
  WorkerExitEvent exit{0, 1, NodeId{1}, 1, std::nullopt};
  exit.log_cause = "dataset_missing";
  exit.log_action = LogAction::kStop;
  exit.log_rule = "file_not_found";
  const std::vector<JobAction> a = job.Do(exit);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<StopGenerationAction>(a[0]));
  ASSERT_TRUE(std::holds_alternative<FinishAction>(a[1]));
  EXPECT_EQ(std::get<FinishAction>(a[1]).exit_code, 3);
}

TEST(JobMachine, SameUserExceptionAtTheSameStepStopsTheJob) {
  Job job;
  job.Up();
  std::optional<FinishAction> finish;
  for (int attempt = 0; attempt < 3 && !finish; ++attempt) {
    job.Ready(attempt == 0 ? 0 : 10);
    job.Run(attempt == 0 ? 1 : 11, 14);
    WorkerExitEvent exit{job.m.generation(), 0, NodeId{0}, 1, std::nullopt};
    exit.log_cause = "user_exception";
    exit.log_action = LogAction::kRestart;
    exit.log_rule = "user_exception";
    exit.log_line = "ValueError: bad shard";
    auto a = job.Do(exit);
    auto f = Find<FinishAction>(a);
    if (!f.empty())
      finish = f[0];
    else
      job.StopBoth();
  }
  ASSERT_TRUE(finish.has_value());
  EXPECT_EQ(finish->exit_code, 3);
  EXPECT_NE(finish->reason.find("user_exception"), std::string::npos) << finish->reason;
  EXPECT_EQ(job.m.phase(), JobPhase::kDone);
}

TEST(JobMachine, ALogRuleThatSaysEvictEvictsTheNode) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 10);
  job.Do(FaultFiredEvent{0, 1, "xid", FaultKind::kLog, 11, T(job.now)});
  WorkerExitEvent exit{0, 1, NodeId{1}, 1, std::nullopt};
  exit.log_cause = "xid_79";
  exit.log_action = LogAction::kEvictNode;
  exit.log_rule = "xid_hardware";
  exit.log_line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.";
  auto a = job.Do(exit);
  auto evict = Find<EvictNodeAction>(a);
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_EQ(evict[0].node, NodeId{1});
  const Incident& inc = job.m.incidents().at(0);
  EXPECT_EQ(inc.cause.name, "xid_79");
  EXPECT_EQ(inc.action, "evict_and_wait_for_repair");
  EXPECT_EQ(inc.log_line, exit.log_line);
}

// Rank `rank`'s worker exits with code 1 after the log classifier matched
// `cause` with `action`.
WorkerExitEvent ExitWithLog(Generation generation, int rank, NodeId node, std::string cause,
                            std::string action, std::string line) {
  WorkerExitEvent exit{generation, Rank{rank}, node, 1, std::nullopt};
  exit.log_cause = std::move(cause);
  exit.log_action = *ParseLogAction(action);
  exit.log_rule = exit.log_cause;
  exit.log_line = std::move(line);
  return exit;
}

TEST(JobMachine, AStartUpFailureOnEveryNodeStopsAfterThreeAttemptsAndEvictsNothing) {
  Job job;
  job.Up();
  // Spare capacity, as `endure run` brings up after an eviction.
  for (int n = 2; n < 12; ++n) job.Do(NodeUp{NodeId{n}, "node" + std::to_string(n), 1});
  std::vector<JobAction> all;
  std::optional<FinishAction> finish;
  for (int attempt = 0; attempt < 20 && !finish; ++attempt) {
    job.now += 1;
    // The program raises before its first step on every node; whichever
    // rank's exit arrives first is the incident, the other a consequence.
    const Generation gen = job.m.generation();
    const int first = attempt % 2;
    const NodeId members[] = {job.m.NodeOfRank(Rank{0}), job.m.NodeOfRank(Rank{1})};
    auto a = job.Do(ExitWithLog(gen, first, members[first], "user_exception", "restart",
                                "RuntimeError: bad config"));
    all.insert(all.end(), a.begin(), a.end());
    if (auto f = Find<FinishAction>(a); !f.empty()) {
      finish = f[0];
      break;
    }
    job.Do(ExitWithLog(gen, 1 - first, members[1 - first], "user_exception", "restart",
                       "RuntimeError: bad config"));
    for (NodeId n : members) {
      a = job.Do(GenerationStoppedEvent{gen, n});
      all.insert(all.end(), a.begin(), a.end());
    }
  }
  ASSERT_TRUE(finish.has_value());
  EXPECT_EQ(finish->exit_code, 3);
  EXPECT_NE(finish->reason.find("user_exception at start-up in 3 consecutive attempts, on "
                                "different nodes (node0, node1)"),
            std::string::npos)
      << finish->reason;
  EXPECT_NE(finish->reason.find("in the program or its configuration, not the nodes"),
            std::string::npos)
      << finish->reason;
  EXPECT_EQ(job.m.generation().value, 2);  // three attempts
  EXPECT_TRUE(Find<EvictNodeAction>(all).empty());
  ASSERT_EQ(job.m.incidents().size(), 3u);
  EXPECT_EQ(job.m.incidents()[0].action, "restart_in_place");
  EXPECT_EQ(job.m.incidents()[1].action, "restart_in_place");
  EXPECT_EQ(job.m.incidents()[2].action, "stop");
  for (const auto& start : Find<StartGenerationAction>(all)) {
    EXPECT_EQ(start.nodes, (std::vector<NodeId>{NodeId{0}, NodeId{1}}));
  }
}

TEST(JobMachine, OnlyHardwareCausesEvictANode) {
  Job job;
  job.Up();
  job.Ready(0);
  int64_t step = 0;
  // Node 1 fails after 10 more steps each time; returns what the machine did.
  auto fail_node1 = [&](std::string cause, std::string action) {
    job.Run(step + 1, step + 10);
    step += 10;
    return job.Do(ExitWithLog(job.m.generation(), 1, NodeId{1}, cause, action, "..."));
  };
  auto restart = [&] {
    auto start = Find<StartGenerationAction>(job.StopBoth());
    ASSERT_EQ(start.size(), 1u) << job.m.incidents().back().reason;
    EXPECT_EQ(start[0].nodes, (std::vector<NodeId>{NodeId{0}, NodeId{1}}));
    job.Ready(step);
  };
  // Software, again and again on the same node: never its fault. Not even
  // when a log rule (wrongly) says evict_node.
  for (const auto& [cause, action] :
       std::vector<std::pair<std::string, std::string>>{{"user_exception", "restart"},
                                                        {"user_exception", "restart"},
                                                        {"cuda_oom", "restart"},
                                                        {"user_exception", "evict_node"}}) {
    auto a = fail_node1(cause, action);
    EXPECT_TRUE(Find<EvictNodeAction>(a).empty())
        << cause << ": " << job.m.incidents().back().reason;
    EXPECT_EQ(job.m.incidents().back().action, "restart_in_place");
    restart();
  }
  EXPECT_NE(job.m.incidents().back().reason.find("user_exception is a software cause"),
            std::string::npos)
      << job.m.incidents().back().reason;
  // Soft hardware: the node's first thermal failure restarts (a strike), its
  // second isolates it.
  auto first = fail_node1("gpu_thermal_interface_sensor", "restart");
  EXPECT_TRUE(Find<EvictNodeAction>(first).empty());
  ASSERT_EQ(Find<StrikeNodeAction>(first).size(), 1u);
  EXPECT_FALSE(Find<StrikeNodeAction>(first)[0].hard);
  restart();
  auto evict = Find<EvictNodeAction>(fail_node1("gpu_thermal_interface_sensor", "restart"));
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_EQ(evict[0].node, NodeId{1});
  EXPECT_EQ(job.m.incidents().back().action, "evict_and_wait_for_repair");
}

// A hard cause (uncorrectable ECC, Xid 48/79/94/95, a lost GPU) quarantines
// the node at once, even where the rule's action or path says restart.
TEST(JobMachine, AHardCauseQuarantinesTheNodeAtOnce) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 10);
  auto a =
      job.Do(ExitWithLog(job.m.generation(), 1, NodeId{1}, "ecc_uncorrectable", "restart", "..."));
  auto strikes = Find<StrikeNodeAction>(a);
  ASSERT_EQ(strikes.size(), 1u);
  EXPECT_TRUE(strikes[0].hard);
  EXPECT_EQ(strikes[0].node_name, "node1");
  auto evict = Find<EvictNodeAction>(a);
  ASSERT_EQ(evict.size(), 1u);
  EXPECT_EQ(evict[0].node, NodeId{1});
  EXPECT_NE(job.m.incidents().back().reason.find("hard cause: the node is quarantined"),
            std::string::npos);
  // Software strikes nothing.
  Job other;
  other.Up();
  other.Ready(0);
  other.Run(1, 10);
  EXPECT_TRUE(Find<StrikeNodeAction>(other.Do(ExitWithLog(other.m.generation(), 1, NodeId{1},
                                                          "user_exception", "restart", "...")))
                  .empty());
}

TEST(JobMachine, AHangOnASingleNodeJobRestartsAndNeverEvictsTheNode) {
  JobMachineOptions o = Options();
  o.nodes = 1;
  JobMachine m(o, {}, T(0));
  double now = 0;
  std::vector<JobAction> all;
  auto step = [&](const JobEvent& e) {
    auto a = m.Step(e, T(now));
    all.insert(all.end(), a.begin(), a.end());
    return a;
  };
  ASSERT_EQ(Find<StartGenerationAction>(step(NodeUp{NodeId{0}, "node0", 1})).size(), 1u);
  int64_t done = 0;
  for (int hang = 1; hang <= 4; ++hang) {
    step(WorkerReady{m.generation(), 0, done, 0});
    for (int i = 0; i < 10; ++i) {  // progress past the previous hang
      now += 0.15;
      step(NodeHeartbeat{NodeId{0}});
      step(StepEnd{m.generation(), 0, ++done, 2.0, 0, -1});
    }
    // Rank 0 makes no more progress; its agent keeps beating.
    std::optional<TimePoint> deadline = m.NextDeadline();
    ASSERT_TRUE(deadline.has_value());
    now = Seconds(*deadline - T(0));
    step(NodeHeartbeat{NodeId{0}});
    ASSERT_EQ(Find<StopGenerationAction>(step(Tick{})).size(), 1u) << hang;
    EXPECT_EQ(m.incidents().back().cause.name, "hang");
    EXPECT_EQ(m.incidents().back().action, "restart_in_place") << m.incidents().back().reason;
    auto start =
        Find<StartGenerationAction>(step(GenerationStoppedEvent{m.generation(), NodeId{0}}));
    ASSERT_EQ(start.size(), 1u) << hang << ": " << m.incidents().back().reason;
    EXPECT_EQ(start[0].nodes, std::vector<NodeId>{NodeId{0}});
  }
  EXPECT_TRUE(Find<EvictNodeAction>(all).empty());
  EXPECT_EQ(m.incidents().size(), 4u);
  EXPECT_EQ(m.phase(), JobPhase::kRunning);
}

TEST(JobMachine, OnlyFaultsThatEndAWorkerExplainItsExit) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 5);
  job.Do(FaultFiredEvent{0, 1, "slow", FaultKind::kSlow, 3, T(1)});
  job.now += 1;
  job.Do(WorkerExitEvent{0, 1, NodeId{1}, 1, std::nullopt});
  const Incident& inc = job.m.incidents().at(0);
  EXPECT_FALSE(inc.injected_at.has_value());
  EXPECT_EQ(inc.fault_at, inc.detected_at);
}

TEST(JobMachine, ExternalFaultsFireByStepAndByTime) {
  std::vector<ExternalFault> faults = {
      {"agent", FaultKind::kKillAgent, 1, 8, std::nullopt},
      {"sched", FaultKind::kKill, 0, -1, std::chrono::seconds(30)}};
  JobMachineOptions o = Options();
  o.hang.floor = std::chrono::seconds(60);         // no hang verdict in this test
  o.heartbeat.timeout = std::chrono::seconds(60);  // nor a lost node
  Job job(o, faults);
  job.Up();
  job.Ready(0);
  std::vector<InjectFaultAction> injected;
  for (int64_t s = 1; s <= 8; ++s) {
    job.now += 0.15;
    for (auto& a : Find<InjectFaultAction>(job.StepBoth(s))) injected.push_back(a);
  }
  ASSERT_EQ(injected.size(), 1u);
  EXPECT_EQ(injected[0].fault.id, "agent");
  EXPECT_EQ(injected[0].node, NodeId{1});
  EXPECT_EQ(*job.m.NextDeadline(), T(30));
  job.now = 29.9;
  EXPECT_TRUE(Find<InjectFaultAction>(job.Do(Tick{})).empty());
  job.now = 30;
  auto a = Find<InjectFaultAction>(job.Do(Tick{}));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].fault.id, "sched");
}

TEST(JobMachine, FailingPersistenceIsOneIncidentThatStopsNothing) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 5);
  auto a = job.Do(PersistFailedEvent{0, 1, 5, NodeId{1}, "No space left on device"});
  EXPECT_TRUE(a.empty());  // training goes on
  job.Do(PersistFailedEvent{0, 1, 6, NodeId{1}, "No space left on device"});
  ASSERT_EQ(job.m.incidents().size(), 1u);
  const Incident& inc = job.m.incidents()[0];
  EXPECT_EQ(inc.cause.name, "checkpoint persistence failing");
  EXPECT_EQ(inc.node_name, "node1");
  EXPECT_NE(inc.reason.find("step 5 shard 1"), std::string::npos) << inc.reason;
  EXPECT_NE(inc.reason.find("memory tiers"), std::string::npos) << inc.reason;
  // A later crash is its own incident, and the restore note lands on it.
  job.Run(6, 12);
  job.Do(WorkerExitEvent{0, 0, NodeId{0}, std::nullopt, 9});
  auto start = Find<StartGenerationAction>(job.StopBoth());
  ASSERT_EQ(start.size(), 1u);
  job.Do(RestoreChosen{start[0].generation, "step 10 from T0 x2"});
  ASSERT_EQ(job.m.incidents().size(), 2u);
  EXPECT_EQ(job.m.incidents()[1].restore, "step 10 from T0 x2");
  EXPECT_EQ(job.m.incidents()[0].restore, "");
}

// Every message carries the generation it belongs to. One of an earlier
// generation (a worker of a stopped generation exiting late, reports still
// in flight, a stop confirmed twice) is dropped: it changes nothing.
TEST(JobMachine, MessagesOfAStaleGenerationAreDropped) {
  Job job;
  job.Up();
  job.Ready(0);
  job.Run(1, 12);
  job.now += 0.05;
  ASSERT_EQ(
      Find<StopGenerationAction>(job.Do(WorkerExitEvent{0, 1, NodeId{1}, std::nullopt, 9})).size(),
      1u);
  ASSERT_EQ(Find<StartGenerationAction>(job.StopBoth()).size(), 1u);
  ASSERT_EQ(job.m.generation().value, 1);
  const std::vector<StepNumber> checkpoints = job.m.checkpoints().Restorable();
  const StepNumber step = job.m.step();
  const double loss = job.m.last_loss();

  // Generation 1 has started; its workers are not ready yet. Generation 0
  // says all it could.
  std::vector<JobAction> actions;
  auto stale = [&](const JobEvent& e) {
    std::vector<JobAction> a = job.Do(e);
    actions.insert(actions.end(), a.begin(), a.end());
  };
  job.now += 0.01;
  for (int r = 0; r < 2; ++r) stale(WorkerReady{0, r, 12, 0.5});
  stale(StepEnd{0, 0, 13, std::nan(""), 0, 13});
  stale(StepEnd{0, 1, 13, std::nan(""), 0, -1});
  stale(WorkerExitEvent{0, 0, NodeId{0}, std::nullopt, 9});
  stale(WorkerExitEvent{0, 1, NodeId{1}, 1, std::nullopt, "xid_79", LogAction::kEvictNode,
                        "xid_hardware", "NVRM: Xid 79"});
  for (int r = 0; r < 2; ++r) stale(WorkerExitEvent{0, r, NodeId{r}, 0, std::nullopt});
  stale(GenerationStoppedEvent{0, NodeId{0}});
  stale(GenerationStoppedEvent{0, NodeId{1}});
  EXPECT_TRUE(actions.empty()) << actions.size() << " actions";
  EXPECT_EQ(job.m.phase(), JobPhase::kRunning);
  EXPECT_EQ(job.m.generation().value, 1);
  EXPECT_EQ(job.m.step(), step);
  EXPECT_EQ(job.m.last_loss(), loss);
  EXPECT_EQ(job.m.checkpoints().Restorable(), checkpoints);
  ASSERT_EQ(job.m.incidents().size(), 1u);
  EXPECT_FALSE(job.m.incidents()[0].ready_at.has_value());  // generation 1 is not ready
  EXPECT_FALSE(job.m.incidents()[0].recovered_at.has_value());

  // Generation 1 goes on as if nothing had been said.
  job.Ready(10, 0.05);
  EXPECT_EQ(job.m.incidents()[0].restored_step.value, 10);
  EXPECT_EQ(job.m.incidents()[0].restore_s, 0.05);
  job.Run(11, 15);
  EXPECT_EQ(job.m.step().value, 15);
  EXPECT_TRUE(job.m.incidents()[0].recovered_at.has_value());

  // It fails in turn: generation 0's stop confirmations do not stand for
  // generation 1's, which alone start generation 2.
  job.now += 0.05;
  ASSERT_EQ(
      Find<StopGenerationAction>(job.Do(WorkerExitEvent{1, 0, NodeId{0}, std::nullopt, 9})).size(),
      1u);
  EXPECT_TRUE(job.Do(GenerationStoppedEvent{0, NodeId{0}}).empty());
  EXPECT_TRUE(job.Do(GenerationStoppedEvent{0, NodeId{1}}).empty());
  EXPECT_EQ(job.m.phase(), JobPhase::kStopping);
  std::vector<StartGenerationAction> next = Find<StartGenerationAction>(job.StopBoth());
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].generation.value, 2);
  EXPECT_EQ(job.m.incidents().size(), 2u);
}

}  // namespace
}  // namespace endure::core

namespace endure::core {
namespace {

// The decision core at 12,500 nodes x 8 ranks (issue 24): 100,000 ranks
// register, start and train 6 steps of 1 s with their heartbeats; nothing
// is judged a failure, the job's step follows the slowest rank, and when
// one rank stops reporting, the hang is found at its deadline and names
// that rank and its node. (bench/job_machine_bench prints what each input
// costs; this asserts only the outcomes.)
TEST(JobMachineAtScale, OneHundredThousandRanksTrainAndOneSilentRankIsNamed) {
  constexpr int kNodes = 12'500, kPerNode = 8, kWorld = kNodes * kPerNode;
  JobMachineOptions o;
  o.nodes = kNodes;
  o.ranks_per_node = kPerNode;
  o.isolation.pairwise_test = false;
  JobMachine m(o, {}, At(Duration(0)));
  double now = 0;
  auto at = [&] {
    return At(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(now)));
  };
  std::vector<JobAction> started;
  for (int n = 0; n < kNodes; ++n) {
    started = m.Step(NodeUp{NodeId{n}, "node" + std::to_string(n), kPerNode}, at());
  }
  ASSERT_EQ(started.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<StartGenerationAction>(started[0]));
  EXPECT_EQ(std::get<StartGenerationAction>(started[0]).nodes.size(), size_t{kNodes});
  now += 1;
  for (int r = 0; r < kWorld; ++r) m.Step(WorkerReady{m.generation(), r, 0, 0.1}, at());
  const int silent = 54'321;
  for (int64_t step = 1; step <= 6; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      if (step == 6 && r == silent) continue;
      StepEnd e{m.generation(), r, step, 2.0, 0, -1};
      e.compute_s = 0.9;
      EXPECT_TRUE(m.Step(e, At(std::chrono::duration_cast<Duration>(
                                std::chrono::duration<double>(now + 0.4 * r / kWorld))))
                      .empty());
    }
    now += 0.5;
    for (int n = 0; n < kNodes; ++n) m.Step(NodeHeartbeat{NodeId{n}}, at());
    now += 0.5;
    EXPECT_TRUE(m.Step(Tick{}, at()).empty());
  }
  EXPECT_TRUE(m.incidents().empty());
  EXPECT_EQ(m.step(), StepNumber{5});  // the silent rank is at 5
  // Nothing more from anyone's ranks; the agents still beat. The hang is
  // judged at the machine's next deadline.
  for (int beat = 0; beat < 60 && m.incidents().empty(); ++beat) {
    const std::optional<TimePoint> next = m.NextDeadline();
    ASSERT_TRUE(next.has_value());
    now += 1;
    for (int n = 0; n < kNodes; ++n) m.Step(NodeHeartbeat{NodeId{n}}, at());
    m.Step(Tick{}, at());
  }
  ASSERT_EQ(m.incidents().size(), 1u);
  const Incident& inc = m.incidents()[0];
  EXPECT_EQ(inc.cause.kind, Cause::kHang);
  EXPECT_EQ(inc.rank, Rank{silent});
  EXPECT_EQ(inc.node, NodeId{silent / kPerNode});
}

}  // namespace
}  // namespace endure::core
