// The report of a JobMachine driven through a scripted run with one killed
// rank: the ledger adds up to the wall time, the incident's detection latency,
// recovery phases and steps lost are as scripted, and the table shows them.
#include "controller/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "common/env.h"
#include "controller/state_store.h"

namespace endure::controller {
namespace {

using testing::HasSubstr;
using testing::Not;
using namespace std::chrono_literals;

core::TimePoint T(double s) { return core::At(FromSeconds(s)); }

core::JobMachineOptions Options() {
  core::JobMachineOptions o;
  o.nodes = 2;
  o.ranks_per_node = 1;
  o.recovery.backoff_initial = Duration(0);
  return o;
}

// Two nodes of one rank each, one step per second, a checkpoint every 5
// steps. Rank 1 is killed at t=8.5 while running step 8 and its exit is seen
// at t=8.6; the job restores step 5 and completes step 10.
//
//   t   0     node0, node1 up: generation 0 starts
//       1     both ranks ready
//       2..8  steps 1..7 (checkpoint of step 5 at t=6)
//       8.5   fault fires on rank 1          (fault_at)
//       8.6   rank 1 exits with SIGKILL      (detected_at)
//       9.1   both agents stopped            (stopped_at = relaunched_at)
//       10.1  both ranks ready, restore 0.3s (ready_at)
//       11.1  step 6 done by both            (recovered_at)
//       12.1..15.1 steps 7..10, then both exit 0
class ScriptedJob {
 public:
  ScriptedJob() : machine_(Options(), {}, T(0)) {}

  core::JobMachine& Run() {
    Do(0, core::NodeUp{core::NodeId{0}, "node0", 1});
    Do(0, core::NodeUp{core::NodeId{1}, "node1", 1});
    Do(1, core::WorkerReady{0, 0, 0, 0});
    Do(1, core::WorkerReady{0, 1, 0, 0});
    for (int step = 1; step <= 7; ++step) StepBoth(0, step, 1.0 + step);
    Do(8.5, core::FaultFiredEvent{0, 1, "kill-8", faults::FaultKind::kKill, 8, T(8.5)});
    core::WorkerExitEvent exit;
    exit.generation = core::Generation{0};
    exit.rank = core::Rank{1};
    exit.node = core::NodeId{1};
    exit.signal = 9;
    Do(8.6, exit);
    Do(9.0, core::GenerationStoppedEvent{0, core::NodeId{0}});
    Do(9.1, core::GenerationStoppedEvent{0, core::NodeId{1}});
    EXPECT_EQ(machine_.generation().value, 1);
    Do(10.0, core::WorkerReady{1, 0, 5, 0.2});
    Do(10.1, core::WorkerReady{1, 1, 5, 0.3});
    for (int step = 6; step <= 10; ++step) StepBoth(1, step, step + 5.1);
    core::WorkerExitEvent done;
    done.generation = core::Generation{1};
    done.exit_code = 0;
    for (int r = 0; r < 2; ++r) {
      done.rank = core::Rank{r};
      done.node = core::NodeId{r};
      Do(15.2, done);
    }
    EXPECT_EQ(machine_.phase(), core::JobPhase::kDone);
    return machine_;
  }

 private:
  void Do(double t, const core::JobEvent& e) { machine_.Step(e, T(t)); }
  // Both ranks finish `step` at time `t`; rank 0 reports the checkpoint.
  void StepBoth(int generation, int64_t step, double t) {
    const int64_t ckpt = step % 5 == 0 ? step : -1;
    Do(t, core::StepEnd{generation, 0, step, 3.0 - 0.1 * step, 0, ckpt});
    Do(t, core::StepEnd{generation, 1, step, 3.0 - 0.1 * step, 0, -1});
  }

  core::JobMachine machine_;
};

ReportInputs Inputs(const core::JobMachine& m) {
  return ReportInputs{.machine = m,
                      .job = "demo",
                      .start = T(0),
                      .end = T(15.7),  // 0.5s after the machine's last event
                      .exit_code = 0,
                      .verdict = "training completed",
                      .param_fingerprint = "5eed",
                      .steps = m.step().value,
                      .last_loss = m.last_loss(),
                      .nodes = {"node0", "node1"}};
}

TEST(Report, FiguresOfOneKilledRank) {
  ScriptedJob job;
  const core::JobMachine& m = job.Run();
  ASSERT_EQ(m.incidents().size(), 1u);
  const nlohmann::json r = BuildReport(Inputs(m));

  EXPECT_EQ(r["job"], "demo");
  EXPECT_EQ(r["final"], true);
  EXPECT_EQ(r["exit_code"], 0);
  EXPECT_EQ(r["verdict"], "training completed");
  EXPECT_EQ(r["param_fingerprint"], "5eed");
  EXPECT_EQ(r["steps"], 10);
  EXPECT_NEAR(r["last_loss"].get<double>(), 2.0, 1e-9);
  EXPECT_EQ(r["generations"], 2);
  EXPECT_EQ(r["nodes"], nlohmann::json({"node0", "node1"}));

  // Every second of the wall time is in exactly one category.
  const double wall = r["wall_s"].get<double>();
  EXPECT_NEAR(wall, 15.7, 1e-9);
  double sum = 0;
  for (const auto& [category, seconds] : r["ledger_s"].items()) sum += seconds.get<double>();
  EXPECT_NEAR(sum, wall, 1e-9);
  const nlohmann::json& ledger = r["ledger_s"];
  EXPECT_NEAR(ledger["startup"].get<double>(), 2.0, 1e-9);    // until step 1 ended
  EXPECT_NEAR(ledger["detection"].get<double>(), 0.1, 1e-9);  // fault 8.5 -> exit seen 8.6
  // Steps 6-7 and the start of step 8 (t=6..8.5) were rolled back.
  EXPECT_NEAR(ledger["recompute"].get<double>(), 2.5, 1e-9);
  EXPECT_NEAR(ledger["recovery"].get<double>(), 11.1 - 8.6, 1e-9);
  EXPECT_NEAR(ledger["other"].get<double>(), 0.5, 1e-9);  // after the last event
  EXPECT_NEAR(ledger["productive"].get<double>(), (6 - 2) + (15.2 - 11.1), 1e-9);
  EXPECT_NEAR(r["ettr"].get<double>(), ledger["productive"].get<double>() / wall, 1e-12);

  ASSERT_EQ(r["incidents"].size(), 1u);
  const nlohmann::json& inc = r["incidents"][0];
  EXPECT_EQ(inc["id"], 1);
  EXPECT_EQ(inc["generation"], 0);
  EXPECT_EQ(inc["cause"], m.incidents()[0].cause.name);
  EXPECT_THAT(inc["cause"].get<std::string>(), HasSubstr("9"));
  EXPECT_EQ(inc["rank"], 1);
  EXPECT_EQ(inc["node"], "node1");
  EXPECT_NEAR(inc["injected_at_s"].get<double>(), 8.5, 1e-9);
  EXPECT_NEAR(inc["detected_after_s"].get<double>(), 0.1, 1e-9);
  EXPECT_NEAR(inc["teardown_s"].get<double>(), 0.5, 1e-9);
  EXPECT_NEAR(inc["wait_s"].get<double>(), 0.0, 1e-9);
  EXPECT_NEAR(inc["restore_s"].get<double>(), 0.3, 1e-9);
  EXPECT_NEAR(inc["relaunch_s"].get<double>(), 11.1 - 9.1 - 0.3, 1e-9);
  EXPECT_NEAR(inc["recovered_after_s"].get<double>(), 11.1 - 8.5, 1e-9);
  // The phases partition the time to recover.
  EXPECT_NEAR(inc["detected_after_s"].get<double>() + inc["teardown_s"].get<double>() +
                  inc["wait_s"].get<double>() + inc["relaunch_s"].get<double>() +
                  inc["restore_s"].get<double>(),
              inc["recovered_after_s"].get<double>(), 1e-9);
  EXPECT_EQ(inc["failed_at_step"], 7);
  EXPECT_EQ(inc["restored_step"], 5);
  EXPECT_EQ(inc["steps_lost"], 2);
  EXPECT_EQ(inc["action"], "restart_in_place");
  EXPECT_FALSE(inc["reason"].get<std::string>().empty());
  // The scripted workers never said they rejoin: the route is a full restart, and says why.
  EXPECT_EQ(inc["route"], "full_restart");
  EXPECT_THAT(inc["route_reason"].get<std::string>(), HasSubstr("cannot rejoin in place"));

  const nlohmann::json& rec = r["recovery_s"];
  EXPECT_NEAR(rec["teardown"].get<double>(), 0.5, 1e-9);
  EXPECT_NEAR(rec["relaunch"].get<double>(), 1.7, 1e-9);
  EXPECT_NEAR(rec["restore"].get<double>(), 0.3, 1e-9);
  // Here nothing was waited for, so the recovery phases are the ledger's recovery.
  EXPECT_NEAR(
      rec["teardown"].get<double>() + rec["relaunch"].get<double>() + rec["restore"].get<double>(),
      ledger["recovery"].get<double>(), 1e-9);
}

TEST(Report, RenderShowsTheFigures) {
  ScriptedJob job;
  const nlohmann::json r = BuildReport(Inputs(job.Run()));
  const std::string text = RenderReport(r);
  EXPECT_THAT(text, HasSubstr("Job demo: completed (exit 0)"));
  EXPECT_THAT(text, HasSubstr("training completed"));
  EXPECT_THAT(text, HasSubstr("steps 10"));
  EXPECT_THAT(text, HasSubstr("param_fingerprint 5eed"));
  EXPECT_THAT(text, HasSubstr("wall"));
  EXPECT_THAT(text, HasSubstr("15.700s"));
  EXPECT_THAT(text, HasSubstr("checkpoint stall"));
  EXPECT_THAT(text, HasSubstr("teardown"));
  EXPECT_THAT(text, HasSubstr("relaunch"));
  EXPECT_THAT(text, HasSubstr("restore"));
  EXPECT_THAT(text, HasSubstr("recompute"));
  char ettr[32];
  std::snprintf(ettr, sizeof(ettr), "ETTR %.3f", r["ettr"].get<double>());
  EXPECT_THAT(text, HasSubstr(ettr));
  EXPECT_THAT(text, HasSubstr("Incidents: 1"));
  EXPECT_THAT(text, HasSubstr("detected after"));
  EXPECT_THAT(text, HasSubstr("8.500s"));  // injected at
  EXPECT_THAT(text, HasSubstr("0.100s"));  // detected after
  EXPECT_THAT(text, HasSubstr("2.600s"));  // recovered after
  EXPECT_THAT(text, HasSubstr("restart_in_place"));
  EXPECT_THAT(text, HasSubstr("node1"));
  EXPECT_THAT(text, HasSubstr("reason: "));
  EXPECT_THAT(text, HasSubstr("recovery: teardown 0.500s, relaunch 1.700s, restore 0.300s"));
  EXPECT_THAT(text, HasSubstr("route: full_restart: full restart from the checkpoint tiers"));
}

// At a large job's scale the table keeps the newest rows of each list and
// counts the rest; rows = 0 shows every one.
TEST(Report, RenderKeepsTheNewestRowsOfALargeJob) {
  nlohmann::json r = {
      {"job", "big"}, {"nodes", nlohmann::json::array()}, {"incidents", nlohmann::json::array()}};
  for (int n = 0; n < 12500; ++n) r["nodes"].push_back("node" + std::to_string(n));
  for (int i = 1; i <= 120; ++i) {
    r["incidents"].push_back({{"id", i},
                              {"cause", "worker_exit code 1"},
                              {"rank", 0},
                              {"node", "node7"},
                              {"reason", "incident " + std::to_string(i)}});
  }
  const std::string text = RenderReport(r, 50);
  EXPECT_THAT(text, HasSubstr("nodes node0,node1,"));
  EXPECT_THAT(text, HasSubstr("node49 and 12450 more"));
  EXPECT_THAT(text, Not(HasSubstr("node50,")));
  EXPECT_THAT(text, HasSubstr("Incidents: 120\n  (70 earlier incidents not shown"));
  EXPECT_THAT(text, HasSubstr("reason: incident 71\n"));
  EXPECT_THAT(text, HasSubstr("reason: incident 120\n"));
  EXPECT_THAT(text, Not(HasSubstr("reason: incident 70\n")));
  EXPECT_LT(text.size(), 20'000u);
  const std::string all = RenderReport(r, 0);
  EXPECT_THAT(all, HasSubstr("reason: incident 1\n"));
  EXPECT_THAT(all, HasSubstr("node12499"));
  EXPECT_THAT(all, Not(HasSubstr("not shown")));
}

TEST(Report, RenderShowsTheCheckpointTiers) {
  ScriptedJob job;
  nlohmann::json r = BuildReport(Inputs(job.Run()));
  r["checkpoint"] = {{"durable_commits", 3},         {"newest_durable_step", 30},
                     {"persist_failures", 0},        {"memory_budget_bytes", 0},
                     {"peak_t0_bytes", 11 << 20},    {"peak_t1_bytes", 5 << 20},
                     {"restored_shards_by_tier", {}}};
  EXPECT_THAT(RenderReport(r),
              HasSubstr("checkpoints: 3 durable commits, newest step 30, persist failures 0; "
                        "memory peak T0 11.0 MB, T1 5.0 MB of budget unlimited"));
}

TEST(Report, RenderShowsLogLinesAndStacks) {
  ScriptedJob job;
  nlohmann::json r = BuildReport(Inputs(job.Run()));
  r["incidents"][0]["log_line"] = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.";
  r["incidents"][0]["stacks"] = {"rank 0:\n#0 a\n#1 b\n#2 c\n#3 d\n#4 e\n#5 f\n#6 g",
                                 "rank 1:\n#0 x"};
  r["incidents"][0]["injected_at_s"] = nullptr;
  const std::string text = RenderReport(r);
  EXPECT_THAT(text, HasSubstr("log: NVRM: Xid (PCI:0000:3b:00): 79"));
  EXPECT_THAT(text, HasSubstr("stack rank 0:\n        #0 a\n"));
  EXPECT_THAT(text, HasSubstr("#4 e\n        ...\n"));
  EXPECT_THAT(text, testing::Not(HasSubstr("#5 f")));
  EXPECT_THAT(text, HasSubstr("stack rank 1:\n        #0 x\n"));
}

TEST(Report, GaveUpAndEmpty) {
  ScriptedJob job;
  ReportInputs in = Inputs(job.Run());
  in.exit_code = 3;
  in.verdict = "gave up after incident 1";
  const std::string text = RenderReport(BuildReport(in));
  EXPECT_THAT(text, HasSubstr("Job demo: gave up (exit 3)"));
  EXPECT_THAT(RenderReport(nlohmann::json::object()), HasSubstr("Incidents: 0"));
}

TEST(Report, AJobStoppedByASignalIsNotCompletedAndSaysWhy) {
  ScriptedJob job;
  const core::JobMachine& m = job.Run();
  ReportInputs in = Inputs(m);
  in.exit_code = 128 + 15;
  in.verdict = "stopped by SIGTERM at step 10 before training completed";
  in.stopped_by = "SIGTERM";
  const nlohmann::json r = BuildReport(in);
  EXPECT_EQ(r["completed"], false);
  EXPECT_EQ(r["stopped_by"], "SIGTERM");
  EXPECT_EQ(r["exit_code"], 143);
  EXPECT_THAT(RenderReport(r), HasSubstr("Job demo: stopped by SIGTERM (exit 143)"));
  const nlohmann::json done = BuildReport(Inputs(m));
  EXPECT_EQ(done["completed"], true);
  EXPECT_TRUE(done["stopped_by"].is_null());
}

TEST(Report, FromStoreFinalOrAsLastSaved) {
  const std::string dir = testing::TempDir() + "report_test_store";
  (void)Env::Default()->RemoveAll(dir);
  ASSERT_TRUE(Env::Default()->CreateDirs(dir).ok());
  Result<StateStore> store = StateStore::Open(StateStore::PathIn(dir));
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(ReportFromStore(*store).status().code(), StatusCode::kNotFound);

  ScriptedJob job;
  const core::JobMachine& m = job.Run();
  ASSERT_TRUE(store->BeginRun({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).ok());
  ASSERT_TRUE(store->SaveLedger(m.ledger()).ok());
  for (const core::Incident& inc : m.incidents()) ASSERT_TRUE(store->SaveIncident(inc, T(0)).ok());

  // Before the final report: rebuilt from the rows, marked not final.
  Result<nlohmann::json> partial = ReportFromStore(*store);
  ASSERT_TRUE(partial.ok()) << partial.status().ToString();
  EXPECT_EQ((*partial)["final"], false);
  EXPECT_NEAR((*partial)["wall_s"].get<double>(), 15.2, 1e-6);
  EXPECT_NEAR((*partial)["incidents"][0]["detected_after_s"].get<double>(), 0.1, 1e-6);
  EXPECT_THAT(RenderReport(*partial), HasSubstr("Job demo: not finished"));

  EXPECT_EQ((*partial)["run"], 1);
  EXPECT_EQ((*partial)["earlier_runs"], nlohmann::json::array());

  nlohmann::json final_report = BuildReport(Inputs(m));
  ASSERT_TRUE(AddRunHistory(*store, final_report).ok());
  ASSERT_TRUE(store->SaveReport(final_report).ok());
  Result<nlohmann::json> loaded = ReportFromStore(*store);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(*loaded, final_report);
}

// Three starts on one state directory: a completed run, one whose controller
// died (no final report), and the newest. Each report names its run and sums
// up the ones before it; the table ends with a line for each.
TEST(Report, EarlierRunsOfTheSameStateDirectory) {
  const std::string dir = testing::TempDir() + "report_test_runs";
  (void)Env::Default()->RemoveAll(dir);
  ASSERT_TRUE(Env::Default()->CreateDirs(dir).ok());
  Result<StateStore> store = StateStore::Open(StateStore::PathIn(dir));
  ASSERT_TRUE(store.ok());
  ScriptedJob job;
  const core::JobMachine& m = job.Run();

  // Run 1: the scripted job, to the end. 2023-11-14 22:13:20 UTC.
  JobRecord record{"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""};
  ASSERT_EQ(store->BeginRun(record).value(), 1);
  ASSERT_TRUE(store->SaveLedger(m.ledger()).ok());
  for (const core::Incident& inc : m.incidents()) ASSERT_TRUE(store->SaveIncident(inc, T(0)).ok());
  nlohmann::json first = BuildReport(Inputs(m));
  ASSERT_TRUE(AddRunHistory(*store, first).ok());
  EXPECT_EQ(first["run"], 1);
  EXPECT_TRUE(first["earlier_runs"].empty());
  ASSERT_TRUE(store->SaveReport(first).ok());
  record.finished_at_unix = 1.7e9 + 15.2;
  record.exit_code = 0;
  record.verdict = "training completed";
  ASSERT_TRUE(store->SaveJob(record).ok());

  // Run 2: ten seconds of startup, then its controller died.
  ASSERT_EQ(store->BeginRun({"demo", "demo.toml", "", 1.7e9 + 3600, {}, {}, "", ""}).value(), 2);
  core::EttrLedger ledger(T(0));
  ledger.Advance(T(10));
  ASSERT_TRUE(store->SaveLedger(ledger).ok());

  // Run 3: the newest, finished.
  ASSERT_EQ(store->BeginRun({"demo", "demo.toml", "", 1.7e9 + 7200, {}, {}, "", ""}).value(), 3);
  nlohmann::json third = BuildReport(Inputs(m));
  ASSERT_TRUE(AddRunHistory(*store, third).ok());
  ASSERT_TRUE(store->SaveReport(third).ok());

  EXPECT_EQ(third["run"], 3);
  const nlohmann::json& earlier = third["earlier_runs"];
  ASSERT_EQ(earlier.size(), 2u);
  EXPECT_EQ(earlier[0]["run"], 1);
  EXPECT_EQ(earlier[0]["exit_code"], 0);
  EXPECT_EQ(earlier[0]["verdict"], "training completed");
  EXPECT_EQ(earlier[0]["final"], true);
  EXPECT_EQ(earlier[0]["incidents"], 1);
  EXPECT_DOUBLE_EQ(earlier[0]["ettr"].get<double>(), first["ettr"].get<double>());
  EXPECT_DOUBLE_EQ(earlier[0]["wall_s"].get<double>(), first["wall_s"].get<double>());
  EXPECT_DOUBLE_EQ(earlier[0]["started_at_unix"].get<double>(), 1.7e9);
  EXPECT_EQ(earlier[1]["run"], 2);
  EXPECT_TRUE(earlier[1]["exit_code"].is_null());
  EXPECT_TRUE(earlier[1]["finished_at_unix"].is_null());
  EXPECT_EQ(earlier[1]["final"], false);
  EXPECT_EQ(earlier[1]["incidents"], 0);
  EXPECT_DOUBLE_EQ(earlier[1]["wall_s"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(earlier[1]["ettr"].get<double>(), 0.0);

  const std::string table = RenderReport(third);
  EXPECT_THAT(table, HasSubstr("run 3; steps 10"));
  EXPECT_THAT(table, HasSubstr("Earlier runs: 2"));
  char ettr[16];
  std::snprintf(ettr, sizeof(ettr), "%.3f", first["ettr"].get<double>());
  EXPECT_THAT(table, HasSubstr("    1  2023-11-14 22:13:20     0          1  " + std::string(ettr) +
                               "  training completed"));
  EXPECT_THAT(table, HasSubstr("    2  2023-11-14 23:13:20     -          0  0.000  not finished"));

  // An earlier run's own report, from the store: run 1's final one, run 2's
  // as last saved; each with only the runs before it.
  Result<nlohmann::json> one = ReportFromStore(*store, 1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(*one, first);
  Result<nlohmann::json> two = ReportFromStore(*store, 2);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ((*two)["final"], false);
  EXPECT_EQ((*two)["run"], 2);
  EXPECT_EQ((*two)["earlier_runs"].size(), 1u);
  EXPECT_THAT(RenderReport(*two), HasSubstr("Job demo: not finished"));
  EXPECT_EQ(ReportFromStore(*store, 4).status().code(), StatusCode::kNotFound);
  Result<nlohmann::json> newest = ReportFromStore(*store);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(*newest, third);
}

}  // namespace
}  // namespace endure::controller
