#include "controller/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "core/cause.h"
#include "core/job_machine.h"

namespace endure::controller {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The value of the one series of `text` whose name and labels are exactly
// `series` (e.g. `endure_nodes{state="member"}`); NaN when absent.
double Value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::nan("");
}

// Two nodes of two ranks, driven as the shell drives the machine: a crash of
// rank 3 at step 5, a full restart from scratch, training again.
class JobMetricsTest : public ::testing::Test {
 protected:
  JobMetricsTest() : machine_(Options(), {}, core::At(Duration(0))) {}

  static core::JobMachineOptions Options() {
    core::JobMachineOptions o;
    o.nodes = 2;
    o.ranks_per_node = 2;
    o.recovery.backoff_initial = Duration(0);
    o.in_process = false;
    return o;
  }
  std::vector<core::JobAction> Step(const core::JobEvent& e) {
    return machine_.Step(
        e, core::At(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(now_))));
  }
  void Run(int64_t from, int64_t to) {
    for (int64_t s = from; s <= to; ++s) {
      now_ += 0.5;
      for (int r = 0; r < 4; ++r) {
        core::StepEnd end{machine_.generation(), core::Rank{r}, core::StepNumber{s}, 2.0};
        end.compute_s = r == 3 ? 0.12 : 0.1;  // rank 3 (node1) is the slowest, not a straggler
        Step(end);
      }
    }
  }
  void Ready(int64_t step) {
    for (int r = 0; r < 4; ++r) {
      Step(core::WorkerReady{machine_.generation(), core::Rank{r}, core::StepNumber{step}, 0.1});
    }
  }
  std::string Scrape() {
    const LiveTables tables = BuildLiveTables(machine_, core::At(Duration(0)), inputs_);
    metrics_.Update(machine_, {{"tokens_per_s", 1000.0}}, {-1, now_, 0});
    metrics_.UpdateNodes(tables);
    return metrics_.Text();
  }

  core::JobMachine machine_;
  LiveInputs inputs_;
  JobMetrics metrics_{"demo", 3};
  double now_ = 0;
};

TEST_F(JobMetricsTest, AnIncidentIsCountedOnceByCauseAndItsRestartByRouteWhenItRecovers) {
  Step(core::NodeUp{core::NodeId{0}, "node0", 2});
  Step(core::NodeUp{core::NodeId{1}, "node1", 2});
  Ready(0);
  Run(1, 5);
  std::string text = Scrape();
  EXPECT_EQ(Value(text, "endure_build_info{revision=\"" ENDURE_TEST_REVISION
                        "\",version=\"" ENDURE_TEST_VERSION "\"}"),
            1)
      << text;
  EXPECT_EQ(Value(text, "endure_job_info{name=\"demo\",run=\"3\"}"), 1);
  EXPECT_EQ(Value(text, "endure_phase{phase=\"running\"}"), 1);
  EXPECT_EQ(Value(text, "endure_phase{phase=\"done\"}"), 0);
  EXPECT_EQ(Value(text, "endure_step"), 5);
  EXPECT_EQ(Value(text, "endure_nodes{state=\"member\"}"), 2);
  EXPECT_EQ(Value(text, "endure_nodes{state=\"spare\"}"), 0);
  // Every catalogued cause and every route starts at zero.
  EXPECT_EQ(Value(text, "endure_incidents_total{cause=\"node_lost\"}"), 0);
  EXPECT_EQ(Value(text, "endure_incidents_total{cause=\"worker_exit\"}"), 0);
  EXPECT_EQ(Value(text, "endure_incidents_total{cause=\"signal_sigkill\"}"), 0);
  EXPECT_EQ(Value(text, "endure_restarts_total{route=\"in_process\"}"), 0);

  now_ += 1;
  Step(core::WorkerExitEvent{machine_.generation(), core::Rank{3}, core::NodeId{1}, 1,
                             std::nullopt});
  text = Scrape();
  const std::string cause = core::CauseLabel(machine_.incidents().at(0).cause.name);
  EXPECT_EQ(cause, "worker_exit");  // "worker_exit code 1", folded
  EXPECT_EQ(Value(text, "endure_incidents_total{cause=\"" + cause + "\"}"), 1) << text;
  EXPECT_EQ(Value(text, "endure_detection_seconds_count"), 1);
  EXPECT_EQ(Value(text, "endure_recovery_seconds_count"), 0);  // not yet recovered
  EXPECT_EQ(Value(text, "endure_restarts_total{route=\"full_restart\"}"), 0);

  now_ += 1;
  Step(core::GenerationStoppedEvent{machine_.generation(), core::NodeId{0}});
  Step(core::GenerationStoppedEvent{machine_.generation(), core::NodeId{1}});
  Ready(0);
  // Relaunched, not yet recovered: the restart counts now, the recovery
  // when its first step ends (it was never observed when the restart came
  // first).
  ASSERT_TRUE(machine_.incidents().at(0).relaunched_at.has_value());
  ASSERT_FALSE(machine_.incidents().at(0).recovered_at.has_value());
  text = Scrape();
  EXPECT_EQ(Value(text, "endure_restarts_total{route=\"full_restart\"}"), 1) << text;
  EXPECT_EQ(Value(text, "endure_recovery_seconds_count"), 0);
  Run(1, 3);
  ASSERT_TRUE(machine_.incidents().at(0).recovered_at.has_value());
  text = Scrape();
  text = Scrape();  // a second scrape counts nothing again
  EXPECT_EQ(Value(text, "endure_incidents_total{cause=\"" + cause + "\"}"), 1);
  EXPECT_EQ(Value(text, "endure_restarts_total{route=\"full_restart\"}"), 1) << text;
  EXPECT_EQ(Value(text, "endure_restarts_total{route=\"in_process\"}"), 0);
  EXPECT_EQ(Value(text, "endure_recovery_seconds_count"), 1);
  EXPECT_EQ(Value(text, "endure_detection_seconds_count"), 1);
  EXPECT_EQ(Value(text, "endure_steps_lost_total"), 5);  // from scratch: steps 1..5 again
}

TEST_F(JobMetricsTest, EachMemberNodeHasItsStepTimeAndSlowestRankAndEachNodeItsTiers) {
  Step(core::NodeUp{core::NodeId{0}, "node0", 2});
  Step(core::NodeUp{core::NodeId{1}, "node1", 2});
  Ready(0);
  Run(1, 12);
  inputs_.tiers["node1"] = {1 << 20, 2 << 20, 10};
  const std::string text = Scrape();
  EXPECT_NEAR(Value(text, "endure_node_step_seconds{node=\"node0\"}"), 0.1, 1e-9) << text;
  EXPECT_NEAR(Value(text, "endure_node_step_seconds{node=\"node1\"}"), 0.11, 1e-9);
  EXPECT_NEAR(Value(text, "endure_node_slowest_rank_step_seconds{node=\"node1\"}"), 0.12, 1e-9);
  EXPECT_NEAR(Value(text, "endure_step_seconds_median"), 0.1, 1e-9);
  EXPECT_EQ(Value(text, "endure_slowest_rank"), 3);
  EXPECT_NEAR(Value(text, "endure_slowest_rank_step_seconds"), 0.12, 1e-9);
  EXPECT_EQ(Value(text, "endure_tier_bytes{node=\"node1\",tier=\"T1\"}"), 2 << 20);
  EXPECT_EQ(Value(text, "endure_tier_bytes{node=\"node0\",tier=\"T0\"}"), 0);
  EXPECT_THAT(text, HasSubstr("# TYPE endure_incidents_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE endure_detection_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("# TYPE endure_ledger_seconds gauge"));
}

TEST_F(JobMetricsTest, TheSlowestRanksAreTheOutliersAndTheHeatmapBandsTheNodes) {
  Step(core::NodeUp{core::NodeId{0}, "node0", 2});
  Step(core::NodeUp{core::NodeId{1}, "node1", 2});
  Ready(0);
  Run(1, 12);
  const LiveTables tables = BuildLiveTables(machine_, core::At(Duration(0)), inputs_);
  ASSERT_FALSE(tables.outliers.empty());
  EXPECT_EQ(tables.outliers[0]["rank"], 3);
  EXPECT_EQ(tables.outliers[0]["node"], "node1");
  EXPECT_NEAR(tables.outliers[0]["vs_median"].get<double>(), 1.2, 1e-9);
  EXPECT_EQ(tables.nodes_by_state[static_cast<int>(NodeState::kMember)], 2);
  EXPECT_EQ(tables.nodes[1]["slowest_rank"], 3);
  StepHeat heat;
  heat.Add(1, tables);
  heat.Add(2, tables);
  const nlohmann::json j = heat.ToJson();
  ASSERT_EQ(j["bands"].size(), 2u);  // two nodes: a band each
  EXPECT_EQ(j["bands"][1]["from"], "node1");
  ASSERT_EQ(j["band_max_s"].size(), 2u);
  EXPECT_NEAR(j["band_max_s"][1][1].get<double>(), 0.11, 1e-9);
  EXPECT_NEAR(j["median_s"][0].get<double>(), 0.1, 1e-9);
}

}  // namespace
}  // namespace endure::controller
