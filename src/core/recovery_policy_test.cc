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
  // Failed restarts never reach a step to repeat: they count towards the
  // start-up rule (StopsAStartUpFailureAfterThreeAttempts), not rule 1.
  RecoveryPolicyOptions o = Options();
  o.startup_repeats = 0;
  RecoveryPolicy p(o);
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
  o.startup_repeats = 0;  // five failed restarts in a row: only the backoff here
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
  // An NVLink Xid: hardware, whose path is restart until the node repeats.
  EXPECT_EQ(p.Step(Fail(9, "xid_74", 10), At(minutes(0))).action, RecoveryAction::kRestartInPlace);
  RecoveryDecision d = p.Step(Fail(9, "xid_74", 50, /*spares=*/1), At(minutes(20)));
  EXPECT_EQ(d.action, RecoveryAction::kReplaceWithSpare);
  EXPECT_THAT(d.reason, HasSubstr("2nd hardware failure within 1h00m: isolating it"));
  // Outside the window the node starts with a clean slate.
  EXPECT_EQ(p.Step(Fail(9, "xid_74", 90), At(minutes(200))).action,
            RecoveryAction::kRestartInPlace);
}

TEST(RecoveryPolicy, SoftwareFailuresOnTheSameNodeNeverEvictIt) {
  RecoveryPolicyOptions o = Options();
  o.backoff_initial = Duration(0);
  RecoveryPolicy p(o);
  // Node 4 fails again and again, at a new step each time (training goes on):
  // an exception, an exit status, a killed worker, a NaN. None is the node's.
  int64_t step = 100;
  for (std::string_view cause :
       {"user_exception", "user_exception", "worker_exit code 1", "worker_exit code 1",
        "signal 9 SIGKILL", "loss_nan", "user_exception", "cuda_oom"}) {
    step += 50;
    RecoveryDecision d = p.Step(Fail(4, cause, step, /*spares=*/2), At(minutes(step / 10)));
    EXPECT_EQ(d.action, RecoveryAction::kRestartInPlace) << cause << ": " << d.reason;
  }
  RecoveryDecision d = p.Step(Fail(4, "user_exception", 999, /*spares=*/2), At(minutes(59)));
  EXPECT_EQ(d.action, RecoveryAction::kRestartInPlace);
  EXPECT_THAT(d.reason, HasSubstr("not isolating node 4 after its 9th failure"));
  EXPECT_THAT(d.reason, HasSubstr("user_exception is a software cause"));
  // The software failures do not count towards isolating it for hardware:
  // its first hardware failure restarts, its second isolates it.
  EXPECT_EQ(p.Step(Fail(4, "xid_79", 1000), At(minutes(59))).action,
            RecoveryAction::kRestartInPlace);
  EXPECT_EQ(p.Step(Fail(4, "xid_79", 1001), At(minutes(59))).action,
            RecoveryAction::kEvictAndWaitForRepair);
}

TEST(RecoveryPolicy, AHangNeverIsolatesANode) {
  RecoveryPolicyOptions o = Options();
  o.backoff_initial = Duration(0);
  RecoveryPolicy p(o);
  // A one-node job whose node hangs repeatedly, each time after progress:
  // a hang is ambiguous, and evicting the only node would end the job.
  for (int i = 1; i <= 5; ++i) {
    RecoveryDecision d = p.Step(Fail(0, "hang", 100 * i), At(minutes(5 * i)));
    EXPECT_EQ(d.action, RecoveryAction::kRestartInPlace) << i << ": " << d.reason;
  }
  RecoveryDecision d = p.Step(Fail(0, "hang", 600), At(minutes(30)));
  EXPECT_EQ(d.action, RecoveryAction::kRestartInPlace);
  EXPECT_THAT(d.reason, HasSubstr("hang is ambiguous, no evidence against the node"));
}

TEST(RecoveryPolicy, StopsAStartUpFailureAfterThreeAttempts) {
  RecoveryPolicy p(Options());
  auto startup = [](int node, std::string_view name, std::string_view cause) {
    FailureEvent e = Fail(node, cause, 0, /*spares=*/8);
    e.node_name = name;
    e.during_recovery = true;
    return e;
  };
  // Two start-up failures, then training progresses: the run is broken.
  EXPECT_EQ(p.Step(startup(0, "node0", "user_exception"), At(minutes(1))).action,
            RecoveryAction::kRestartInPlace);
  EXPECT_EQ(p.Step(startup(1, "node1", "user_exception"), At(minutes(2))).action,
            RecoveryAction::kRestartInPlace);
  EXPECT_EQ(p.Step(Fail(0, "user_exception", 40, 8), At(minutes(10))).action,
            RecoveryAction::kRestartInPlace);
  // So is a different cause in between.
  EXPECT_EQ(p.Step(startup(1, "node1", "user_exception"), At(minutes(11))).action,
            RecoveryAction::kRestartInPlace);
  EXPECT_EQ(p.Step(startup(0, "node0", "worker_exit code 1"), At(minutes(12))).action,
            RecoveryAction::kRestartInPlace);
  // Now three in a row, whichever rank fails first: nothing is evicted, and
  // the third stops the job with a verdict that names the failure.
  std::vector<RecoveryDecision> d;
  d.push_back(p.Step(startup(0, "node0", "user_exception"), At(minutes(13))));
  d.push_back(p.Step(startup(1, "node1", "user_exception"), At(minutes(14))));
  d.push_back(p.Step(startup(0, "node0", "user_exception"), At(minutes(15))));
  EXPECT_EQ(d[0].action, RecoveryAction::kRestartInPlace) << d[0].reason;
  EXPECT_EQ(d[1].action, RecoveryAction::kRestartInPlace) << d[1].reason;
  EXPECT_EQ(d[2].action, RecoveryAction::kStop) << d[2].reason;
  EXPECT_THAT(d[2].reason, HasSubstr("user_exception at start-up in 3 consecutive attempts, "
                                     "on different nodes (node0, node1)"));
  EXPECT_THAT(d[2].reason, HasSubstr("the failure is in the program or its configuration, not "
                                     "the nodes; stopping"));
}

TEST(RecoveryPolicy, HardwareFailuresAtStartUpAreNeverStructural) {
  RecoveryPolicy p(Options());
  // A GPU lost on one node after another while the job restarts: bad luck
  // with nodes, not a broken program. Each node is isolated; the job goes on.
  for (int i = 0; i < 5; ++i) {
    FailureEvent e = Fail(i, "gpu_lost", 0, /*spares=*/3);
    e.during_recovery = true;
    e.node_fault_evidence = true;
    RecoveryDecision d = p.Step(e, At(minutes(i)));
    EXPECT_EQ(d.action, RecoveryAction::kReplaceWithSpare) << i << ": " << d.reason;
  }
  // Nor at the same step while training.
  for (int i = 10; i < 15; ++i) {
    EXPECT_EQ(p.Step(Fail(i, "faulty_gpu", 500, 3), At(minutes(i))).action,
              RecoveryAction::kReplaceWithSpare);
  }
}

TEST(RecoveryPolicy, ALogRuleSaysEvictOnlyForAHardwareCause) {
  RecoveryPolicy p(Options());
  FailureEvent e = Fail(2, "xid_79", 30);
  e.node_fault_evidence = true;
  RecoveryDecision d = p.Step(e, At(minutes(1)));
  EXPECT_EQ(d.action, RecoveryAction::kEvictAndWaitForRepair);
  EXPECT_THAT(d.reason, HasSubstr("log rule's action is evict_node: isolating node 2"));
  // An unknown cause named by such a rule: the rule's word stands.
  e = Fail(3, "my_site_nic_flap", 40);
  e.node_fault_evidence = true;
  EXPECT_EQ(p.Step(e, At(minutes(2))).action, RecoveryAction::kEvictAndWaitForRepair);
  // A rule that says evict_node for a software cause is wrong: restart.
  e = Fail(4, "user_exception", 50);
  e.node_fault_evidence = true;
  d = p.Step(e, At(minutes(3)));
  EXPECT_EQ(d.action, RecoveryAction::kRestartInPlace);
  EXPECT_THAT(d.reason, HasSubstr("user_exception is a software cause"));
}

TEST(RecoveryPolicy, ClassifiesCauses) {
  for (std::string_view c :
       {"faulty_gpu", "gpu_lost", "ecc_uncorrectable", "xid_79", "xid_48", "node_lost", "nic",
        "network_switch_cable", "gpu_init_failed", "row_remap_failure", "slurm_node_failure"}) {
    EXPECT_EQ(ClassifyCause(c), CauseClass::kHardware) << c;
    EXPECT_TRUE(IsHardwareCause(c)) << c;
  }
  for (std::string_view c : {"user_exception", "worker_exit code 1", "loss_nan", "cuda_oom", "oom",
                             "software_bug", "cuda_device_assert", "user_error"}) {
    EXPECT_EQ(ClassifyCause(c), CauseClass::kSoftware) << c;
  }
  for (std::string_view c :
       {"hang", "disk_full", "nccl_timeout", "signal 9 SIGKILL", "xid_31", "xid_13", "xid_94",
        "xid_7900", "xid_", "cuda_error", "something_new"}) {
    EXPECT_EQ(ClassifyCause(c), CauseClass::kAmbiguous) << c;
  }
  EXPECT_EQ(CauseClassName(CauseClass::kHardware), "hardware");
  // A configured evict or wait path marks an ambiguous cause as the
  // component's fault; a software cause stays software.
  RecoveryPolicy p(Options());
  EXPECT_EQ(p.ClassOf(Fail(1, "switch", 1)), CauseClass::kHardware);
  EXPECT_EQ(p.ClassOf(Fail(1, "hang", 1)), CauseClass::kAmbiguous);
  FailureEvent e = Fail(1, "user_exception", 1);
  e.node_fault_evidence = true;
  EXPECT_EQ(p.ClassOf(e), CauseClass::kSoftware);
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
  o = RecoveryPolicyOptions();
  o.startup_repeats = -1;
  EXPECT_THAT(o.Validate().message(), HasSubstr("startup_repeats"));
  o.startup_repeats = 0;  // disables the rule
  EXPECT_TRUE(o.Validate().ok());
}

}  // namespace
}  // namespace endure::core
