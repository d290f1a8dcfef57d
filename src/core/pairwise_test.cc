#include "core/pairwise.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <set>

namespace endure::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Pairs = PairwiseTest::Pairs;

NodeId N(int v) { return NodeId{v}; }

std::vector<NodeId> Nodes(int n) {
  std::vector<NodeId> nodes;
  for (int i = 0; i < n; ++i) nodes.push_back(N(i));
  return nodes;
}

// A cluster whose allreduce between two nodes fails when either is in
// `broken`, takes 10x as long when either is in `slow`, and 0.1s (plus a
// little jitter) otherwise.
struct Cluster {
  std::set<int> broken, slow;

  std::vector<PairResult> Run(const Pairs& pairs) const {
    std::vector<PairResult> out;
    int jitter = 0;
    for (const auto& [a, b] : pairs) {
      PairResult r{a, b};
      if (broken.count(a.value) || broken.count(b.value)) {
        r.ok = false;
        r.seconds = 0.012;
        r.error = "Connection reset by peer";
      } else {
        r.seconds = 0.100 + 0.001 * (jitter++ % 3);
        if (slow.count(a.value) || slow.count(b.value)) r.seconds *= 10;
      }
      out.push_back(r);
    }
    return out;
  }
};

// Runs both rounds against `cluster`.
PairwiseVerdict RunTest(int n, const Cluster& cluster, Pairs* round2 = nullptr) {
  PairwiseTest t(Nodes(n), {});
  auto r = t.OnResults(cluster.Run(t.FirstRound()));
  if (auto* pairs = std::get_if<Pairs>(&r)) {
    EXPECT_EQ(t.round(), 2);
    if (round2 != nullptr) *round2 = *pairs;
    r = t.OnResults(cluster.Run(*pairs));
  }
  EXPECT_TRUE(t.done());
  return std::get<PairwiseVerdict>(r);
}

TEST(PairwiseOptions, ValidateNamesTheField) {
  EXPECT_TRUE(PairwiseOptions{}.Validate().ok());
  EXPECT_EQ((PairwiseOptions{0.5, 0.05}).Validate().message(),
            "slow_factor must be in (1, 1000], got 0.5");
  EXPECT_EQ((PairwiseOptions{3, -1}).Validate().message(), "min_slow_s must be >= 0, got -1");
}

TEST(PairwiseTest, FirstRoundPairsNeighboursAndTheOddOneWithTheFirst) {
  EXPECT_THAT(PairwiseTest(Nodes(4), {}).FirstRound(),
              ElementsAre(Pairs::value_type{N(0), N(1)}, Pairs::value_type{N(2), N(3)}));
  EXPECT_THAT(PairwiseTest(Nodes(5), {}).FirstRound(),
              ElementsAre(Pairs::value_type{N(0), N(1)}, Pairs::value_type{N(2), N(3)},
                          Pairs::value_type{N(4), N(0)}));
  // The given order, not the ids' order.
  EXPECT_THAT(PairwiseTest({N(7), N(3), N(5)}, {}).FirstRound(),
              ElementsAre(Pairs::value_type{N(7), N(3)}, Pairs::value_type{N(5), N(7)}));
}

TEST(PairwiseTest, FindsTheFaultyNodeOfFour) {
  Pairs round2;
  const PairwiseVerdict v = RunTest(4, Cluster{{2}, {}}, &round2);
  EXPECT_THAT(round2, ElementsAre(Pairs::value_type{N(2), N(0)}, Pairs::value_type{N(3), N(1)}));
  EXPECT_TRUE(v.resolved);
  EXPECT_THAT(v.faulty, ElementsAre(N(2)));
  EXPECT_THAT(v.slow, IsEmpty());
  EXPECT_THAT(v.suspects, ElementsAre(N(2), N(3)));
  EXPECT_EQ(v.reason,
            "round 1 (median 0.100s): node 2 + node 3 failed after 0.012s (Connection reset by "
            "peer); round 2 (reference 0.100s): node 2 + node 0 failed after 0.012s (Connection "
            "reset by peer); node 3 + node 1 passed in 0.100s: node 2 is faulty");
}

TEST(PairwiseTest, FindsTheFaultyNodeOfFiveAndOfEight) {
  for (int bad = 0; bad < 5; ++bad) {
    const PairwiseVerdict v = RunTest(5, Cluster{{bad}, {}});
    // Node 0 is in two of round 1's pairs: with it broken, both fail, and
    // the third pair still gives healthy partners.
    EXPECT_TRUE(v.resolved) << bad << ": " << v.reason;
    EXPECT_THAT(v.faulty, ElementsAre(N(bad))) << v.reason;
  }
  for (int bad = 0; bad < 8; ++bad) {
    const PairwiseVerdict v = RunTest(8, Cluster{{bad}, {}});
    EXPECT_TRUE(v.resolved) << v.reason;
    EXPECT_THAT(v.faulty, ElementsAre(N(bad))) << v.reason;
  }
  // Two broken nodes in different pairs of eight: both found.
  const PairwiseVerdict v = RunTest(8, Cluster{{1, 6}, {}});
  EXPECT_THAT(v.faulty, ElementsAre(N(1), N(6))) << v.reason;
  EXPECT_THAT(v.reason, HasSubstr("node 1, node 6 are faulty"));
}

TEST(PairwiseTest, FindsASlowNode) {
  const PairwiseVerdict v = RunTest(4, Cluster{{}, {1}});
  EXPECT_TRUE(v.resolved);
  EXPECT_THAT(v.faulty, IsEmpty());
  EXPECT_THAT(v.slow, ElementsAre(N(1)));
  EXPECT_THAT(v.suspects, ElementsAre(N(0), N(1)));
  EXPECT_THAT(v.reason, HasSubstr("round 1 (median 0.101s): node 0 + node 1 slow: 1.000s"));
  EXPECT_THAT(v.reason, HasSubstr("node 1 + node 3 slow:"));
  EXPECT_THAT(v.reason, HasSubstr(": node 1 is slow"));

  const PairwiseVerdict seven = RunTest(7, Cluster{{}, {5}});
  EXPECT_THAT(seven.slow, ElementsAre(N(5))) << seven.reason;
}

TEST(PairwiseTest, SlowOnlyAboveTheFloor) {
  // 30x as slow, but 30 ms in all: jitter of a tiny test, not a finding.
  PairwiseTest t(Nodes(4), {});
  auto r = t.OnResults({{N(0), N(1), true, 0.030}, {N(2), N(3), true, 0.001}});
  ASSERT_TRUE(std::holds_alternative<PairwiseVerdict>(r));
  const PairwiseVerdict& v = std::get<PairwiseVerdict>(r);
  EXPECT_TRUE(v.resolved);
  EXPECT_THAT(v.suspects, IsEmpty());
  EXPECT_EQ(v.reason,
            "round 1 (median 0.001s): all 2 pairs passed (slowest 0.030s): no node is faulty");
}

TEST(PairwiseTest, TwoNodesAreUnresolved) {
  PairwiseTest t(Nodes(2), {});
  auto r = t.OnResults(Cluster{{1}, {}}.Run(t.FirstRound()));
  ASSERT_TRUE(std::holds_alternative<PairwiseVerdict>(r));
  const PairwiseVerdict& v = std::get<PairwiseVerdict>(r);
  EXPECT_FALSE(v.resolved);
  EXPECT_THAT(v.faulty, IsEmpty());
  EXPECT_THAT(v.suspects, ElementsAre(N(0), N(1)));
  EXPECT_EQ(v.reason,
            "round 1: node 0 + node 1 failed after 0.012s (Connection reset by "
            "peer); no pair passed, so there is no healthy node to re-pair node 0, node 1 with: "
            "unresolved");
  EXPECT_EQ(t.round(), 1);
  // Asked again, the same verdict.
  auto again = t.OnResults({});
  EXPECT_EQ(std::get<PairwiseVerdict>(again).reason, v.reason);
}

TEST(PairwiseTest, MissingResultsFailAndUnaskedOnesAreIgnored) {
  PairwiseTest t(Nodes(4), {});
  // No result for 2+3; one for a pair nobody asked for, which would have
  // cleared node 3; 0+1 reported reversed.
  auto r = t.OnResults({{N(1), N(0), true, 0.1}, {N(3), N(0), true, 0.1}});
  ASSERT_TRUE(std::holds_alternative<Pairs>(r));
  EXPECT_THAT(std::get<Pairs>(r),
              ElementsAre(Pairs::value_type{N(2), N(0)}, Pairs::value_type{N(3), N(1)}));
  EXPECT_EQ(t.pairs(), std::get<Pairs>(r));
  // Round 2: node 3's pair passes, node 2's result never comes.
  r = t.OnResults({{N(3), N(1), true, 0.1}, {N(0), N(1), false, 0, "ignored"}});
  ASSERT_TRUE(std::holds_alternative<PairwiseVerdict>(r));
  const PairwiseVerdict& v = std::get<PairwiseVerdict>(r);
  EXPECT_TRUE(v.resolved);
  EXPECT_THAT(v.faulty, ElementsAre(N(2)));
  EXPECT_THAT(v.reason, HasSubstr("round 1 (median 0.100s): node 2 + node 3 failed (no result)"));
  EXPECT_THAT(v.reason,
              HasSubstr("round 2 (reference 0.100s): node 2 + node 0 failed (no result)"));
}

TEST(PairwiseTest, FailuresThatDoNotRecurAreUnresolved) {
  PairwiseTest t(Nodes(4), {});
  auto r = t.OnResults({{N(0), N(1), true, 0.1}, {N(2), N(3), false, 5.0, "timed out"}});
  ASSERT_TRUE(std::holds_alternative<Pairs>(r));
  r = t.OnResults(Cluster{}.Run(std::get<Pairs>(r)));
  const PairwiseVerdict& v = std::get<PairwiseVerdict>(r);
  EXPECT_FALSE(v.resolved);
  EXPECT_THAT(v.faulty, IsEmpty());
  EXPECT_THAT(v.suspects, ElementsAre(N(2), N(3)));
  EXPECT_THAT(v.reason, HasSubstr("node 2 + node 3 failed after 5.000s (timed out)"));
  EXPECT_THAT(v.reason, HasSubstr("did not recur"));
}

TEST(PairwiseTest, EveryPairFailingIsUnresolved) {
  const PairwiseVerdict v = RunTest(4, Cluster{{0, 3}, {}});
  EXPECT_FALSE(v.resolved);
  EXPECT_THAT(v.suspects, ElementsAre(N(0), N(1), N(2), N(3)));
  EXPECT_THAT(v.reason, HasSubstr("no healthy node"));
}

TEST(PairwiseTest, AllPassing) {
  const PairwiseVerdict v = RunTest(6, Cluster{});
  EXPECT_TRUE(v.resolved);
  EXPECT_THAT(v.faulty, IsEmpty());
  EXPECT_THAT(v.slow, IsEmpty());
  EXPECT_THAT(v.reason, HasSubstr("all 3 pairs passed"));
}

}  // namespace
}  // namespace endure::core
