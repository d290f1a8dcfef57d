// Checkpoint stall, recovery and ETTR of `endure run` on the demo job (4
// layers, d-model 128, 2 nodes x 1 rank), printed as figures:
//  1. checkpoint stall as a share of step time when saving every step: into
//     node memory (Endure's tiers, persisted every 20 steps) and, in the same
//     run, synchronously to disk inside the step (`memory = false`, as
//     torch.save does);
//  2. time to recover from a SIGKILLed rank (fault to the first productive
//     step after it), split into detection, teardown, relaunch and restore
//     (from T0, node memory), over several runs;
//  3. ETTR of about five minutes of training under a seeded Poisson schedule
//     of rank kills with a 60 s MTBF.
//
//   build/bin/control_plane_bench [WORK_DIR] [KILL_RUNS] [ETTR_SECONDS]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/subprocess.h"

namespace fs = std::filesystem;

namespace {

std::string BinDir() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return fs::path(std::string(exe, n > 0 ? static_cast<size_t>(n) : 0)).parent_path().string();
}

// Every step into node memory, every 20th step to disk.
constexpr char kTiers[] = "every_steps = 1\npersist_every_steps = 20\n";

nlohmann::json RunJob(const fs::path& dir, const std::string& name, int64_t steps,
                      const std::string& faults, const std::string& checkpoint = kTiers) {
  const fs::path spec = dir / (name + ".toml");
  std::ofstream(spec) << "[job]\nname = \"" << name << "\"\n"
                      << "command = [\"" << BinDir() << "/endure-train\", \"--steps\", \"" << steps
                      << "\", \"--log-every\", \"20\", \"--sample-tokens\", \"0\"]\n"
                      << "nodes = 2\nranks_per_node = 1\nstate_dir = \"" << (dir / name).string()
                      << "\"\n[checkpoint]\n"
                      << checkpoint
                      << "[recovery]\nwarm_standby = true\n"
                      // Kills hit random ranks of 2 nodes, so the same node
                      // fails again soon; isolating it is for real clusters.
                      << "evict_node_after = 0\n"
                      << faults;
  fs::remove_all(dir / name);
  auto p =
      endure::Subprocess::Start({.argv = {BinDir() + "/endure", "run", spec.string(), "--quiet"},
                                 .output_path = (dir / (name + ".out")).string()});
  if (!p.ok() || !p->Wait().Success()) {
    std::fprintf(stderr, "control_plane_bench: %s failed; see %s\n", name.c_str(),
                 (dir / (name + ".out")).c_str());
    std::exit(1);
  }
  std::ifstream f(dir / name / "report.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = argc > 1 ? argv[1] : "/tmp/endure_control_plane_bench";
  const int runs = std::max(1, argc > 2 ? std::atoi(argv[2]) : 3);
  const double ettr_seconds = argc > 3 ? std::atof(argv[3]) : 300;
  fs::create_directories(dir);

  std::printf("== checkpoint stall, saving every step (300 steps, no faults)\n");
  std::printf("%-34s %10s %12s %12s\n", "mode", "step_ms", "stall_ms", "stall_share");
  double stall_share[2] = {0, 0};
  for (int sync = 0; sync < 2; ++sync) {
    nlohmann::json r = RunJob(dir, sync ? "stall-sync" : "stall-tiers", 300, "",
                              sync ? "every_steps = 1\nmemory = false\n" : std::string(kTiers));
    const double productive = r["ledger_s"]["productive"].get<double>();
    const double stall = r["ledger_s"].value("checkpoint_stall", 0.0);
    const double steps = r["steps"].get<double>();
    stall_share[sync] = stall / (productive + stall);
    std::printf("%-34s %10.1f %12.2f %11.2f%%\n",
                sync ? "synchronous to disk (baseline)" : "Endure: T0 copy (+T1, T2 behind)",
                (productive + stall) / steps * 1e3, stall / steps * 1e3, 100 * stall_share[sync]);
  }
  std::printf("stall ratio synchronous / Endure: %.0fx\n\n",
              stall_share[0] > 0 ? stall_share[1] / stall_share[0] : 0.0);

  std::printf("== time to recover from a killed rank (kill at step 50, checkpoints every step)\n");
  std::printf("%4s %10s %10s %10s %10s %10s %10s %6s\n", "run", "recover_s", "detect_s",
              "teardown_s", "relaunch_s", "restore_s", "step_ms", "lost");
  std::vector<double> recover, detect, teardown, relaunch, restore;
  double step_s = 0;
  for (int i = 0; i < runs; ++i) {
    nlohmann::json r = RunJob(dir, "kill" + std::to_string(i), 70,
                              "[[faults]]\nkind = \"kill\"\nrank = 1\nstep = 50\n");
    const nlohmann::json& inc = r["incidents"].at(0);
    recover.push_back(inc["recovered_after_s"]);
    detect.push_back(inc["detected_after_s"]);
    teardown.push_back(inc["teardown_s"]);
    relaunch.push_back(inc["relaunch_s"]);
    restore.push_back(inc["restore_s"]);
    step_s = r["ledger_s"]["productive"].get<double>() / r["steps"].get<double>();
    std::printf("%4d %10.3f %10.3f %10.3f %10.3f %10.3f %10.1f %6d\n", i + 1, recover.back(),
                detect.back(), teardown.back(), relaunch.back(), restore.back(), step_s * 1e3,
                inc["steps_lost"].get<int>());
  }
  std::printf("%4s %10.3f %10.3f %10.3f %10.3f %10.3f\n", "med", Median(recover), Median(detect),
              Median(teardown), Median(relaunch), Median(restore));

  const int64_t steps = std::max<int64_t>(100, static_cast<int64_t>(ettr_seconds / step_s));
  std::printf(
      "\n== ETTR under a Poisson schedule of rank kills, MTBF 60s, seed 1 "
      "(%lld steps, about %.0f s)\n",
      static_cast<long long>(steps), ettr_seconds);
  nlohmann::json r = RunJob(dir, "poisson", steps,
                            "[faults_schedule]\nmtbf = \"60s\"\nseed = 1\nkind = \"kill\"\n"
                            "horizon = \"" +
                                std::to_string(static_cast<int>(ettr_seconds)) + "s\"\n");
  std::printf("wall %.1f s, incidents %zu, ETTR %.3f\n", r["wall_s"].get<double>(),
              r["incidents"].size(), r["ettr"].get<double>());
  for (const auto& [category, seconds] : r["ledger_s"].items()) {
    std::printf("  %-17s %8.1f s\n", category.c_str(), seconds.get<double>());
  }
  return 0;
}
