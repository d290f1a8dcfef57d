#include "sim/scenario.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/cause.h"

namespace endure::sim {
namespace {

using std::chrono::minutes;
using std::chrono::seconds;
using testing::HasSubstr;

std::string Error(const Status& s) { return s.ok() ? "OK" : s.message(); }

TEST(Scenario, Llama3MixUsesTheCounts) {
  Result<std::vector<CauseSpec>> mix = CauseMix("llama3");
  ASSERT_TRUE(mix.ok());
  double total = 0;
  for (const CauseSpec& c : *mix) total += c.weight;
  EXPECT_EQ(total, 419);  // unexpected interruptions in 54 days
  EXPECT_EQ(mix->front().name, "faulty_gpu");
  EXPECT_EQ(mix->front().weight, 148);

  SimConfig c;
  c.cause_mix = "llama3";
  ASSERT_TRUE(Finalize(c).ok());
  EXPECT_EQ(c.FailureRate(), 3.79);
  EXPECT_EQ(c.causes.size(), 18u);
  EXPECT_EQ(c.policy.paths.at("software_bug"), core::RecoveryPath::kRestartInPlace);
  EXPECT_EQ(c.policy.paths.at("straggler"), core::RecoveryPath::kEvictAndReplace);
}

// The simulator decides with the same cause catalogue as the controller:
// every cause of its mixes is in it, and their classes are the catalogue's.
TEST(Scenario, EveryCauseOfTheMixesIsInTheCatalogue) {
  for (const char* mix : {"none", "llama3"}) {
    Result<std::vector<CauseSpec>> causes = CauseMix(mix);
    ASSERT_TRUE(causes.ok()) << mix;
    for (const CauseSpec& c : *causes)
      EXPECT_TRUE(core::IsCatalogued(c.name)) << mix << ": " << c.name;
  }
  // One name, one meaning: the SDC check's cause and the mix's are both
  // hardware and hard strikes.
  for (const char* sdc : {"sdc", "silent_data_corruption"}) {
    EXPECT_EQ(core::ClassifyCause(sdc), core::CauseClass::kHardware) << sdc;
    EXPECT_EQ(core::StrikeClassOf(sdc), core::StrikeClass::kHard) << sdc;
  }
  EXPECT_TRUE(core::IsCollectiveCause("gloo_error"));
  EXPECT_FALSE(core::IsCollectiveCause("xid_79"));
  EXPECT_EQ(core::StrikeClassOf("xid_79"), core::StrikeClass::kHard);
  EXPECT_EQ(core::StrikeClassOf("xid_119"), core::StrikeClass::kSoft);
  EXPECT_EQ(core::ClassifyCause("xid_119"), core::CauseClass::kHardware);
  EXPECT_EQ(core::ClassifyCause("xid_13"), core::CauseClass::kAmbiguous);
  EXPECT_FALSE(core::IsCatalogued("hca_firmware"));
}

TEST(Scenario, TomlSetsKnobsAndCauses) {
  SimConfig c;
  Status s = LoadScenarioString(R"(
nodes = 2000
ckpt-interval = "20m"
failure-rate = 5.5
cause-mix = "llama3"

[cause.faulty_gpu]
detect = "2m"
repair = "1d"

[cause.cosmic_ray]
weight = 3
path = "restart"
)",
                                "job.toml", c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(Finalize(c).ok());
  EXPECT_EQ(c.nodes, 2000);
  EXPECT_EQ(c.ckpt_interval, minutes(20));
  EXPECT_EQ(c.FailureRate(), 5.5);
  EXPECT_EQ(c.causes.front().detect, minutes(2));
  EXPECT_EQ(c.causes.back().name, "cosmic_ray");
  EXPECT_EQ(c.DetectFor(c.causes.back()), seconds(30));
  EXPECT_EQ(c.Where("nodes"), "job.toml:2: nodes");
}

TEST(Scenario, TomlErrorsNameFileLineAndKey) {
  SimConfig c;
  EXPECT_EQ(Error(LoadScenarioString("nodes = 4\nckpt-intervall = \"5m\"\n", "a.toml", c)),
            "a.toml:2: ckpt-intervall: unknown key (see `endure sim --help` for the settings)");
  EXPECT_THAT(Error(LoadScenarioString("restart = 300\n", "b.toml", c)),
              HasSubstr("b.toml:1: restart: invalid duration '300'"));
  EXPECT_THAT(Error(LoadScenarioString("[cause.x]\nweight = 1\ncolor = 2\n", "c.toml", c)),
              HasSubstr("c.toml:3: cause.x.color: unknown key"));
  EXPECT_THAT(Error(LoadScenarioString("nodes = = 3\n", "d.toml", c)), HasSubstr("d.toml:1:"));

  SimConfig unknown;
  ASSERT_TRUE(LoadScenarioString("\n[cause.gremlins]\ndetect = \"1m\"\n", "e.toml", unknown).ok());
  EXPECT_THAT(Error(Finalize(unknown)),
              HasSubstr("e.toml:2: cause.gremlins: unknown cause 'gremlins' in mix 'none'"));

  // A value from the file that fails a cross-check points at the file.
  SimConfig late;
  ASSERT_TRUE(LoadScenarioString("ckpt-interval = \"5s\"\n", "f.toml", late).ok());
  EXPECT_THAT(Error(Finalize(late)), HasSubstr("f.toml:1: ckpt-interval: 5.0s is shorter"));
}

TEST(Scenario, InvalidFlagsNameTheFlag) {
  SimConfig c;
  EXPECT_THAT(Error(SetKnob(c, "restart", "-5m", "--restart")),
              HasSubstr("--restart: invalid duration '-5m': durations cannot be negative"));
  EXPECT_THAT(Error(SetKnob(c, "nodes", "many", "--nodes")),
              HasSubstr("--nodes: expected an integer"));

  auto finalize_error = [](auto mutate) {
    SimConfig c;
    mutate(c);
    return Error(Finalize(c));
  };
  EXPECT_THAT(
      finalize_error([](SimConfig& c) { ASSERT_TRUE(SetKnob(c, "nodes", "0", "--nodes").ok()); }),
      HasSubstr("--nodes: must be at least 1, got 0"));
  EXPECT_THAT(finalize_error([](SimConfig& c) { c.ckpt_interval = seconds(5); }),
              HasSubstr("--ckpt-interval: 5.0s is shorter than the checkpoint write cost "
                        "(--ckpt-write 10.0s)"));
  EXPECT_THAT(finalize_error([](SimConfig& c) { c.cause_mix = "llama4"; }),
              HasSubstr("--cause-mix: unknown cause mix 'llama4'"));
  EXPECT_THAT(finalize_error([](SimConfig& c) {
                c.path_overrides = {{"gremlins", "evict"}};
              }),
              HasSubstr("--path: unknown cause 'gremlins' (known: node_failure, straggler)"));
  EXPECT_THAT(finalize_error([](SimConfig& c) { c.failure_rate = -1; }),
              HasSubstr("--failure-rate: must not be negative"));
  EXPECT_THAT(finalize_error([](SimConfig& c) { c.duration = Duration(0); }),
              HasSubstr("--duration: must be positive"));
}

TEST(Scenario, IsolationKnobsParseAndCheck) {
  SimConfig c;
  ASSERT_TRUE(LoadScenarioString(R"(
straggler-mitigation = false
health-check = false
sdc-rate = 0.05
sdc-check-every = 200
soft-window = "12h"
)",
                                 "iso.toml", c)
                  .ok());
  ASSERT_TRUE(Finalize(c).ok());
  EXPECT_FALSE(c.straggler_mitigation);
  EXPECT_FALSE(c.health_check);
  EXPECT_EQ(c.sdc_check_every, 200);
  EXPECT_EQ(c.soft_window, std::chrono::hours(12));

  SimConfig b;
  EXPECT_EQ(Error(SetKnob(b, "health-check", "maybe", "--health-check")),
            "--health-check: expected true or false, got 'maybe'");
  EXPECT_EQ(Error(LoadScenarioString("\nmulti-strike = 1\n", "m.toml", b)),
            "m.toml:2: multi-strike: expected true or false, got '1'");

  auto finalize_error = [](std::string_view knob, std::string_view value) {
    SimConfig c;
    Status s = SetKnob(c, knob, value, "--" + std::string(knob));
    if (!s.ok()) return Error(s);
    return Error(Finalize(c));
  };
  EXPECT_THAT(finalize_error("straggler-window", "0"),
              HasSubstr("--straggler-window: must be between 1 and 1000000 steps, got 0"));
  EXPECT_THAT(finalize_error("straggler-theta", "0"),
              HasSubstr("--straggler-theta: must be in (0, 10]"));
  EXPECT_THAT(finalize_error("straggler-factor-max", "1.2"),
              HasSubstr("--straggler-factor-max: must be at least --straggler-factor"));
  EXPECT_THAT(finalize_error("sdc-rate", "-1"), HasSubstr("--sdc-rate: must not be negative"));
  EXPECT_THAT(finalize_error("sdc-check-every", "-5"),
              HasSubstr("--sdc-check-every: must be >= 0 (0: no check), got -5"));
  EXPECT_THAT(finalize_error("sdc-undetected-cost", "-1h"),
              HasSubstr("--sdc-undetected-cost: invalid duration"));
  EXPECT_THAT(finalize_error("soft-strikes", "0"),
              HasSubstr("--soft-strikes: must be between 1 and 1000, got 0"));
  EXPECT_THAT(finalize_error("soft-window", "0s"), HasSubstr("--soft-window: must be positive"));
  EXPECT_THAT(finalize_error("flaky-share", "1.5"), HasSubstr("--flaky-share: a share"));
  EXPECT_THAT(finalize_error("flaky-factor", "0.5"),
              HasSubstr("--flaky-factor: must be at least 1"));
  EXPECT_THAT(finalize_error("health-check-recall", "2"),
              HasSubstr("--health-check-recall: a probability"));
  EXPECT_THAT(finalize_error("straggler-detect", "10m"), HasSubstr("--straggler-detect: unknown"));

  SimConfig file;
  ASSERT_TRUE(LoadScenarioString("nodes = 10\nflaky-share = 3\n", "f.toml", file).ok());
  EXPECT_THAT(Error(Finalize(file)), HasSubstr("f.toml:2: flaky-share: a share between 0 and 1"));
}

TEST(Scenario, PathOverridesReachThePolicy) {
  SimConfig c;
  c.cause_mix = "llama3";
  c.path_overrides = {{"software_bug", "evict"}, {"straggler", "restart"}};
  ASSERT_TRUE(Finalize(c).ok());
  EXPECT_EQ(c.policy.paths.at("software_bug"), core::RecoveryPath::kEvictAndReplace);
  EXPECT_EQ(c.policy.paths.at("straggler"), core::RecoveryPath::kRestartInPlace);
}

TEST(Scenario, ExampleScenarioLoads) {
  SimConfig c;
  Status s = LoadScenarioFile(ENDURE_SCENARIO_DIR "/llama3-16k.toml", c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(Finalize(c).ok());
  EXPECT_EQ(c.nodes, 2048);
  EXPECT_EQ(c.spares, 16);
  EXPECT_EQ(c.policy.paths.at("dependency"), core::RecoveryPath::kWaitForRepair);
}

}  // namespace
}  // namespace endure::sim
