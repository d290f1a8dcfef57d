// LeaderElection on explicit time: campaigns, renewals, fencing, standing
// down. No threads, no etcd.
#include "controller/leader_election.h"

#include <gtest/gtest.h>

namespace endure::controller {
namespace {

using namespace std::chrono_literals;
using Do = ElectionStep::Do;
using Role = LeaderElection::Role;
using TimePoint = Clock::TimePoint;

constexpr int64_t kLease = 0x51;

TimePoint T(Duration d) { return TimePoint{} + std::chrono::duration_cast<TimePoint::duration>(d); }

LeaderElectionOptions Options() {
  return {.lease_ttl = 5s, .campaign_every = 250ms, .request_timeout = 2s};
}

EtcdLease Granted(int64_t revision = 7) { return {.id = kLease, .ttl = 5s, .revision = revision}; }

EtcdCampaign Lost(const std::string& leader = "127.0.0.1:7001") {
  return {.won = false, .revision = 9, .leader = leader, .leader_lease = 0x99};
}

// A fresh standby that got its lease at t = 0.
LeaderElection Standby() {
  LeaderElection e(Options());
  EXPECT_EQ(e.Next(T(0s)).what, Do::kGrantLease);
  e.OnLeaseGranted(Granted(), T(0s));
  return e;
}

// A leader that won at t = 0.
LeaderElection Leader() {
  LeaderElection e = Standby();
  EXPECT_EQ(e.Next(T(0s)).what, Do::kCampaign);
  e.OnCampaign({.won = true, .revision = 8}, T(0s));
  EXPECT_EQ(e.Next(T(10ms)).what, Do::kLead);
  return e;
}

TEST(LeaderElection, AStandbyGetsALeaseCampaignsAtOnceAndLeadsWhenItWins) {
  LeaderElection e(Options());
  ElectionStep step = e.Next(T(0s));
  ASSERT_EQ(step.what, Do::kGrantLease);
  EXPECT_EQ(step.deadline, T(2s));
  e.OnLeaseGranted(Granted(), T(0s));
  EXPECT_EQ(e.since_revision(), 7);
  EXPECT_EQ(e.lease(), kLease);
  ASSERT_EQ(e.Next(T(5ms)).what, Do::kCampaign);
  e.OnCampaign({.won = true, .revision = 8}, T(5ms));
  step = e.Next(T(10ms));
  EXPECT_EQ(step.what, Do::kLead);
  EXPECT_NE(step.reason.find("won the election"), std::string::npos) << step.reason;
  EXPECT_EQ(e.role(), Role::kLeader);
  // Said once; then it waits for the first renewal, a third of the TTL on.
  step = e.Next(T(20ms));
  EXPECT_EQ(step.what, Do::kWait);
  EXPECT_EQ(step.at, T(Duration(5s) / 3));
}

TEST(LeaderElection, ALosingStandbyCampaignsEveryIntervalAndKeepsItsLeaseAlive) {
  LeaderElection e = Standby();
  ASSERT_EQ(e.Next(T(0s)).what, Do::kCampaign);
  e.OnCampaign(Lost(), T(0s));
  EXPECT_EQ(e.leader(), "127.0.0.1:7001");
  EXPECT_EQ(e.role(), Role::kStandby);
  ElectionStep step = e.Next(T(100ms));
  EXPECT_EQ(step.what, Do::kWait);
  EXPECT_EQ(step.at, T(250ms));
  EXPECT_EQ(e.Next(T(250ms)).what, Do::kCampaign);
  e.OnCampaign(Lost(), T(250ms));
  // The lease is renewed a third of the TTL after it was granted.
  TimePoint t = T(500ms);
  while (t < T(Duration(5s) / 3)) {
    ASSERT_EQ(e.Next(t).what, Do::kCampaign) << (t - T(0s)).count();
    e.OnCampaign(Lost(), t);
    t += 250ms;
  }
  ElectionStep renew = e.Next(t);
  ASSERT_EQ(renew.what, Do::kKeepAlive);
  e.OnKeepAlive(Granted(), t);
  EXPECT_EQ(e.Next(t).what, Do::kCampaign);  // the campaign that was due
}

TEST(LeaderElection, ACampaignWhoseAnswerWasLostIsRecognisedByTheLease) {
  LeaderElection e = Standby();
  ASSERT_EQ(e.Next(T(0s)).what, Do::kCampaign);
  e.OnFailure("etcd at 127.0.0.1:2379: campaign: Deadline Exceeded", T(2s));
  // A failure has the lease renewed too (it may be what failed).
  ASSERT_EQ(e.Next(T(2250ms)).what, Do::kKeepAlive);
  e.OnKeepAlive(Granted(), T(2250ms));
  ASSERT_EQ(e.Next(T(2250ms)).what, Do::kCampaign);
  // The first one did put the key: it is bound to our lease.
  e.OnCampaign({.won = false, .revision = 9, .leader = "me", .leader_lease = kLease}, T(2250ms));
  EXPECT_EQ(e.Next(T(2300ms)).what, Do::kLead);
}

TEST(LeaderElection, ALeaderRenewsEveryThirdOfTheTtlCountedFromWhenItAsked) {
  LeaderElection e = Leader();
  const TimePoint first = T(Duration(5s) / 3);
  ElectionStep step = e.Next(first);
  ASSERT_EQ(step.what, Do::kKeepAlive);
  // The answer came 1.5 s late: the lease counts from the request, so the
  // next renewal is due a third of the TTL after it was sent.
  e.OnKeepAlive(Granted(), first);
  step = e.Next(first + 1500ms);
  EXPECT_EQ(step.what, Do::kWait);
  EXPECT_EQ(step.at, first + std::chrono::duration_cast<TimePoint::duration>(Duration(5s) / 3));
  EXPECT_EQ(e.role(), Role::kLeader);
}

TEST(LeaderElection, ALeaderThatCannotRenewFencesAMarginBeforeItsLeaseCouldExpire) {
  LeaderElection e = Leader();
  TimePoint t = T(Duration(5s) / 3);
  // etcd stops answering: renewals fail, each ends in time for the fence.
  int renewals = 0;
  while (true) {
    ElectionStep step = e.Next(t);
    if (step.what == Do::kFence) {
      EXPECT_NE(step.reason.find("connection refused"), std::string::npos) << step.reason;
      break;
    }
    if (step.what == Do::kWait) {
      t = step.at;
      continue;
    }
    ASSERT_EQ(step.what, Do::kKeepAlive);
    // No request may outlive the instant the leader must stop at.
    EXPECT_LE(step.deadline, T(4s));
    ++renewals;
    t = std::min(step.deadline, t + 10ms);
    e.OnFailure("etcd at 127.0.0.1:2379: lease keepalive: connection refused", t);
  }
  // Granted at 0 with a TTL of 5 s, the margin min(1 s, TTL / 4) = 1 s.
  EXPECT_EQ(t, T(4s));
  EXPECT_GT(renewals, 5);
  EXPECT_EQ(e.role(), Role::kFenced);
  // Said once.
  EXPECT_EQ(e.Next(T(10s)).what, Do::kWait);
  EXPECT_EQ(e.Next(T(10s)).at, TimePoint::max());
}

TEST(LeaderElection, ALeaderWhoseLeaseEtcdNoLongerHasFencesAtOnce) {
  LeaderElection e = Leader();
  const TimePoint t = T(Duration(5s) / 3);
  ASSERT_EQ(e.Next(t).what, Do::kKeepAlive);
  e.OnKeepAlive({.id = kLease, .ttl = 0s}, t);
  const ElectionStep step = e.Next(t + 1ms);
  EXPECT_EQ(step.what, Do::kFence);
  EXPECT_NE(step.reason.find("no longer has lease"), std::string::npos) << step.reason;
}

TEST(LeaderElection, AStandbyWhoseLeaseIsGoneGetsANewOne) {
  LeaderElection e = Standby();
  const TimePoint t = T(Duration(5s) / 3);
  e.OnCampaign(Lost(), T(0s));
  ASSERT_EQ(e.Next(t).what, Do::kKeepAlive);
  e.OnKeepAlive({.id = kLease, .ttl = 0s}, t);
  ASSERT_EQ(e.Next(t).what, Do::kGrantLease);
  e.OnLeaseGranted({.id = 0x52, .ttl = 5s, .revision = 30}, t);
  EXPECT_EQ(e.lease(), 0x52);
  EXPECT_EQ(e.since_revision(), 7) << "counted from the first lease";
  EXPECT_EQ(e.Next(t).what, Do::kCampaign);
}

TEST(LeaderElection, AStandbyWithoutEtcdRetriesAndNeverLeads) {
  LeaderElection e(Options());
  TimePoint t = T(0s);
  for (int i = 0; i < 20; ++i) {
    ElectionStep step = e.Next(t);
    if (step.what == Do::kWait) {
      EXPECT_EQ(step.at, t + 250ms) << i;  // paced, not spinning
      t = step.at;
      continue;
    }
    ASSERT_EQ(step.what, Do::kGrantLease) << i;
    t += 1ms;
    e.OnFailure("etcd at 127.0.0.1:2379: lease grant: connection refused", t);
  }
  EXPECT_EQ(e.role(), Role::kStandby);
  EXPECT_EQ(e.lease(), 0);
}

TEST(LeaderElection, AStandbyStandsDownWithTheExitCodeOfAJobThatEndedAfterItJoined) {
  LeaderElection e = Standby();  // joined at revision 7
  // A job of the same name that ended earlier (revision 5) is no reason.
  e.OnCampaign({.won = false, .revision = 9, .finished = "3", .finished_revision = 5}, T(0s));
  ASSERT_EQ(e.Next(T(250ms)).what, Do::kCampaign);
  e.OnCampaign({.won = false, .revision = 12, .finished = "0", .finished_revision = 11}, T(250ms));
  const ElectionStep step = e.Next(T(260ms));
  EXPECT_EQ(step.what, Do::kStandDown);
  EXPECT_EQ(step.exit_code, 0);
  EXPECT_EQ(e.role(), Role::kStoodDown);
  EXPECT_EQ(e.Next(T(1s)).what, Do::kWait);
}

TEST(LeaderElection, AGarbledExitCodeStandsDownWithOne) {
  LeaderElection e = Standby();
  e.OnCampaign({.won = false, .revision = 12, .finished = "done", .finished_revision = 11}, T(0s));
  EXPECT_EQ(e.Next(T(1ms)).exit_code, 1);
}

TEST(LeaderElectionOptions, TheLeaseIsWholeSecondsFromTwo) {
  EXPECT_TRUE(Options().Validate().ok());
  for (Duration ttl : {Duration(1s), Duration(2500ms), Duration(2h)}) {
    LeaderElectionOptions o = Options();
    o.lease_ttl = ttl;
    const Status st = o.Validate();
    EXPECT_FALSE(st.ok()) << FormatDuration(ttl);
    EXPECT_NE(st.message().find("whole seconds in [2s, 1h]"), std::string::npos) << st.message();
  }
  LeaderElectionOptions o = Options();
  o.campaign_every = 5s;
  EXPECT_FALSE(o.Validate().ok());
  EXPECT_EQ(o.fence_margin(), Duration(1s));
  o.lease_ttl = 2s;
  EXPECT_EQ(o.fence_margin(), Duration(500ms));
}

TEST(ParseEtcdEndpoints, TakesAListAndEtcdsOwnUrls) {
  Result<std::vector<std::string>> e =
      ParseEtcdEndpoints("127.0.0.1:2379,http://10.0.0.2:2379/", "--etcd");
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(*e, (std::vector<std::string>{"127.0.0.1:2379", "10.0.0.2:2379"}));
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:x", "a:2379,", ":2379", "h:70000"}) {
    Result<std::vector<std::string>> r = ParseEtcdEndpoints(bad, "--etcd");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_EQ(r.status().message().rfind("--etcd: '", 0), 0u) << r.status().message();
  }
}

}  // namespace
}  // namespace endure::controller
