#include "core/recovery_route.h"

#include <gtest/gtest.h>

namespace endure::core {
namespace {

// One rank of four failed; the other three are ready and rejoin.
RouteFacts OneRankKilled() {
  RouteFacts f;
  f.world_size = 4;
  f.failed_ranks = 1;
  f.survivors_rejoining = 3;
  return f;
}

TEST(RecoveryRoute, AKilledRankWhosePeersRejoinIsRestartedInProcess) {
  RouteDecision d = ChooseRoute(OneRankKilled());
  EXPECT_EQ(d.route, RecoveryRoute::kInProcess);
  EXPECT_NE(d.reason.find("3 of 4 ranks keep their process"), std::string::npos) << d.reason;
}

TEST(RecoveryRoute, AnEvictedNodeMovesToASpareOnlyWhenOneIsReady) {
  RouteFacts f = OneRankKilled();
  f.action = RecoveryAction::kReplaceWithSpare;
  f.failed_ranks = 2;
  f.nodes_to_replace = 1;
  f.survivors_rejoining = 2;
  f.spares_available = 1;
  EXPECT_EQ(ChooseRoute(f).route, RecoveryRoute::kSpare);
  f.spares_available = 0;
  RouteDecision d = ChooseRoute(f);
  EXPECT_EQ(d.route, RecoveryRoute::kFullRestart);
  EXPECT_NE(d.reason.find("0 spare nodes ready for the 1 that leave"), std::string::npos)
      << d.reason;
}

// Four nodes of one rank each; node 3 is lost and no spare is ready.
RouteFacts ANodeLostWithoutASpare() {
  RouteFacts f = OneRankKilled();
  f.action = RecoveryAction::kWaitForRepair;
  f.nodes = 4;
  f.nodes_to_replace = 1;
  f.spares_available = 0;
  return f;
}

TEST(RecoveryRoute, WithoutASpareAnElasticJobShrinksDownToItsMinimum) {
  RouteFacts f = ANodeLostWithoutASpare();
  RouteDecision fixed = ChooseRoute(f);  // min_nodes 0: it needs every node
  EXPECT_EQ(fixed.route, RecoveryRoute::kFullRestart);
  EXPECT_NE(fixed.reason.find("repair"), std::string::npos) << fixed.reason;

  f.min_nodes = 3;
  RouteDecision d = ChooseRoute(f);
  EXPECT_EQ(d.route, RecoveryRoute::kShrink);
  EXPECT_NE(d.reason.find("goes on with 3 of 4 nodes"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("grows back"), std::string::npos) << d.reason;

  f.nodes_to_replace = 2;  // two lost: 2 left, below the minimum
  f.failed_ranks = 2;
  f.survivors_rejoining = 2;
  f.action = RecoveryAction::kReplaceWithSpare;
  d = ChooseRoute(f);
  EXPECT_EQ(d.route, RecoveryRoute::kFullRestart);
  EXPECT_NE(d.reason.find("2 nodes are fewer than [job] min_nodes = 3"), std::string::npos)
      << d.reason;
  f.spares_available = 1;  // one spare: 3 nodes, one of them the spare
  d = ChooseRoute(f);
  EXPECT_EQ(d.route, RecoveryRoute::kShrink);
  EXPECT_NE(d.reason.find("3 of 4 nodes"), std::string::npos) << d.reason;
  f.spares_available = 2;  // enough spares: no shrink
  EXPECT_EQ(ChooseRoute(f).route, RecoveryRoute::kSpare);
}

TEST(RecoveryRoute, AShrinkStillNeedsEverySurvivorToRejoin) {
  RouteFacts f = ANodeLostWithoutASpare();
  f.min_nodes = 1;
  f.survivors_rejoining = 2;
  f.first_not_rejoining = 1;
  RouteDecision d = ChooseRoute(f);
  EXPECT_EQ(d.route, RecoveryRoute::kFullRestart);
  EXPECT_NE(d.reason.find("rank 1 cannot rejoin"), std::string::npos) << d.reason;
  EXPECT_EQ(ParseRecoveryRoute("shrink").value(), RecoveryRoute::kShrink);
  EXPECT_EQ(RecoveryRouteName(RecoveryRoute::kShrink), "shrink");
}

TEST(RecoveryRoute, EachReasonToRestartFromTheTiersSaysWhy) {
  struct Case {
    const char* name;
    void (*change)(RouteFacts&);
    const char* says;
  };
  const Case cases[] = {
      {"off", [](RouteFacts& f) { f.in_process_enabled = false; }, "in_process"},
      {"rollback", [](RouteFacts& f) { f.rollback = true; }, "rollback"},
      {"hang", [](RouteFacts& f) { f.hang = true; }, "hang"},
      {"localize", [](RouteFacts& f) { f.localize = true; }, "pairwise test"},
      {"backoff", [](RouteFacts& f) { f.backoff = true; }, "backs off"},
      {"start-up", [](RouteFacts& f) { f.productive = false; }, "had not completed a step"},
      {"wait", [](RouteFacts& f) { f.action = RecoveryAction::kWaitForRepair; }, "repair"},
      {"nobody left",
       [](RouteFacts& f) {
         f.failed_ranks = 4;
         f.survivors_rejoining = 0;
       },
       "no rank kept"},
      {"a survivor that cannot rejoin",
       [](RouteFacts& f) {
         f.survivors_rejoining = 2;
         f.first_not_rejoining = 2;
       },
       "rank 2 cannot rejoin"},
  };
  for (const Case& c : cases) {
    RouteFacts f = OneRankKilled();
    c.change(f);
    RouteDecision d = ChooseRoute(f);
    EXPECT_EQ(d.route, RecoveryRoute::kFullRestart) << c.name;
    EXPECT_NE(d.reason.find(c.says), std::string::npos) << c.name << ": " << d.reason;
  }
}

TEST(RecoveryRoute, NamesRoundTrip) {
  for (RecoveryRoute r :
       {RecoveryRoute::kInProcess, RecoveryRoute::kSpare, RecoveryRoute::kFullRestart}) {
    Result<RecoveryRoute> back = ParseRecoveryRoute(RecoveryRouteName(r));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, r);
  }
  EXPECT_FALSE(ParseRecoveryRoute("teleport").ok());
}

}  // namespace
}  // namespace endure::core
