#include "core/node_health.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace endure::core {
namespace {

using std::chrono::hours;
using std::chrono::minutes;
using ::testing::HasSubstr;

constexpr int64_t kHourMs = 3600 * 1000;
// A wall-clock origin far from zero, as real unix_ms are.
constexpr int64_t kT0 = 1'760'000'000'000;

int64_t AtHour(double h) { return kT0 + static_cast<int64_t>(h * kHourMs); }

TEST(StrikeClassOf, HardCausesQuarantineAtOnce) {
  for (std::string_view c :
       {"sdc", "silent_data_corruption", "health_check_failed", "health_check_failed matmul",
        "health_check_failed: disk write", "gpu_lost", "gpu_fallen_off", "gpu_init_failed",
        "faulty_gpu", "ecc_uncorrectable", "gpu_hbm3", "gpu_sram", "xid_48", "xid_79", "xid_95",
        "row_remap_failure", "dcgm_diag_failed"}) {
    EXPECT_EQ(StrikeClassOf(c), StrikeClass::kHard) << c;
  }
}

TEST(StrikeClassOf, EverythingElseIsSoft) {
  for (std::string_view c :
       {"straggler", "hang_suspect", "sdc_suspect", "node_lost", "pairwise_failed", "xid_13",
        "xid_31", "xid_63", "xid_74", "xid_94", "xid_119", "xid_480", "xid_4", "nccl_timeout",
        "hang", "health_check", "health_check_failedx", "sdcx", "gpu"}) {
    EXPECT_EQ(StrikeClassOf(c), StrikeClass::kSoft) << c;
  }
  EXPECT_EQ(StrikeFor("xid_79", 5, "GPU has fallen off the bus").cls, StrikeClass::kHard);
  EXPECT_EQ(StrikeFor("straggler", 5).cls, StrikeClass::kSoft);
}

TEST(NodeHealthOptions, ValidateNamesTheKey) {
  EXPECT_TRUE(NodeHealthOptions{}.Validate().ok());
  EXPECT_TRUE((NodeHealthOptions{1, minutes(1)}).Validate().ok());
  EXPECT_TRUE((NodeHealthOptions{1000, hours(1)}).Validate().ok());
  Status s = NodeHealthOptions{0, hours(1)}.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "soft_strikes must be in [1, 1000], got 0");
  s = NodeHealthOptions{1001, hours(1)}.Validate();
  EXPECT_THAT(s.message(), HasSubstr("soft_strikes"));
  s = NodeHealthOptions{3, Duration::zero()}.Validate();
  EXPECT_EQ(s.message(), "soft_window must be positive, got 0ms");
  s = NodeHealthOptions{3, -hours(1)}.Validate();
  EXPECT_THAT(s.message(), HasSubstr("soft_window"));
}

TEST(HealthState, NamesRoundTrip) {
  for (HealthState st : {HealthState::kHealthy, HealthState::kSuspect, HealthState::kQuarantined}) {
    Result<HealthState> back = ParseHealthState(HealthStateName(st));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, st);
  }
  EXPECT_EQ(HealthStateName(HealthState::kQuarantined), "quarantined");
  Result<HealthState> bad = ParseHealthState("sick");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'sick'"));
  for (StrikeClass c : {StrikeClass::kHard, StrikeClass::kSoft}) {
    EXPECT_EQ(*ParseStrikeClass(StrikeClassName(c)), c);
  }
  EXPECT_FALSE(ParseStrikeClass("medium").ok());
}

TEST(JudgeNode, NoStrikesIsHealthy) {
  const NodeVerdict v = JudgeNode({}, AtHour(0), {});
  EXPECT_EQ(v.state, HealthState::kHealthy);
  EXPECT_EQ(v.reason, "no strikes");
}

TEST(JudgeNode, OneHardStrikeQuarantinesHoweverOld) {
  const std::vector<Strike> strikes = {
      StrikeFor("straggler", AtHour(1)),
      StrikeFor("xid_79", AtHour(2), "GPU has fallen off the bus")};
  NodeVerdict v = JudgeNode(strikes, AtHour(3), {});
  EXPECT_EQ(v.state, HealthState::kQuarantined);
  EXPECT_EQ(v.reason, "hard strike: xid_79 (GPU has fallen off the bus)");
  // A month later it is still quarantined: only a release clears it.
  v = JudgeNode(strikes, AtHour(24 * 30), {});
  EXPECT_EQ(v.state, HealthState::kQuarantined);

  v = JudgeNode({StrikeFor("sdc", AtHour(5)), StrikeFor("ecc_uncorrectable", AtHour(4))}, AtHour(6),
                {});
  EXPECT_EQ(v.state, HealthState::kQuarantined);
  EXPECT_EQ(v.reason, "2 hard strikes: ecc_uncorrectable, sdc");
}

TEST(JudgeNode, SoftStrikesQuarantineOnlyWithinTheWindow) {
  const NodeHealthOptions o;  // 3 within 24h
  std::vector<Strike> strikes = {StrikeFor("straggler", AtHour(0))};
  NodeVerdict v = JudgeNode(strikes, AtHour(1), o);
  EXPECT_EQ(v.state, HealthState::kSuspect);
  EXPECT_EQ(v.reason, "1 soft strike within 24h (quarantined at 3): straggler");

  strikes.push_back(StrikeFor("hang_suspect", AtHour(10)));
  v = JudgeNode(strikes, AtHour(11), o);
  EXPECT_EQ(v.state, HealthState::kSuspect);
  EXPECT_EQ(v.reason, "2 soft strikes within 24h (quarantined at 3): hang_suspect, straggler");

  strikes.push_back(StrikeFor("straggler", AtHour(20)));
  v = JudgeNode(strikes, AtHour(20), o);
  EXPECT_EQ(v.state, HealthState::kQuarantined);
  EXPECT_EQ(v.reason, "3 soft strikes within 24h: straggler x2, hang_suspect");
}

TEST(JudgeNode, OldSoftStrikesAgeOut) {
  // At hour 24 the first strike is exactly 24h old: still within the window.
  const std::vector<Strike> two = {StrikeFor("straggler", AtHour(0)),
                                   StrikeFor("straggler", AtHour(1))};
  const NodeHealthOptions o2{2, hours(24)};
  EXPECT_EQ(JudgeNode(two, AtHour(24), o2).state, HealthState::kQuarantined);
  EXPECT_EQ(JudgeNode(two, AtHour(24) + 1, o2).state, HealthState::kSuspect);

  const NodeHealthOptions o;
  const std::vector<Strike> strikes = {StrikeFor("straggler", AtHour(0)),
                                       StrikeFor("straggler", AtHour(1)),
                                       StrikeFor("node_lost", AtHour(30))};
  NodeVerdict v = JudgeNode(strikes, AtHour(30), o);
  EXPECT_EQ(v.state, HealthState::kSuspect);
  EXPECT_EQ(v.reason, "1 soft strike within 24h (quarantined at 3): node_lost");
  // Three strikes, never three within a day: not quarantined.
  v = JudgeNode(strikes, AtHour(24 + 30.5), o);
  EXPECT_EQ(v.state, HealthState::kHealthy);
  EXPECT_EQ(v.reason, "3 soft strikes, none within 24h");
  // Unordered input is fine, and a strike stamped after now (a clock ahead)
  // is recent.
  const std::vector<Strike> shuffled = {StrikeFor("straggler", AtHour(50)),
                                        StrikeFor("straggler", AtHour(49)),
                                        StrikeFor("straggler", AtHour(48.5))};
  EXPECT_EQ(JudgeNode(shuffled, AtHour(49.5), o).state, HealthState::kQuarantined);
}

TEST(JudgeNode, OptionsChangeTheThreshold) {
  const std::vector<Strike> one = {StrikeFor("straggler", AtHour(0))};
  NodeVerdict v = JudgeNode(one, AtHour(0), NodeHealthOptions{1, minutes(30)});
  EXPECT_EQ(v.state, HealthState::kQuarantined);
  EXPECT_EQ(v.reason, "1 soft strike within 30m: straggler");
  v = JudgeNode(one, AtHour(1), NodeHealthOptions{1, minutes(30)});
  EXPECT_EQ(v.state, HealthState::kHealthy);
  EXPECT_EQ(v.reason, "1 soft strike, none within 30m");
  std::vector<Strike> week;
  for (int d = 0; d < 5; ++d) week.push_back(StrikeFor("sdc_suspect", AtHour(24 * d)));
  v = JudgeNode(week, AtHour(24 * 5), NodeHealthOptions{5, hours(24 * 7)});
  EXPECT_EQ(v.state, HealthState::kQuarantined);
  EXPECT_EQ(v.reason, "5 soft strikes within 7d: sdc_suspect x5");
}

}  // namespace
}  // namespace endure::core
