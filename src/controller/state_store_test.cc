// StateStore against a real SQLite file in a temporary directory: save,
// update, reopen, load; errors name the path.
#include "controller/state_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/env.h"

namespace endure::controller {
namespace {

using testing::HasSubstr;
using namespace std::chrono_literals;

std::string FreshDir(const std::string& name) {
  const std::string dir = testing::TempDir() + "state_store_test_" + name;
  (void)Env::Default()->RemoveAll(dir);
  EXPECT_TRUE(Env::Default()->CreateDirs(dir).ok());
  return dir;
}

core::Incident HangIncident(core::TimePoint start) {
  core::Incident inc;
  inc.id = 1;
  inc.generation = 0;
  inc.cause = "hang";
  inc.rank = 1;
  inc.node = core::NodeId{1};
  inc.node_name = "node1";
  inc.injected_at = start + 12500ms;
  inc.fault_at = start + 12500ms;
  inc.detected_at = start + 14750ms;
  inc.failed_at_step = 41;
  inc.action = "restart_in_place";
  inc.reason = "no step progress from rank 1 for 2.2s";
  inc.stacks = {"rank 0:\n#0 allreduce\n#1 main", "rank 1:\n#0 sleep\n#1 main"};
  return inc;
}

TEST(StateStore, SavesUpdatesAndReloadsEverything) {
  const std::string dir = FreshDir("roundtrip");
  const std::string path = StateStore::PathIn(dir);
  EXPECT_EQ(path, dir + "/controller.db");
  const core::TimePoint start = core::At(100s);
  {
    Result<StateStore> store = StateStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ(store->LoadJob().status().code(), StatusCode::kNotFound);
    EXPECT_EQ(store->LoadReport().status().code(), StatusCode::kNotFound);

    JobRecord job{"demo", "examples/demo.toml", "runs/demo/token", 1.7e9, {}, {}, "", ""};
    ASSERT_TRUE(store->SaveJob(job).ok());
    ASSERT_TRUE(store->SaveGeneration({0, 0.0, -1, 2, "node0,node1", {}}).ok());
    // The incident as first detected, then its timeline filled in.
    core::Incident inc = HangIncident(start);
    ASSERT_TRUE(store->SaveIncident(inc, start).ok());
    inc.stopped_at = start + 15s;
    inc.relaunched_at = start + 15s;
    inc.ready_at = start + 16250ms;
    inc.recovered_at = start + 16500ms;
    inc.restore_s = 0.125;
    inc.restored_step = 40;
    ASSERT_TRUE(store->SaveIncident(inc, start).ok());
    ASSERT_TRUE(store->SaveGeneration({0, 0.0, -1, 2, "node0,node1", 15.0}).ok());
    ASSERT_TRUE(store->SaveGeneration({1, 15.0, 40, 2, "node0,node1", {}}).ok());

    core::EttrLedger ledger(start);
    ledger.Enter(core::LedgerCategory::kProductive, start + 2s);
    ledger.Enter(core::LedgerCategory::kRecovery, start + 12s);
    ledger.Advance(start + 13s);
    ASSERT_TRUE(store->SaveLedger(ledger).ok());
    ledger.Enter(core::LedgerCategory::kProductive, start + 14s);
    ASSERT_TRUE(store->SaveLedger(ledger).ok());

    job.finished_at_unix = 1.7e9 + 30;
    job.exit_code = 0;
    job.verdict = "training completed";
    job.param_fingerprint = "a1b2c3";
    ASSERT_TRUE(store->SaveJob(job).ok());
    ASSERT_TRUE(store->SaveReport({{"job", "demo"}, {"ettr", 0.9}}).ok());
  }

  // A new controller, whose steady clock started elsewhere.
  const core::TimePoint new_start = core::At(5000s);
  Result<StateStore> store = StateStore::OpenExisting(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();

  Result<JobRecord> job = store->LoadJob();
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->name, "demo");
  EXPECT_EQ(job->spec_path, "examples/demo.toml");
  EXPECT_EQ(job->token_path, "runs/demo/token");
  EXPECT_DOUBLE_EQ(job->started_at_unix, 1.7e9);
  EXPECT_EQ(job->finished_at_unix, std::optional<double>(1.7e9 + 30));
  EXPECT_EQ(job->exit_code, std::optional<int>(0));
  EXPECT_EQ(job->verdict, "training completed");
  EXPECT_EQ(job->param_fingerprint, "a1b2c3");

  Result<std::vector<GenerationRecord>> gens = store->LoadGenerations();
  ASSERT_TRUE(gens.ok());
  ASSERT_EQ(gens->size(), 2u);
  EXPECT_EQ((*gens)[0].ended_at_s, std::optional<double>(15.0));
  EXPECT_EQ((*gens)[1].generation, 1);
  EXPECT_EQ((*gens)[1].restore_step, 40);
  EXPECT_EQ((*gens)[1].world_size, 2);
  EXPECT_EQ((*gens)[1].nodes, "node0,node1");
  EXPECT_FALSE((*gens)[1].ended_at_s.has_value());

  Result<std::vector<core::Incident>> incidents = store->LoadIncidents(new_start);
  ASSERT_TRUE(incidents.ok());
  ASSERT_EQ(incidents->size(), 1u);  // updated in place, not duplicated
  const core::Incident& inc = (*incidents)[0];
  EXPECT_EQ(inc.id, 1);
  EXPECT_EQ(inc.cause, "hang");
  EXPECT_EQ(inc.rank, 1);
  EXPECT_EQ(inc.node, core::NodeId{1});
  EXPECT_EQ(inc.node_name, "node1");
  EXPECT_EQ(inc.injected_at, std::optional<core::TimePoint>(new_start + 12500ms));
  EXPECT_EQ(inc.fault_at, new_start + 12500ms);
  EXPECT_EQ(inc.detected_at, new_start + 14750ms);
  EXPECT_EQ(inc.stopped_at, std::optional<core::TimePoint>(new_start + 15s));
  EXPECT_EQ(inc.relaunched_at, std::optional<core::TimePoint>(new_start + 15s));
  EXPECT_EQ(inc.ready_at, std::optional<core::TimePoint>(new_start + 16250ms));
  EXPECT_EQ(inc.recovered_at, std::optional<core::TimePoint>(new_start + 16500ms));
  EXPECT_DOUBLE_EQ(inc.restore_s, 0.125);
  EXPECT_EQ(inc.failed_at_step, 41);
  EXPECT_EQ(inc.restored_step, 40);
  EXPECT_EQ(inc.steps_lost(), 1);
  EXPECT_EQ(inc.action, "restart_in_place");
  EXPECT_EQ(inc.reason, "no step progress from rank 1 for 2.2s");
  EXPECT_EQ(inc.stacks, HangIncident(start).stacks);

  Result<std::map<std::string, double>> ledger = store->LoadLedger();
  ASSERT_TRUE(ledger.ok());
  EXPECT_EQ(ledger->size(), 7u);
  EXPECT_DOUBLE_EQ(ledger->at("startup"), 2.0);
  EXPECT_DOUBLE_EQ(ledger->at("productive"), 10.0);
  EXPECT_DOUBLE_EQ(ledger->at("recovery"), 2.0);
  EXPECT_DOUBLE_EQ(ledger->at("other"), 0.0);

  Result<nlohmann::json> report = store->LoadReport();
  ASSERT_TRUE(report.ok());
  EXPECT_EQ((*report)["job"], "demo");
  EXPECT_DOUBLE_EQ((*report)["ettr"].get<double>(), 0.9);
}

TEST(StateStore, IncidentWithoutOptionalTimes) {
  const std::string dir = FreshDir("optional");
  Result<StateStore> store = StateStore::Open(StateStore::PathIn(dir));
  ASSERT_TRUE(store.ok());
  core::Incident inc;
  inc.id = 7;
  inc.cause = "signal_9";
  inc.fault_at = core::At(3s);
  inc.detected_at = core::At(3s);
  ASSERT_TRUE(store->SaveIncident(inc, core::At(0s)).ok());
  Result<std::vector<core::Incident>> loaded = store->LoadIncidents(core::At(0s));
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_FALSE((*loaded)[0].injected_at.has_value());
  EXPECT_FALSE((*loaded)[0].recovered_at.has_value());
  EXPECT_TRUE((*loaded)[0].stacks.empty());
  EXPECT_EQ((*loaded)[0].restored_step, -1);
}

TEST(StateStore, OpenExistingRefusesAMissingFile) {
  const std::string dir = FreshDir("missing");
  Result<StateStore> store = StateStore::OpenExisting(dir + "/controller.db");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(store.status().message(), HasSubstr(dir + "/controller.db"));
  EXPECT_FALSE(Env::Default()->Exists(dir + "/controller.db"));
}

TEST(StateStore, ErrorsNameThePath) {
  const std::string dir = FreshDir("errors");
  Result<StateStore> no_dir = StateStore::Open(dir + "/no/such/dir/controller.db");
  ASSERT_FALSE(no_dir.ok());
  EXPECT_EQ(no_dir.status().code(), StatusCode::kIOError);
  EXPECT_THAT(no_dir.status().message(), HasSubstr(dir + "/no/such/dir/controller.db"));

  const std::string junk = dir + "/junk.db";
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), junk, std::string(4096, 'x')).ok());
  Result<StateStore> bad = StateStore::Open(junk);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr(junk));
}

TEST(StateStore, ReopeningKeepsTheSchema) {
  const std::string dir = FreshDir("reopen");
  const std::string path = StateStore::PathIn(dir);
  for (int i = 0; i < 3; ++i) {
    Result<StateStore> store = StateStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE(store->SaveGeneration({i, i * 1.0, -1, 1, "node0", {}}).ok());
  }
  Result<StateStore> store = StateStore::Open(path);
  ASSERT_TRUE(store.ok());
  Result<std::vector<GenerationRecord>> gens = store->LoadGenerations();
  ASSERT_TRUE(gens.ok());
  EXPECT_EQ(gens->size(), 3u);
}

}  // namespace
}  // namespace endure::controller
