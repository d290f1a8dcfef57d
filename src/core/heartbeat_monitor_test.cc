#include "core/heartbeat_monitor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace endure::core {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

TimePoint T(Duration d) { return At(d); }
const NodeId kA{0};
const NodeId kB{1};

HeartbeatMonitorOptions Opts() {
  HeartbeatMonitorOptions o;
  o.timeout = seconds(10);
  o.drop_grace = seconds(2);
  return o;
}

TEST(HeartbeatMonitorOptions, Validate) {
  EXPECT_TRUE(Opts().Validate().ok());
  HeartbeatMonitorOptions o = Opts();
  o.drop_grace = seconds(11);
  EXPECT_THAT(o.Validate().message(), HasSubstr("drop_grace"));
  o = Opts();
  o.timeout = Duration::zero();
  EXPECT_THAT(o.Validate().message(), HasSubstr("timeout"));
}

// Whether any node that counts (a member of the generation) has been quiet
// since a time: answered from the nodes heard from longest ago, visiting
// only those heard before it, whatever the number of nodes.
TEST(HeartbeatMonitor, AnyHeardByVisitsOnlyTheNodesHeardBeforeTheTime) {
  HeartbeatMonitor m(Opts());
  constexpr int kNodes = 12'500;
  for (int n = 0; n < kNodes; ++n) m.Register(NodeId{n}, T(seconds(0)));
  for (int n = 0; n < kNodes; ++n) {
    if (n != 7 && n != 9) m.OnHeartbeat(NodeId{n}, T(seconds(3)));
  }
  m.OnHeartbeat(NodeId{9}, T(milliseconds(1500)));
  int visited = 0;
  auto members_but_7 = [&](NodeId n) {
    ++visited;
    return n.value != 7;
  };
  // Node 7 (heard at 0) does not count; node 9 (heard at 1.5 s) does.
  EXPECT_TRUE(m.AnyHeardBy(T(seconds(2)), members_but_7));
  EXPECT_EQ(visited, 2);
  visited = 0;
  EXPECT_FALSE(m.AnyHeardBy(T(seconds(1)), members_but_7));
  EXPECT_EQ(visited, 1) << "only node 7 was heard by 1 s";
  // Lost and removed nodes are not asked about.
  m.Remove(NodeId{9});
  visited = 0;
  EXPECT_FALSE(m.AnyHeardBy(T(seconds(2)), members_but_7));
  EXPECT_EQ(visited, 1);
  EXPECT_EQ(m.Check(T(seconds(10))).size(), 1u) << "node 7, silent for 10 s";
  visited = 0;
  EXPECT_FALSE(m.AnyHeardBy(T(seconds(2)), [&](NodeId) { return ++visited, true; }));
  EXPECT_EQ(visited, 0);
  EXPECT_TRUE(m.AnyHeardBy(T(seconds(3)), [](NodeId) { return true; }));
}

TEST(HeartbeatMonitor, RegularHeartbeatsKeepANodeAlive) {
  HeartbeatMonitor m(Opts());
  m.Register(kA, T(seconds(0)));
  for (int s = 1; s <= 100; ++s) {
    ASSERT_TRUE(m.OnHeartbeat(kA, T(seconds(s))));
    ASSERT_TRUE(m.Check(T(seconds(s) + milliseconds(999))).empty());
  }
  EXPECT_EQ(*m.NextDeadline(), T(seconds(110)));
}

TEST(HeartbeatMonitor, SilenceWithOpenStreamTimesOut) {
  HeartbeatMonitor m(Opts());
  m.Register(kA, T(seconds(0)));
  m.Register(kB, T(seconds(0)));
  m.OnHeartbeat(kA, T(seconds(5)));
  m.OnHeartbeat(kB, T(seconds(6)));
  EXPECT_EQ(*m.NextDeadline(), T(seconds(15)));
  EXPECT_TRUE(m.Check(T(seconds(15) - milliseconds(1))).empty());
  auto lost = m.Check(T(seconds(15)));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].kind, CrashKind::kNodeLost);
  EXPECT_EQ(lost[0].cause, "node_lost");
  EXPECT_EQ(lost[0].node, kA);
  EXPECT_EQ(lost[0].last_seen, T(seconds(5)));
  EXPECT_EQ(lost[0].reason,
            "node 0: no heartbeat for 10.0s while its stream stayed open (timeout 10.0s)");
  EXPECT_TRUE(m.IsLost(kA));
  EXPECT_FALSE(m.IsLost(kB));
  // Reported once; the next deadline is node B's.
  EXPECT_EQ(*m.NextDeadline(), T(seconds(16)));
  EXPECT_EQ(m.Check(T(seconds(16))).size(), 1u);
  EXPECT_TRUE(m.Check(T(seconds(100))).empty());
  EXPECT_FALSE(m.NextDeadline().has_value());
}

TEST(HeartbeatMonitor, DroppedStreamIsLostAfterTheGrace) {
  HeartbeatMonitor m(Opts());
  m.Register(kA, T(seconds(0)));
  m.OnHeartbeat(kA, T(seconds(3)));
  m.OnStreamDropped(kA, T(seconds(3) + milliseconds(500)));
  EXPECT_EQ(*m.NextDeadline(), T(seconds(5) + milliseconds(500)));
  EXPECT_TRUE(m.Check(T(seconds(5))).empty());
  auto lost = m.Check(T(seconds(5) + milliseconds(500)));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].reason,
            "node 0: stream dropped 2.0s ago without reconnecting (grace 2.0s); last heartbeat "
            "2.5s ago");
}

TEST(HeartbeatMonitor, ReconnectWithinTheGraceIsNotALoss) {
  HeartbeatMonitor m(Opts());
  m.Register(kA, T(seconds(0)));
  m.OnStreamDropped(kA, T(seconds(1)));
  ASSERT_TRUE(m.OnStreamReconnected(kA, T(seconds(2))));
  EXPECT_TRUE(m.Check(T(seconds(11))).empty());
  EXPECT_EQ(*m.NextDeadline(), T(seconds(12)));
}

TEST(HeartbeatMonitor, LostNodeIsFencedUntilItRegistersAgain) {
  HeartbeatMonitor m(Opts());
  m.Register(kA, T(seconds(0)));
  ASSERT_EQ(m.Check(T(seconds(10))).size(), 1u);
  EXPECT_FALSE(m.OnHeartbeat(kA, T(seconds(11))));
  EXPECT_FALSE(m.OnStreamReconnected(kA, T(seconds(11))));
  EXPECT_TRUE(m.IsLost(kA));
  m.Register(kA, T(seconds(12)));
  EXPECT_FALSE(m.IsLost(kA));
  EXPECT_TRUE(m.OnHeartbeat(kA, T(seconds(13))));
}

TEST(HeartbeatMonitor, UnknownAndRemovedNodes) {
  HeartbeatMonitor m(Opts());
  EXPECT_FALSE(m.OnHeartbeat(kA, T(seconds(1))));
  EXPECT_FALSE(m.NextDeadline().has_value());
  m.Register(kA, T(seconds(0)));
  m.Remove(kA);
  EXPECT_TRUE(m.Check(T(seconds(100))).empty());
  EXPECT_FALSE(m.OnHeartbeat(kA, T(seconds(101))));
}

}  // namespace
}  // namespace endure::core
