#include "core/failure_decision.h"

#include <gtest/gtest.h>

#include <vector>

namespace endure::core {
namespace {

TimePoint At(int seconds) { return TimePoint{} + std::chrono::seconds(seconds); }

// Two nodes of two ranks; node 1 failed while the job trained.
FailureFacts Failed(std::string_view cause, int spares = 1) {
  FailureFacts f;
  f.event.node = NodeId{1};
  f.event.cause = cause;
  f.event.step = StepNumber{100};
  f.event.spares_available = spares;
  return f;
}

// Records what DecideFailure asked and answers with the job's facts: the
// failed node's two ranks fail, the other two rejoin.
struct Asked {
  std::vector<RecoveryAction> actions;
  std::vector<bool> leaves;

  RouteFactsFor Facts(int spares = 1) {
    return [this, spares](RecoveryAction action, bool node_leaves) {
      actions.push_back(action);
      leaves.push_back(node_leaves);
      RouteFacts r;
      r.world_size = 4;
      r.nodes = 2;
      r.failed_ranks = 2;
      r.survivors_rejoining = 2;
      r.nodes_to_replace = node_leaves ? 1 : 0;
      r.spares_available = spares;
      return r;
    };
  }
};

RecoveryPolicy Policy() { return RecoveryPolicy(RecoveryPolicyOptions{}); }

TEST(FailureDecision, ASoftwareCrashRestartsInProcessWithoutAStrike) {
  RecoveryPolicy policy = Policy();
  Asked asked;
  const FailureDecision d = DecideFailure(policy, Failed("software_bug"), At(0), asked.Facts());
  EXPECT_EQ(d.action, RecoveryAction::kRestartInPlace);
  EXPECT_FALSE(d.strike);
  EXPECT_FALSE(d.node_leaves);
  ASSERT_TRUE(d.route.has_value());
  EXPECT_EQ(d.route->route, RecoveryRoute::kInProcess);
  EXPECT_EQ(asked.leaves, std::vector<bool>{false});
}

TEST(FailureDecision, AHardCauseTheNodeWouldKeepQuarantinesItAtOnce) {
  // faulty_gpu restarts in place by the default path; its strike is hard.
  RecoveryPolicy policy = Policy();
  Asked asked;
  const FailureDecision d = DecideFailure(policy, Failed("faulty_gpu"), At(0), asked.Facts());
  EXPECT_TRUE(d.strike);
  EXPECT_TRUE(d.hard_strike);
  EXPECT_TRUE(d.node_leaves);
  EXPECT_EQ(d.action, RecoveryAction::kReplaceWithSpare);
  EXPECT_NE(d.reason.find("faulty_gpu is a hard cause: the node is quarantined"), std::string::npos)
      << d.reason;
  // The route is chosen with the node gone: its ranks move to the spare.
  EXPECT_EQ(asked.actions, std::vector<RecoveryAction>{RecoveryAction::kReplaceWithSpare});
  EXPECT_EQ(asked.leaves, std::vector<bool>{true});
  ASSERT_TRUE(d.route.has_value());
  EXPECT_EQ(d.route->route, RecoveryRoute::kSpare);

  // Without a spare the node leaves all the same, to wait for a repair.
  RecoveryPolicy none = Policy();
  Asked asked2;
  const FailureDecision w = DecideFailure(none, Failed("faulty_gpu", 0), At(0), asked2.Facts(0));
  EXPECT_EQ(w.action, RecoveryAction::kEvictAndWaitForRepair);
  EXPECT_TRUE(w.node_leaves);
}

TEST(FailureDecision, ASoftHardwareCauseStrikesButKeepsTheNode) {
  RecoveryPolicy policy = Policy();
  Asked asked;
  const FailureDecision d = DecideFailure(policy, Failed("node_failure"), At(0), asked.Facts());
  EXPECT_TRUE(d.strike);
  EXPECT_FALSE(d.hard_strike);
  EXPECT_FALSE(d.node_leaves);
  EXPECT_EQ(d.action, RecoveryAction::kRestartInPlace);
}

TEST(FailureDecision, AnAmbiguousCauseIsNoEvidenceAgainstTheNodeUnlessTheLogNamesIt) {
  RecoveryPolicy policy = Policy();
  Asked asked;
  const FailureDecision hang = DecideFailure(policy, Failed("hang"), At(0), asked.Facts());
  EXPECT_FALSE(hang.strike);
  EXPECT_FALSE(hang.node_leaves);

  // A log rule's evict_node names the node's hardware.
  FailureFacts f = Failed("nccl_error");
  f.log_action = LogAction::kEvictNode;
  const FailureDecision named = DecideFailure(policy, f, At(10), asked.Facts());
  EXPECT_TRUE(named.strike);
  EXPECT_TRUE(named.node_leaves);
  EXPECT_EQ(named.action, RecoveryAction::kReplaceWithSpare);
}

TEST(FailureDecision, WithoutAHealthLedgerAHardCauseNeitherStrikesNorEvicts) {
  // The simulator's ablation of multi-strike.
  RecoveryPolicy policy = Policy();
  Asked asked;
  FailureFacts f = Failed("faulty_gpu");
  f.strikes = false;
  const FailureDecision d = DecideFailure(policy, f, At(0), asked.Facts());
  EXPECT_FALSE(d.strike);
  EXPECT_FALSE(d.node_leaves);
  EXPECT_EQ(d.action, RecoveryAction::kRestartInPlace);
}

TEST(FailureDecision, ALogRuleThatSaysStopStopsWithoutARouteOrAStrike) {
  RecoveryPolicy policy = Policy();
  Asked asked;
  FailureFacts f = Failed("faulty_gpu");
  f.log_action = LogAction::kStop;
  const FailureDecision d = DecideFailure(policy, f, At(0), asked.Facts());
  EXPECT_TRUE(d.stops());
  EXPECT_FALSE(d.route.has_value());
  EXPECT_FALSE(d.strike);
  EXPECT_TRUE(asked.actions.empty());
  EXPECT_NE(d.reason.find("the matching log rule's action is stop"), std::string::npos);
}

TEST(FailureDecision, StopIfRepeatedRestartsOnceThenStopsInTheConfirmingRestart) {
  RecoveryPolicy policy = Policy();
  Asked asked;
  FailureFacts f = Failed("disk_full");
  f.log_action = LogAction::kStopIfRepeated;
  const FailureDecision first = DecideFailure(policy, f, At(0), asked.Facts());
  EXPECT_FALSE(first.stops());
  EXPECT_NE(first.reason.find("this restart confirms it"), std::string::npos) << first.reason;

  f.confirms_incident = 4;
  const FailureDecision second = DecideFailure(policy, f, At(60), asked.Facts());
  EXPECT_TRUE(second.stops());
  EXPECT_NE(second.reason.find("in the restart that was to confirm it (incident 4)"),
            std::string::npos)
      << second.reason;
}

TEST(FailureDecision, ABackoffIsAFactOfTheRoute) {
  // The same node fails again with the same cause before the job got past
  // the step of its previous failure: the policy backs off.
  RecoveryPolicy policy = Policy();
  Asked asked;
  ASSERT_EQ(DecideFailure(policy, Failed("software_bug"), At(0), asked.Facts()).delay, Duration(0));
  const FailureDecision again =
      DecideFailure(policy, Failed("software_bug"), At(60), asked.Facts());
  ASSERT_GT(again.delay, Duration(0));
  ASSERT_TRUE(again.route.has_value());
  EXPECT_EQ(again.route->route, RecoveryRoute::kFullRestart) << again.route->reason;
}

}  // namespace
}  // namespace endure::core
