// The controller at scale (issue 24): `endure controller` started as in
// production, and 500 simulated agents of 8 ranks each (4,000 ranks, 4,000
// step reports a second) attached over the real gRPC protocol, plus a
// spare. Through a steady window no node is lost and no incident is made,
// the live status is never more than a step behind what the agents
// reported, and a member whose stream closes is answered with the next
// generation (the spare in its place). The figures at larger scales are
// controller_load_bench's (make bench).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "common/subprocess.h"
#include "tests/support/simulated_agents.h"
#include "tests/support/test_support.h"

namespace endure {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using loadgen::SimulatedAgents;
using testing_support::ReadAll;
using testing_support::ScratchDir;

constexpr int kNodes = 500;
constexpr char kToken[] = "scale-test-token";

std::optional<nlohmann::json> ReadStatus(const fs::path& state) {
  std::ifstream in(state / "status.json");
  if (!in) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

TEST(ControllerScale, FiveHundredNodesOfEightRanksRunSteadyAndAClosedStreamIsReplaced) {
  ScratchDir dir("endure_controller_scale");
  const fs::path state = dir.Path("state");
  const std::string spec = dir.Path("job.toml");
  std::ofstream(spec) << "[job]\nname = \"scale\"\ncommand = [\"/bin/true\"]\nnodes = " << kNodes
                      << "\nranks_per_node = " << loadgen::kSlotsPerAgent << "\nstate_dir = \""
                      << state.string() << "\"\n";
  const std::string address_file = dir.Path("controller.addr");
  Result<Subprocess> controller = Subprocess::Start(
      {.argv = {ENDURE_BIN, "controller", "--spec", spec, "--address-file", address_file},
       .env = {{"ENDURE_TOKEN", kToken}},
       .output_path = dir.Path("controller.log"),
       .die_with_parent = true});
  ASSERT_TRUE(controller.ok()) << controller.status().ToString();
  std::string address;
  for (int i = 0; i < 3000 && address.empty(); ++i) {
    std::ifstream in(address_file);
    std::getline(in, address);
    if (address.empty()) std::this_thread::sleep_for(10ms);
  }
  ASSERT_FALSE(address.empty()) << ReadAll(dir.Path("controller.log"));
  {
    SimulatedAgents agents(address, kToken, kNodes + 1, 1s);
    ASSERT_TRUE(agents.WaitStart(-1, 120s)) << "generation 0 never started";
    // The steady window: every rank reports a step a second.
    std::this_thread::sleep_for(3s);
    double worst_behind = 0;
    int64_t applied = 0;
    for (int i = 0; i < 20; ++i) {
      std::this_thread::sleep_for(1s);
      std::optional<nlohmann::json> status = ReadStatus(state);
      ASSERT_TRUE(status.has_value());
      EXPECT_EQ((*status)["incidents"], 0) << status->dump();
      EXPECT_EQ((*status)["generation"], 0);
      applied = (*status)["step"].get<int64_t>();
      worst_behind = std::max(worst_behind, agents.Behind(applied));
    }
    std::printf(
        "steady window: applied step %lld, worst %.2f s behind the agents, the load "
        "generator at most %.0f ms late\n",
        static_cast<long long>(applied), worst_behind, agents.worst_lateness_ms());
    EXPECT_GE(applied, 18) << "the job steps";
    // One step of 1 s, and the live status's own 250 ms.
    EXPECT_LE(worst_behind, 1.25) << "the controller fell behind the agents";
    EXPECT_LT(agents.worst_lateness_ms(), 1000) << "the load generator itself fell behind";

    // A member's stream closes: it is lost after the stream grace, and the
    // next generation starts with the spare.
    const std::vector<int> members = agents.started_agents();
    ASSERT_EQ(members.size(), static_cast<size_t>(kNodes));
    agents.ForgetStarts();
    agents.agent(members.front()).Close();
    ASSERT_TRUE(agents.WaitStart(0, 60s)) << "no next generation after a closed stream";
    std::optional<nlohmann::json> status;
    for (int i = 0; i < 100; ++i) {
      status = ReadStatus(state);
      if (status && (*status)["incidents"] == 1) break;
      std::this_thread::sleep_for(50ms);
    }
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ((*status)["incidents"], 1);
    EXPECT_EQ((*status)["last_incident"].get<std::string>().rfind("node_lost", 0), 0u)
        << status->dump();
  }
  controller->Signal(SIGTERM);
  const ExitStatus exit = controller->Wait();
  EXPECT_FALSE(exit.exited && exit.code != 0 && exit.code != 128 + SIGTERM) << exit.ToString();
}

}  // namespace
}  // namespace endure
