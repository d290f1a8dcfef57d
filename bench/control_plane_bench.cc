// Checkpoint stall and controller takeover of `endure run` on the demo job (4
// layers, d-model 128, 2 nodes x 1 rank), printed as figures:
//  1. checkpoint stall as a share of step time when saving every step: into
//     node memory (Endure's tiers, persisted every 20 steps) and, in the same
//     run, synchronously to disk inside the step (`memory = false`, as
//     torch.save does);
//  2. with [control_plane] standby (needs /usr/bin/etcd), the time from the
//     leader controller's kill -9 to each agent's attachment to the standby
//     (the agent's own measure of its outage; its registration follows on
//     the same stream), for two lease lengths.
// The recovery of killed ranks and lost nodes, by every route and against
// torchrun, and ETTR under a Poisson schedule of kills: bench/recovery_bench.py.
//
//   build/bin/control_plane_bench [WORK_DIR]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
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

std::string ReadFile(const fs::path& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The demo job with a standby controller and a `lease`, its leader killed
// at step 30: each node's outage until it was attached to the new leader
// (seconds), from its agent's log; empty if the run failed.
std::vector<double> TakeoverAfterLeaderKill(const fs::path& dir, int lease_s) {
  const std::string name = "takeover-" + std::to_string(lease_s) + "s";
  const fs::path spec = dir / (name + ".toml");
  const fs::path state = dir / name;
  std::ofstream(spec) << "[job]\nname = \"" << name << "\"\n"
                      << "command = [\"" << BinDir() << "/endure-train\", \"--steps\", \"80\", "
                      << "\"--log-every\", \"20\", \"--sample-tokens\", \"0\"]\n"
                      << "nodes = 2\nranks_per_node = 1\nstate_dir = \"" << state.string()
                      << "\"\n[checkpoint]\n"
                      << kTiers << "[control_plane]\nstandby = true\nlease = \"" << lease_s
                      << "s\"\n";
  fs::remove_all(state);
  auto p =
      endure::Subprocess::Start({.argv = {BinDir() + "/endure", "run", spec.string(), "--quiet"},
                                 .output_path = (dir / (name + ".out")).string()});
  if (!p.ok()) return {};
  // Step 30, then the leader: the controller `endure run` waited for (the
  // one with --address-file; the standby has none).
  for (int i = 0; i < 6000; ++i) {
    nlohmann::json s = nlohmann::json::parse(ReadFile(state / "status.json"), nullptr, false);
    if (s.is_object() && s.value("step", int64_t{0}) >= 30) break;
    if (p->WaitFor(std::chrono::milliseconds(50))) return {};
  }
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::string cmdline = ReadFile(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(" controller ") != std::string::npos &&
        cmdline.find(spec.string()) != std::string::npos &&
        cmdline.find("--address-file") != std::string::npos) {
      ::kill(std::stoi(entry.path().filename().string()), SIGKILL);
    }
  }
  if (!p->Wait().Success()) return {};
  const std::regex reconnected("reconnected to the controller after ([0-9.]+)(ms|s)");
  std::vector<double> outages;
  for (const char* node : {"node0", "node1"}) {
    const std::string log = ReadFile(state / "nodes" / node / "agent.log");
    std::smatch m;
    if (!std::regex_search(log, m, reconnected)) return {};
    outages.push_back(std::stod(m[1]) / (m[2] == "ms" ? 1000.0 : 1.0));
  }
  return outages;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = argc > 1 ? argv[1] : "/tmp/endure_control_plane_bench";
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

  if (!fs::exists("/usr/bin/etcd")) {
    std::printf("\n== standby takeover: skipped (no /usr/bin/etcd; install etcd-server)\n");
    return 0;
  }
  std::printf(
      "\n== standby takeover: the leader controller kill -9'd at step 30 of 80 "
      "([control_plane] standby)\n");
  std::printf("%8s %14s %14s\n", "lease_s", "node0_moved_s", "node1_moved_s");
  for (int lease_s : {2, 5}) {
    const std::vector<double> moved = TakeoverAfterLeaderKill(dir, lease_s);
    if (moved.size() != 2) {
      std::fprintf(stderr, "control_plane_bench: the takeover run (lease %d s) failed; see %s\n",
                   lease_s, dir.c_str());
      return 1;
    }
    std::printf("%8d %14.2f %14.2f\n", lease_s, moved[0], moved[1]);
  }
  return 0;
}
