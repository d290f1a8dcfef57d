// `endure run` end to end: a controller, one agent per node and real
// endure-train workers on 127.0.0.1. For each injected fault kind the job
// completes every step, ends with the parameters of a failure-free run, and
// the incident names the right cause. Also: hang detection latency, spec
// errors (exit 2 with file, line and key), and an agent without the job
// token being refused.
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/subprocess.h"
#include "tests/support/test_support.h"

namespace endure {
namespace {

using testing_support::ReadAll;

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct JobResult {
  ExitStatus exit;
  std::string output;
  nlohmann::json report;
};

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_control_plane_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A 2-node job of 30 steps with checkpoints every 5 (or the `checkpoint`
  // section given), plus `extra` TOML.
  std::string Spec(const std::string& name, const std::string& extra,
                   const std::string& recovery = "",
                   const std::string& checkpoint = "every_steps = 5\n") {
    std::ostringstream s;
    s << "[job]\nname = \"" << name << "\"\n"
      << "command = [\"" << ENDURE_TRAIN_BIN << "\", \"--steps\", \"30\", \"--layers\", \"2\", "
      << "\"--d-model\", \"64\", \"--context\", \"64\", \"--global-batch\", \"16\", "
      << "\"--micro-batch\", \"8\", \"--threads\", \"1\", \"--log-every\", \"5\", "
      << "\"--eval-batches\", \"1\", \"--sample-tokens\", \"16\", "
      << "\"--data\", \"/usr/share/games/fortunes\"]\n"
      << "nodes = 2\nranks_per_node = 1\nstate_dir = \"" << (dir_ / name).string() << "\"\n"
      << "[checkpoint]\n"
      << checkpoint << "[recovery]\nrepair_delay = \"1s\"\nbackoff_initial = \"0s\"\n"
      << recovery << extra;
    const fs::path path = dir_ / (name + ".toml");
    std::ofstream(path) << s.str();
    return path.string();
  }

  JobResult Run(const std::string& spec_path) {
    const fs::path out = dir_ / (fs::path(spec_path).stem().string() + ".out");
    auto p = Subprocess::Start(
        {.argv = {ENDURE_BIN, "run", spec_path, "--quiet"}, .output_path = out.string()});
    JobResult r;
    std::optional<ExitStatus> e = p->WaitFor(300s);
    if (!e) {
      p->Signal(SIGINT);
      e = p->Wait();
    }
    r.exit = *e;
    r.output = ReadAll(out);
    const std::string state = fs::path(spec_path).replace_extension("").string();
    const std::string report = ReadAll(fs::path(state) / "report.json");
    r.report = nlohmann::json::parse(report.empty() ? "{}" : report, nullptr, false);
    return r;
  }

  // The fingerprint of the same job without faults, computed once.
  static std::string Reference(ControlPlaneTest* t) {
    static std::string fingerprint;
    if (fingerprint.empty()) {
      JobResult r = t->Run(t->Spec("reference", ""));
      EXPECT_TRUE(r.exit.Success()) << r.output;
      fingerprint = r.report.value("param_fingerprint", "");
      EXPECT_EQ(fingerprint.size(), 16u) << r.output;
    }
    return fingerprint;
  }

  // Runs the job with one fault (or several, "[[faults]]"-separated) and
  // checks the outcome.
  nlohmann::json ExpectRecovered(const std::string& name, const std::string& fault,
                                 const std::string& cause, const std::string& recovery = "",
                                 const std::string& checkpoint = "every_steps = 5\n",
                                 JobResult* result = nullptr) {
    const std::string reference = Reference(this);
    JobResult r = Run(Spec(name, "[[faults]]\n" + fault, recovery, checkpoint));
    if (result != nullptr) *result = r;
    EXPECT_TRUE(r.exit.Success()) << r.exit.ToString() << "\n" << r.output;
    EXPECT_EQ(r.report.value("steps", 0), 30) << r.output;
    EXPECT_EQ(r.report.value("param_fingerprint", ""), reference) << r.output;
    const nlohmann::json& incidents = r.report["incidents"];
    EXPECT_GE(incidents.size(), 1u) << r.output;
    if (incidents.empty()) return {};
    EXPECT_EQ(incidents[0].value("cause", ""), cause) << r.output;
    return incidents[0];
  }

  fs::path dir_;
};

TEST_F(ControlPlaneTest, KilledRankIsRestartedFromItsCheckpoint) {
  nlohmann::json inc =
      ExpectRecovered("kill", "kind = \"kill\"\nrank = 1\nstep = 12\n", "signal 9 SIGKILL");
  EXPECT_EQ(inc.value("rank", -1), 1);
  EXPECT_EQ(inc.value("steps_lost", -1), 1);  // step 11 ran after the step-10 checkpoint
}

TEST_F(ControlPlaneTest, WarmStandbyWorkersTakeOverAfterAKill) {
  nlohmann::json inc = ExpectRecovered("standby", "kind = \"kill\"\nrank = 0\nstep = 12\n",
                                       "signal 9 SIGKILL", "warm_standby = true\n");
  EXPECT_EQ(inc.value("restored_step", -1), 10);
  // The standby had the program loaded: the relaunch is well under a cold start.
  EXPECT_LT(inc.value("relaunch_s", 99.0), 5.0);
}

TEST_F(ControlPlaneTest, ExitCodeIsTheCause) {
  ExpectRecovered("exit", "kind = \"exit\"\nrank = 0\nstep = 9\nexit_code = 3\n",
                  "worker_exit code 3");
}

TEST_F(ControlPlaneTest, HangIsDetectedWithinItsTimeoutPlusOneSecond) {
  nlohmann::json inc = ExpectRecovered("hang", "kind = \"hang\"\nrank = 0\nstep = 14\n", "hang");
  // The floor (2 s) dominates 3 x p99 of these ~50 ms steps.
  EXPECT_LE(inc.value("detected_after_s", 99.0), 2.0 + 1.0);
  EXPECT_GE(inc.value("detected_after_s", 0.0), 2.0 - 0.2);
  ASSERT_TRUE(inc.contains("stacks"));
  EXPECT_FALSE(inc["stacks"].empty()) << inc.dump(2);
}

TEST_F(ControlPlaneTest, NanLossRollsBackToTheCheckpointBeforeIt) {
  nlohmann::json inc = ExpectRecovered("nan", "kind = \"nan\"\nrank = 1\nstep = 13\n", "loss_nan");
  EXPECT_EQ(inc.value("action", ""), "roll_back");
}

TEST_F(ControlPlaneTest, XidLineEvictsTheNode) {
  nlohmann::json inc = ExpectRecovered(
      "log",
      "kind = \"log\"\nrank = 1\nstep = 11\n"
      "line = \"NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\"\n",
      "xid_79");
  EXPECT_NE(inc.value("log_line", "").find("Xid"), std::string::npos);
}

TEST_F(ControlPlaneTest, LostNodeIsReplaced) {
  nlohmann::json inc =
      ExpectRecovered("agent", "kind = \"kill-agent\"\nrank = 1\nstep = 12\n", "node_lost");
  EXPECT_GE(inc.value("recovered_after_s", 0.0), 1.0);  // repair_delay
}

// ---- The checkpoint tiers: every-step snapshots in memory, replicas, durable ----

constexpr char kEveryStep[] = "every_steps = 1\npersist_every_steps = 5\n";

// Replication and persistence run behind training at a lower CPU priority:
// on 2 cores fully busy with training they can fall steps behind, and a
// restore then goes further back (docs/checkpoints.md). Tests that restore
// from T1 or T2 let both ranks leave the CPU idle part of each step (`slow`:
// they sleep), as a GPU job's CPU does. Prepended to a test's faults.
constexpr char kIdleCpu[] =
    "kind = \"slow\"\nrank = 0\nstep = 1\nfactor = 3\n[[faults]]\nkind = \"slow\"\nrank = 1\n"
    "step = 1\nfactor = 3\n[[faults]]\n";

TEST_F(ControlPlaneTest, WorkerCrashRestoresFromLocalMemory) {
  JobResult r;
  nlohmann::json inc = ExpectRecovered("t0", "kind = \"kill\"\nrank = 1\nstep = 12\n",
                                       "signal 9 SIGKILL", "", kEveryStep, &r);
  // Step 11 was in node memory: nothing but the killed step is recomputed.
  EXPECT_EQ(inc.value("restored_step", -1), 11) << inc.dump(2);
  EXPECT_EQ(inc.value("restore", "").rfind("step 11 from T0 x2", 0), 0u) << inc.dump(2);
  // The final state is durable: committed once both ranks finished.
  EXPECT_EQ(r.report["checkpoint"].value("newest_durable_step", 0), 30) << r.output;
}

TEST_F(ControlPlaneTest, LostNodeRestoresFromItsPeersReplica) {
  JobResult r;
  nlohmann::json inc =
      ExpectRecovered("t1", std::string(kIdleCpu) + "kind = \"kill-agent\"\nrank = 1\nstep = 12\n",
                      "node_lost", "", "every_steps = 1\npersist_every_steps = 1000\n", &r);
  // Node 1's memory died with it; node 0 kept a replica of its shard.
  EXPECT_GE(inc.value("restored_step", -1), 10) << inc.dump(2);
  EXPECT_NE(inc.value("restore", "").find("T0 x1, T1 x1"), std::string::npos) << inc.dump(2);
  EXPECT_EQ(r.report["checkpoint"]["restored_shards_by_tier"].value("T1", 0), 1) << r.output;
}

TEST_F(ControlPlaneTest, BothMemoryCopiesLostRestoresFromDurableStorage) {
  // No peer replicas: the lost node's shard exists only in the durable
  // directory, persisted every 5 steps.
  nlohmann::json inc =
      ExpectRecovered("t2", std::string(kIdleCpu) + "kind = \"kill-agent\"\nrank = 1\nstep = 12\n",
                      "node_lost", "", "every_steps = 1\npersist_every_steps = 5\nreplicas = 0\n");
  // Step 10, or 5 when persisting ran behind: the lost shard came from disk.
  const int64_t restored = inc.value("restored_step", int64_t{-1});
  EXPECT_TRUE(restored == 10 || restored == 5) << inc.dump(2);
  EXPECT_NE(inc.value("restore", "").find("T2 x"), std::string::npos) << inc.dump(2);
}

TEST_F(ControlPlaneTest, ACorruptMemoryCopyIsRefusedAndAnotherTierUsed) {
  // Rank 0's snapshots in its node's memory get a flipped byte; it is killed
  // at step 14. Its shard comes from node 1's replica instead.
  nlohmann::json inc =
      ExpectRecovered("corrupt",
                      std::string(kIdleCpu) +
                          "kind = \"corrupt-t0\"\nrank = 0\nstep = 8\n[[faults]]\nkind = \"kill\"\n"
                          "rank = 0\nstep = 14\n",
                      "signal 9 SIGKILL", "", kEveryStep);
  const std::string restore = inc.value("restore", "");
  EXPECT_NE(restore.find("T1 x1"), std::string::npos) << inc.dump(2);
  // (rank 0 runs on whichever node registered first)
  EXPECT_NE(restore.find("refused step 13 shard 0 in T0 on node"), std::string::npos) << restore;
  EXPECT_NE(restore.find("checksum mismatch"), std::string::npos) << restore;
}

TEST_F(ControlPlaneTest, AFullDiskKeepsTrainingFromMemoryAndSaysSo) {
  JobResult r;
  const std::string reference = Reference(this);
  r = Run(Spec("diskfull",
               "[[faults]]\nkind = \"disk-full\"\nrank = 0\nstep = 3\n"
               "[[faults]]\nkind = \"kill\"\nrank = 1\nstep = 20\n",
               "", "every_steps = 1\npersist_every_steps = 1\n"));
  EXPECT_TRUE(r.exit.Success()) << r.exit.ToString() << "\n" << r.output;
  EXPECT_EQ(r.report.value("param_fingerprint", ""), reference) << r.output;
  const nlohmann::json& incidents = r.report["incidents"];
  ASSERT_EQ(incidents.size(), 2u) << r.output;
  EXPECT_EQ(incidents[0].value("cause", ""), "checkpoint persistence failing");
  EXPECT_NE(incidents[0].value("reason", "").find("No space left on device"), std::string::npos)
      << incidents[0].dump(2);
  // The kill is restored from memory, at the step before it.
  EXPECT_EQ(incidents[1].value("restored_step", -1), 19) << incidents[1].dump(2);
  // Nothing was committed after the disk filled: no half-written step counts.
  const nlohmann::json& ckpt = r.report["checkpoint"];
  EXPECT_GT(ckpt.value("persist_failures", 0), 0);
  if (ckpt["newest_durable_step"].is_number()) {  // null: the disk filled before any commit
    EXPECT_LT(ckpt["newest_durable_step"].get<int>(), 10) << ckpt.dump();
  }
  const fs::path durable = dir_ / "diskfull" / "ckpt";
  for (const auto& step :
       fs::exists(durable) ? fs::directory_iterator(durable) : fs::directory_iterator()) {
    if (fs::exists(step.path() / "MANIFEST.json")) {
      EXPECT_LT(step.path().filename().string(), "step-00000010") << step.path();
    }
  }
}

TEST_F(ControlPlaneTest, ACrashLoopGivesUpWithExitThreeAndSaysWhy) {
  // Every worker dies at start with a user error: the restart budget (1)
  // runs out before the start-up rule (3 attempts) would stop the job, and
  // the job gives up instead of looping.
  const fs::path spec = dir_ / "loop.toml";
  std::ofstream(spec) << "[job]\nname = \"loop\"\n"
                      << "command = [\"/bin/sh\", \"-c\", "
                      << "\"echo 'ValueError: shard 17 is empty' >&2; exit 1\"]\n"
                      << "nodes = 2\nstate_dir = \"" << (dir_ / "loop").string() << "\"\n"
                      << "[recovery]\nmax_restarts = 1\nbackoff_initial = \"0s\"\n";
  JobResult r = Run(spec.string());
  EXPECT_TRUE(r.exit.exited && r.exit.code == 3) << r.exit.ToString() << "\n" << r.output;
  EXPECT_EQ(r.report.value("exit_code", -1), 3);
  EXPECT_NE(r.report.value("verdict", "").find("retry budget exhausted"), std::string::npos)
      << r.report.dump(2);
  ASSERT_FALSE(r.report["incidents"].empty());
  EXPECT_EQ(r.report["incidents"][0].value("cause", ""), "user_exception");
  EXPECT_NE(r.output.find("the job gave up"), std::string::npos) << r.output;
}

TEST_F(ControlPlaneTest, MalformedSpecsExitTwoWithFileLineAndKey) {
  struct Case {
    std::string text, expected;
  };
  const std::vector<Case> cases = {
      {"[job]\nname = \"x\"\ncommand = [\"a\"]\nstate_dir = \"s\"\nbogus = 1\n",
       ":5: key 'job.bogus'"},
      {"[job]\nname = \"x\"\ncommand = [\"a\"]\nstate_dir = \"s\"\nnodes = \"two\"\n",
       ":5: key 'job.nodes'"},
      {"[job]\nname = \"x\"\nstate_dir = \"s\"\n", "key 'job.command'"},
      {"[job]\nname = \"x\"\ncommand = [\"a\"]\nstate_dir = \"s\"\n[detection]\n"
       "hang_timeout_floor = \"2 parsecs\"\n",
       ":6: key 'detection.hang_timeout_floor'"},
  };
  for (const Case& c : cases) {
    const fs::path path = dir_ / "bad.toml";
    std::ofstream(path) << c.text;
    JobResult r = Run(path.string());
    EXPECT_TRUE(r.exit.exited && r.exit.code == 2) << r.exit.ToString() << "\n" << r.output;
    EXPECT_NE(r.output.find("bad.toml"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.expected << "\n" << r.output;
  }
}

TEST_F(ControlPlaneTest, TheControllerServesMetricsAndStatusOverHttp) {
  const std::string spec = Spec("http", "");
  std::ofstream(dir_ / "right") << "right-token\n";
  auto controller = Subprocess::Start({.argv = {ENDURE_BIN, "controller", "--spec", spec,
                                                "--token-file", (dir_ / "right").string()},
                                       .output_path = (dir_ / "controller.out").string()});
  const fs::path addr = dir_ / "http" / "http.addr";
  for (int i = 0; i < 300 && ReadAll(addr).empty(); ++i) std::this_thread::sleep_for(20ms);
  const std::string hostport = ReadAll(addr);
  ASSERT_FALSE(hostport.empty()) << ReadAll(dir_ / "controller.out");
  httplib::Client http("http://" + hostport);
  auto metrics = http.Get("/metrics");
  auto status = http.Get("/api/status");
  controller->Signal(SIGKILL);
  controller->Wait();
  ASSERT_TRUE(metrics && status);
  EXPECT_EQ(metrics->status, 200);
  // No node has registered yet: generation -1, all time is start-up so far.
  EXPECT_NE(metrics->body.find("endure_generation{job=\"http\"} -1"), std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("endure_ledger_seconds{job=\"http\",category=\"startup\"}"),
            std::string::npos);
  EXPECT_NE(metrics->body.find("# TYPE endure_incidents_total counter"), std::string::npos);
  nlohmann::json j = nlohmann::json::parse(status->body, nullptr, false);
  EXPECT_EQ(j.value("phase", ""), "waiting_for_nodes") << status->body;
}

TEST_F(ControlPlaneTest, AnAgentWithoutTheTokenIsRefused) {
  const std::string spec = Spec("token", "");
  std::ofstream(dir_ / "right") << "right-token\n";
  std::ofstream(dir_ / "wrong") << "wrong-token\n";
  const fs::path addr = dir_ / "addr";
  auto controller =
      Subprocess::Start({.argv = {ENDURE_BIN, "controller", "--spec", spec, "--token-file",
                                  (dir_ / "right").string(), "--address-file", addr.string()},
                         .output_path = (dir_ / "controller.out").string()});
  for (int i = 0; i < 300 && ReadAll(addr).empty(); ++i) std::this_thread::sleep_for(20ms);
  ASSERT_FALSE(ReadAll(addr).empty()) << ReadAll(dir_ / "controller.out");
  const fs::path out = dir_ / "agent.out";
  auto agent = Subprocess::Start(
      {.argv = {ENDURE_BIN, "agent", "--controller", ReadAll(addr), "--node-id", "intruder",
                "--token-file", (dir_ / "wrong").string(), "--work-dir", (dir_ / "w").string()},
       .unset_env = {"ENDURE_TOKEN"},
       .output_path = out.string()});
  std::optional<ExitStatus> e = agent->WaitFor(30s);
  controller->Signal(SIGKILL);
  controller->Wait();
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->exited && e->code == 2) << e->ToString() << "\n" << ReadAll(out);
  EXPECT_NE(ReadAll(out).find("refused"), std::string::npos) << ReadAll(out);
  EXPECT_NE(ReadAll(dir_ / "controller.out").find("wrong or missing token"), std::string::npos);
}

TEST_F(ControlPlaneTest, AStartUpFailureOnEveryNodeStopsWithinThreeAttemptsAndEvictsNoNode) {
  // The program raises before its first step, the same way on every node: a
  // bad configuration. No node is to blame, so none is evicted (`endure run`
  // would bring up replacements, node2 and on, if one were); the job stops
  // once the failure repeats at start-up, instead of burning its restarts.
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const fs::path spec = dir_ / "startup.toml";
  std::ofstream(spec) << "[job]\nname = \"startup\"\n"
                      << "command = [\"" << python << "\", \"-c\", "
                      << "\"raise RuntimeError('bad config: no dataset at /nonexistent')\"]\n"
                      << "nodes = 2\nstate_dir = \"" << (dir_ / "startup").string() << "\"\n"
                      << "[recovery]\nbackoff_initial = \"0s\"\nrepair_delay = \"1s\"\n";
  JobResult r = Run(spec.string());
  EXPECT_TRUE(r.exit.exited && r.exit.code == 3) << r.exit.ToString() << "\n" << r.output;
  EXPECT_EQ(r.report.value("exit_code", -1), 3) << r.report.dump(2);
  const int generations = r.report.value("generations", 0);
  EXPECT_GE(generations, 1) << r.report.dump(2);
  EXPECT_LE(generations, 3) << r.report.dump(2);
  const std::string verdict = r.report.value("verdict", "");
  EXPECT_NE(verdict.find("user_exception at start-up in 3 consecutive attempts"), std::string::npos)
      << verdict;
  EXPECT_NE(verdict.find("not the nodes"), std::string::npos) << verdict;
  const nlohmann::json& incidents = r.report["incidents"];
  ASSERT_FALSE(incidents.empty()) << r.report.dump(2);
  EXPECT_LE(incidents.size(), 3u) << r.report.dump(2);
  for (const nlohmann::json& inc : incidents) {
    EXPECT_EQ(inc.value("cause", ""), "user_exception") << inc.dump(2);
    const std::string action = inc.value("action", "");
    EXPECT_TRUE(action == "restart_in_place" || action == "stop") << inc.dump(2);
    EXPECT_NE(inc.value("log_line", "").find("RuntimeError: bad config"), std::string::npos)
        << inc.dump(2);
  }
  EXPECT_EQ(incidents.back().value("action", ""), "stop") << r.report.dump(2);
  // Only the two original nodes ever took part: no replacement was needed.
  const nlohmann::json& nodes = r.report["nodes"];
  EXPECT_EQ(nodes.size(), 2u) << r.report.dump(2);
  for (const nlohmann::json& node : nodes) {
    EXPECT_TRUE(node == "node0" || node == "node1") << r.report.dump(2);
  }
}

}  // namespace
}  // namespace endure

// ---- Programs that do not use the client library (issue 11) ----

namespace endure {
namespace {

// A data-parallel-like Python program that only prints its progress, on
// rank 0, as most DDP scripts do, redrawing one line with '\r' as a progress
// bar does. In generation 0 every rank gets stuck at step 15 (as ranks
// blocked in an allreduce behind a hung peer would); later generations run
// all 30 steps.
constexpr char kPrintingWorker[] = R"(import os, time
rank = int(os.environ["RANK"])
generation = int(os.environ["ENDURE_GENERATION"])

def stuck_in_allreduce():
    while True:
        time.sleep(1)

for i in range(30):
    time.sleep(0.05)
    if generation == 0 and i + 1 == 15:
        stuck_in_allreduce()
    if rank == 0:
        print(f"step {i + 1} loss {3.0 - 0.01 * i:.3f}", end="\r", flush=True)
)";

TEST_F(ControlPlaneTest, ProgressPrintedByRankZeroDrivesHangDetectionAndTheLedger) {
  const fs::path script = dir_ / "printing_worker.py";
  std::ofstream(script) << kPrintingWorker;
  const fs::path spec = dir_ / "pattern.toml";
  std::ofstream(spec) << "[job]\nname = \"pattern\"\n"
                      << "command = [\"/usr/bin/python3\", \"" << script.string() << "\"]\n"
                      << "nodes = 2\nstate_dir = \"" << (dir_ / "pattern").string() << "\"\n"
                      << "[detection]\nstartup_timeout = \"60s\"\n"
                      << "progress_pattern = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'\n"
                      << "[recovery]\nbackoff_initial = \"0s\"\n";
  JobResult r = Run(spec.string());
  ASSERT_TRUE(r.exit.Success()) << r.exit.ToString() << "\n" << r.output;
  // Rank 1 printed nothing: rank 0's progress stood for it.
  EXPECT_EQ(r.report.value("steps", 0), 30) << r.report.dump(2);
  EXPECT_NEAR(r.report.value("last_loss", 0.0), 2.71, 1e-9) << r.report.dump(2);
  EXPECT_GT(r.report.value("ettr", 0.0), 0.0) << r.report.dump(2);
  const nlohmann::json& incidents = r.report["incidents"];
  ASSERT_EQ(incidents.size(), 1u) << r.report.dump(2);
  const nlohmann::json& inc = incidents[0];
  EXPECT_EQ(inc.value("cause", ""), "hang") << inc.dump(2);
  // The learned timeout (the 2 s floor over these 50 ms steps), not the
  // 60 s start-up timeout.
  EXPECT_LT(inc.value("detected_after_s", 99.0), 10.0) << inc.dump(2);
  EXPECT_GE(inc.value("detected_after_s", 0.0), 1.5) << inc.dump(2);
  // The stacks say why they hold no Python frames.
  ASSERT_EQ(inc["stacks"].size(), 2u) << inc.dump(2);
  for (const nlohmann::json& stack : inc["stacks"]) {
    EXPECT_NE(stack.get<std::string>().find("Python frames unavailable: the program does not use "
                                            "the endure Python client"),
              std::string::npos)
        << stack.get<std::string>();
  }
}

// A Python worker that dumps its own stacks through faulthandler, as the
// endure Python client sets up, and reports over the agent's socket by hand
// (the datagrams of include/endure/client.h). It hangs in generation 0.
constexpr char kHangWorker[] = R"(import faulthandler, json, os, signal, socket, time
faulthandler.register(signal.SIGUSR2, file=open(os.environ["ENDURE_STACKS_FILE"], "w"),
                      all_threads=True)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

def send(kind, **fields):
    message = {"type": kind, "token": os.environ["ENDURE_TOKEN"],
               "generation": int(os.environ["ENDURE_GENERATION"]),
               "rank": int(os.environ["RANK"]), "t": time.time()}
    message.update(fields)
    sock.sendto(json.dumps(message).encode(), os.environ["ENDURE_AGENT_SOCKET"])

def stuck_in_allreduce():
    while True:
        time.sleep(1)

send("stacks", signal=int(signal.SIGUSR2))
# Signals that must never be accepted for a stack dump: were one of them
# taken, the capture would end the worker and there would be no stacks.
send("stacks", signal=int(signal.SIGTERM))
send("stacks", signal=int(signal.SIGKILL))
send("stacks", signal=99)
send("ready", start_step=0, restore_s=0.0, init_s=0.1)
for i in range(30):
    time.sleep(0.05)
    if int(os.environ["ENDURE_GENERATION"]) == 0 and i + 1 == 15:
        stuck_in_allreduce()
    send("step", step=i + 1, loss=3.0 - 0.01 * i, compute_s=0.05, comm_s=0.0,
         ckpt_stall_s=0.0, checkpoint_step=-1)
)";

TEST_F(ControlPlaneTest, AHungPythonWorkerShowsItsPythonStack) {
  const fs::path script = dir_ / "hang_worker.py";
  std::ofstream(script) << kHangWorker;
  const fs::path spec = dir_ / "pystacks.toml";
  std::ofstream(spec) << "[job]\nname = \"pystacks\"\n"
                      << "command = [\"/usr/bin/python3\", \"" << script.string() << "\"]\n"
                      << "state_dir = \"" << (dir_ / "pystacks").string() << "\"\n"
                      << "[recovery]\nbackoff_initial = \"0s\"\n";
  JobResult r = Run(spec.string());
  ASSERT_TRUE(r.exit.Success()) << r.exit.ToString() << "\n" << r.output;
  EXPECT_EQ(r.report.value("steps", 0), 30) << r.report.dump(2);
  const nlohmann::json& incidents = r.report["incidents"];
  ASSERT_EQ(incidents.size(), 1u) << r.report.dump(2);
  EXPECT_EQ(incidents[0].value("cause", ""), "hang") << incidents[0].dump(2);
  ASSERT_EQ(incidents[0]["stacks"].size(), 1u) << incidents[0].dump(2);
  const std::string stack = incidents[0]["stacks"][0].get<std::string>();
  EXPECT_EQ(stack.rfind("rank 0:\nPython stacks (faulthandler):\n", 0), 0u) << stack;
  EXPECT_NE(stack.find("hang_worker.py"), std::string::npos) << stack;
  EXPECT_NE(stack.find("in stuck_in_allreduce"), std::string::npos) << stack;
  // The capture took no more than its 3 s bound.
  EXPECT_LT(incidents[0].value("teardown_s", 99.0), 3.0 + 2.0 + 1.0) << incidents[0].dump(2);
  // The refused signals were reported, not used; the stacks came through
  // the file the agent named in ENDURE_STACKS_FILE.
  const fs::path node = dir_ / "pystacks" / "nodes" / "node0";
  const std::string agent_log = ReadAll(node / "agent.log");
  for (const char* refused : {"signal 15", "signal 9", "signal 99"}) {
    EXPECT_NE(agent_log.find(std::string("ignored a \"stacks\" datagram from rank 0: ") + refused),
              std::string::npos)
        << agent_log;
  }
  EXPECT_NE(ReadAll(node / "logs" / "gen0-rank0.stacks").find("stuck_in_allreduce"),
            std::string::npos);
}

}  // namespace
}  // namespace endure
