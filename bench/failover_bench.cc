// The controller's own failures, printed as figures:
//  1. the journal's cost per input: each input the controller feeds its
//     decision core is one SQLite transaction (WAL, synchronous = NORMAL) in
//     STATE_DIR/controller.db, with the ledger saved in it now and then;
//  2. replay time against journal length: a fresh JobMachine fed the
//     journal of a 2-node job (heartbeats, steps, a crash every 500 steps),
//     decoding included, as a restarted controller does;
//  3. time from the controller's death (SIGKILL) to the next productive
//     step it sees, under `endure run` on a small 2-node job: `endure run`
//     restarts it, it replays its journal, the agents resume into it (their
//     workers never stopped). With `[control_plane] standby = true` too,
//     when this endure supports it: the standby takes over through etcd.
//
//   build/bin/failover_bench [WORK_DIR] [KILL_RUNS]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "controller/state_store.h"
#include "core/job_codec.h"
#include "core/job_machine.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using namespace endure;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string BinDir() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return fs::path(std::string(exe, n > 0 ? static_cast<size_t>(n) : 0)).parent_path().string();
}

// The inputs of a 2-node job of `steps` steps, 0.1 s apart: heartbeats,
// step ends, a checkpoint every 10 steps, a crash and its recovery every
// 500 steps; as (time, line).
std::vector<std::pair<core::TimePoint, std::string>> JobInputs(int64_t steps) {
  std::vector<std::pair<core::TimePoint, std::string>> out;
  double t = 0;
  auto add = [&](const core::JobEvent& e) {
    out.emplace_back(core::At(FromSeconds(t)), core::EncodeEvent(e));
  };
  add(core::NodeUp{core::NodeId{0}, "node0", 1});
  add(core::NodeUp{core::NodeId{1}, "node1", 1});
  int generation = 0;
  for (int64_t s = 1; s <= steps; ++s) {
    t += 0.1;
    add(core::NodeHeartbeat{core::NodeId{0}});
    add(core::NodeHeartbeat{core::NodeId{1}});
    const core::Generation g{generation};
    for (int r = 0; r < 2; ++r) {
      add(core::StepEnd{g, core::Rank{r}, core::StepNumber{s}, 2.0 + 1.0 / static_cast<double>(s),
                        0.001, core::StepNumber{r == 0 && s % 10 == 0 ? s : -1}, false});
    }
    add(core::Tick{});
    if (s % 500 == 0) {
      add(core::WorkerExitEvent{g, core::Rank{1}, core::NodeId{1}, std::nullopt, 9, "",
                                std::nullopt, "", ""});
      add(core::GenerationStoppedEvent{g, core::NodeId{0}});
      add(core::GenerationStoppedEvent{g, core::NodeId{1}});
      ++generation;
    }
  }
  return out;
}

core::JobMachineOptions MachineOptions() {
  core::JobMachineOptions o;
  o.nodes = 2;
  o.recovery.backoff_initial = Duration(0);
  o.recovery.max_restarts_in_window = 0;  // unlimited
  return o;
}

void JournalCost(const fs::path& dir) {
  std::printf("== journal: one SQLite transaction per input (WAL, synchronous = NORMAL)\n");
  fs::remove_all(dir);
  fs::create_directories(dir);
  Result<controller::StateStore> store =
      controller::StateStore::Open(controller::StateStore::PathIn(dir.string()));
  if (!store.ok() || !store->BeginRun({"bench", "", "", 0, {}, {}, "", ""}).ok()) {
    std::fprintf(stderr, "failover_bench: cannot open %s\n", dir.c_str());
    std::exit(1);
  }
  const auto inputs = JobInputs(400);
  core::EttrLedger ledger(core::At(Duration(0)));
  const Clock::time_point start = Clock::now();
  int64_t seq = 0;
  for (const auto& [at, line] : inputs) {
    bool ok = store->BeginTransaction().ok();
    ok = ok && store->AppendJournal({++seq, at - core::At(Duration(0)), line}).ok();
    // The ledger goes with an input about once a second (10 steps here).
    if (seq % 50 == 0) ok = ok && store->SaveLedger(ledger).ok();
    ok = ok && store->CommitTransaction().ok();
    if (!ok) {
      std::fprintf(stderr, "failover_bench: journaling failed\n");
      std::exit(1);
    }
  }
  const double s = Since(start);
  std::printf("%zu inputs in %.3f s: %.1f us per input (%.0f inputs/s)\n\n", inputs.size(), s,
              1e6 * s / static_cast<double>(inputs.size()), static_cast<double>(inputs.size()) / s);
}

void ReplayTime() {
  std::printf("== replay: a fresh JobMachine fed the journal (decoding included)\n");
  std::printf("%10s %10s %12s %12s %10s\n", "steps", "inputs", "replay_ms", "us_per_input",
              "incidents");
  for (int64_t steps : {1'000, 10'000, 100'000}) {
    const auto inputs = JobInputs(steps);
    const Clock::time_point start = Clock::now();
    core::JobMachine m(MachineOptions(), {}, core::At(Duration(0)));
    for (const auto& [at, line] : inputs) {
      Result<core::JobEvent> e = core::DecodeEvent(line);
      if (!e.ok()) std::exit(1);
      m.Step(*e, at);
    }
    const double s = Since(start);
    std::printf("%10lld %10zu %12.1f %12.2f %10zu\n", static_cast<long long>(steps), inputs.size(),
                1e3 * s, 1e6 * s / static_cast<double>(inputs.size()), m.incidents().size());
  }
  std::printf("\n");
}

nlohmann::json ReadJson(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, false);
}

std::vector<pid_t> Controllers(const std::string& spec) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(entry.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(" controller ") != std::string::npos && cmd.find(spec) != std::string::npos) {
      out.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return out;
}

// Kill -9 of the (leading) controller at step 20 of the job; the time
// until a controller reports a step past the one it died at. -1 on failure.
double KillToNextStep(const fs::path& dir, const std::string& name, bool standby) {
  const fs::path spec = dir / (name + ".toml");
  const fs::path state = dir / name;
  std::ofstream(spec) << "[job]\nname = \"" << name << "\"\n"
                      << "command = [\"" << BinDir() << "/endure-train\", \"--steps\", \"80\", "
                      << "\"--layers\", \"2\", \"--d-model\", \"64\", \"--context\", \"64\", "
                      << "\"--global-batch\", \"16\", \"--micro-batch\", \"8\", "
                      << "\"--log-every\", \"50\", \"--sample-tokens\", \"0\"]\n"
                      << "nodes = 2\nranks_per_node = 1\nstate_dir = \"" << state.string()
                      << "\"\n[checkpoint]\nevery_steps = 10\n"
                      << (standby ? "[control_plane]\nstandby = true\n" : "");
  fs::remove_all(state);
  auto run =
      endure::Subprocess::Start({.argv = {BinDir() + "/endure", "run", spec.string(), "--quiet"},
                                 .output_path = (dir / (name + ".out")).string()});
  if (!run.ok()) return -1;
  const Clock::time_point deadline = Clock::now() + 120s;
  int64_t step = 0;
  while (Clock::now() < deadline && step < 20) {
    std::this_thread::sleep_for(10ms);
    nlohmann::json s = ReadJson(state / "status.json");
    if (s.is_object()) step = s.value("step", int64_t{0});
  }
  // With a standby both controllers run; the first started leads.
  std::vector<pid_t> pids = Controllers(spec.string());
  if (step < 20 || pids.empty()) {
    (void)run->Wait();
    return -1;
  }
  std::sort(pids.begin(), pids.end());
  // Each controller writes its own HTTP address when it starts: a new one
  // in http.addr is the new controller, and the step its first status says
  // is the one it replayed. The next step past that is one the agents sent it.
  auto http = [&] {
    std::ifstream f(state / "http.addr");
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string old_http = http();
  const Clock::time_point killed = Clock::now();
  ::kill(pids.front(), SIGKILL);
  double up = -1, seen = -1;
  int64_t replayed = -1;
  while (Clock::now() < killed + 120s && seen < 0) {
    std::this_thread::sleep_for(2ms);
    const std::string now_http = http();
    if (replayed < 0 && !now_http.empty() && now_http != old_http) {
      nlohmann::json s = ReadJson(state / "status.json");
      if (!s.is_object()) continue;
      replayed = s.value("step", int64_t{0});
      up = Since(killed);
    } else if (replayed >= 0) {
      nlohmann::json s = ReadJson(state / "status.json");
      if (s.is_object() && s.value("step", int64_t{0}) > replayed) seen = Since(killed);
    }
  }
  const endure::ExitStatus exit = run->Wait();
  nlohmann::json report = ReadJson(state / "report.json");
  if (!exit.Success() || !report.is_object()) return -1;
  std::printf(
      "  %-8s kill at step %3lld: new controller up after %.3f s (replayed up to step "
      "%lld), next step after %.3f s; generations %d, incidents %zu\n",
      standby ? "standby" : "restart", static_cast<long long>(step), up,
      static_cast<long long>(replayed), seen, report.value("generations", 0),
      report["incidents"].size());
  return seen;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = argc > 1 ? argv[1] : "/tmp/endure_failover_bench";
  const int runs = std::max(1, argc > 2 ? std::atoi(argv[2]) : 3);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // figures as they come
  fs::create_directories(dir);
  JournalCost(dir / "journal");
  ReplayTime();

  std::printf(
      "== controller SIGKILLed at step 20 of a 2-node job: time to the next step it sees\n");
  for (bool standby : {false, true}) {
    std::vector<double> seen;
    for (int i = 0; i < runs; ++i) {
      const double s = KillToNextStep(
          dir, std::string(standby ? "standby" : "restart") + std::to_string(i), standby);
      if (s < 0) {
        std::printf("  %s: run %d failed (see %s)\n", standby ? "standby" : "restart", i,
                    dir.c_str());
        break;
      }
      seen.push_back(s);
    }
    if (!seen.empty()) {
      std::printf("%s: median %.3f s over %zu runs\n", standby ? "standby" : "restart",
                  Median(seen), seen.size());
    }
  }
  return 0;
}
