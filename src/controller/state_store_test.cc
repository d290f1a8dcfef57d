// StateStore against a real SQLite file in a temporary directory: save,
// update, reopen, load; runs kept apart; a version 1 database migrated, a
// newer one refused; errors name the path.
#include "controller/state_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "common/env.h"
#include "controller/report.h"

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
  inc.generation = core::Generation{0};
  inc.cause = core::FixedCause(core::Cause::kHang);
  inc.rank = core::Rank{1};
  inc.node = core::NodeId{1};
  inc.node_name = "node1";
  inc.injected_at = start + 12500ms;
  inc.fault_at = start + 12500ms;
  inc.detected_at = start + 14750ms;
  inc.failed_at_step = core::StepNumber{41};
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
    EXPECT_EQ(store->run(), 0);

    JobRecord job{"demo", "examples/demo.toml", "runs/demo/token", 1.7e9, {}, {}, "", ""};
    Result<int> run = store->BeginRun(job);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    EXPECT_EQ(*run, 1);
    ASSERT_TRUE(store->SaveGeneration({0, 0.0, -1, 2, "node0,node1", {}}).ok());
    // The incident as first detected, then its timeline filled in.
    core::Incident inc = HangIncident(start);
    ASSERT_TRUE(store->SaveIncident(inc, start).ok());
    inc.stopped_at = start + 15s;
    inc.relaunched_at = start + 15s;
    inc.ready_at = start + 16250ms;
    inc.recovered_at = start + 16500ms;
    inc.restore_s = 0.125;
    inc.restored_step = core::StepNumber{40};
    inc.suspects = {"node1", "node3"};
    inc.route = core::RecoveryRoute::kInProcess;
    inc.route_reason = "in-process restart: 1 of 2 ranks keep their process";
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
  EXPECT_EQ(inc.cause.name, "hang");
  EXPECT_EQ(inc.rank.value, 1);
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
  EXPECT_EQ(inc.suspects, (std::vector<std::string>{"node1", "node3"}));
  EXPECT_EQ(inc.route, core::RecoveryRoute::kInProcess);
  EXPECT_EQ(inc.route_reason, "in-process restart: 1 of 2 ranks keep their process");
  EXPECT_EQ(inc.failed_at_step.value, 41);
  EXPECT_EQ(inc.restored_step.value, 40);
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
  ASSERT_TRUE(store->BeginRun({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).ok());
  core::Incident inc;
  inc.id = 7;
  inc.cause = core::ParseIncidentCause("signal_9");
  inc.fault_at = core::At(3s);
  inc.detected_at = core::At(3s);
  ASSERT_TRUE(store->SaveIncident(inc, core::At(0s)).ok());
  Result<std::vector<core::Incident>> loaded = store->LoadIncidents(core::At(0s));
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->size(), 1u);
  EXPECT_FALSE((*loaded)[0].injected_at.has_value());
  EXPECT_FALSE((*loaded)[0].recovered_at.has_value());
  EXPECT_TRUE((*loaded)[0].stacks.empty());
  EXPECT_EQ((*loaded)[0].restored_step.value, -1);
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
    if (i == 0) ASSERT_TRUE(store->BeginRun({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).ok());
    EXPECT_EQ(store->run(), 1);  // reopening carries on in the newest run
    ASSERT_TRUE(store->SaveGeneration({i, i * 1.0, -1, 1, "node0", {}}).ok());
  }
  Result<StateStore> store = StateStore::Open(path);
  ASSERT_TRUE(store.ok());
  Result<std::vector<GenerationRecord>> gens = store->LoadGenerations();
  ASSERT_TRUE(gens.ok());
  EXPECT_EQ(gens->size(), 3u);
}

TEST(StateStore, WritesBeforeAnyRunAreRefused) {
  const std::string dir = FreshDir("norun");
  Result<StateStore> store = StateStore::Open(StateStore::PathIn(dir));
  ASSERT_TRUE(store.ok());
  const Status st = store->SaveJob({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""});
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("BeginRun"));
  EXPECT_EQ(store->SaveReport({{"job", "demo"}}).code(), StatusCode::kInternal);
  EXPECT_EQ(store->LoadJob().status().code(), StatusCode::kNotFound);
  Result<std::vector<RunSummary>> runs = store->LoadRuns();
  ASSERT_TRUE(runs.ok());
  EXPECT_TRUE(runs->empty());
}

TEST(StateStore, EachRunKeepsItsOwnHistory) {
  const std::string dir = FreshDir("runs");
  const std::string path = StateStore::PathIn(dir);
  const core::TimePoint start = core::At(100s);
  {
    // Run 1: two generations, a hang, finished with a report.
    Result<StateStore> store = StateStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    JobRecord job{"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""};
    ASSERT_EQ(store->BeginRun(job).value(), 1);
    ASSERT_TRUE(store->SaveGeneration({0, 0.0, -1, 2, "node0,node1", 15.0}).ok());
    ASSERT_TRUE(store->SaveGeneration({1, 15.0, 40, 2, "node0,node1", {}}).ok());
    ASSERT_TRUE(store->SaveIncident(HangIncident(start), start).ok());
    core::EttrLedger ledger(start);
    ledger.Enter(core::LedgerCategory::kProductive, start + 2s);
    ledger.Advance(start + 10s);
    ASSERT_TRUE(store->SaveLedger(ledger).ok());
    job.finished_at_unix = 1.7e9 + 10;
    job.exit_code = 0;
    job.verdict = "training completed";
    ASSERT_TRUE(store->SaveJob(job).ok());
    ASSERT_TRUE(store->SaveReport({{"job", "demo"}, {"ettr", 0.8}}).ok());
  }
  {
    // Run 2, by a new controller on the same database: the same generation
    // and incident numbers again, its own ledger; it dies before the end.
    Result<StateStore> store = StateStore::Open(path);
    ASSERT_TRUE(store.ok());
    EXPECT_EQ(store->run(), 1);
    Result<int> run = store->BeginRun({"demo", "demo.toml", "", 1.7e9 + 60, {}, {}, "", ""});
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    EXPECT_EQ(*run, 2);
    EXPECT_EQ(store->run(), 2);
    ASSERT_TRUE(store->SaveGeneration({0, 0.0, 40, 1, "node0", {}}).ok());
    core::Incident inc = HangIncident(start);
    inc.cause = core::ParseIncidentCause("signal_9");
    inc.failed_at_step = core::StepNumber{77};
    ASSERT_TRUE(store->SaveIncident(inc, start).ok());
    inc.id = 2;
    ASSERT_TRUE(store->SaveIncident(inc, start).ok());
    core::EttrLedger ledger(start);
    ledger.Enter(core::LedgerCategory::kProductive, start + 1s);
    ledger.Advance(start + 5s);
    ASSERT_TRUE(store->SaveLedger(ledger).ok());
  }

  Result<StateStore> store = StateStore::OpenExisting(path);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->run(), 2);  // the newest

  // The current run is run 2.
  EXPECT_EQ(store->LoadGenerations().value().size(), 1u);
  EXPECT_EQ(store->LoadGenerations().value()[0].restore_step, 40);
  Result<std::vector<core::Incident>> incidents = store->LoadIncidents(start);
  ASSERT_TRUE(incidents.ok());
  ASSERT_EQ(incidents->size(), 2u);
  EXPECT_EQ((*incidents)[0].cause.name, "signal_9");
  EXPECT_EQ((*incidents)[0].failed_at_step.value, 77);
  EXPECT_DOUBLE_EQ(store->LoadLedger().value().at("productive"), 4.0);
  EXPECT_FALSE(store->LoadJob().value().exit_code.has_value());
  EXPECT_EQ(store->LoadReport().status().code(), StatusCode::kNotFound);

  // Run 1 as it was.
  Result<std::vector<GenerationRecord>> gens1 = store->LoadGenerations(1);
  ASSERT_TRUE(gens1.ok());
  ASSERT_EQ(gens1->size(), 2u);
  EXPECT_EQ((*gens1)[1].restore_step, 40);
  EXPECT_EQ((*gens1)[0].ended_at_s, std::optional<double>(15.0));
  Result<std::vector<core::Incident>> incidents1 = store->LoadIncidents(start, 1);
  ASSERT_TRUE(incidents1.ok());
  ASSERT_EQ(incidents1->size(), 1u);
  EXPECT_EQ((*incidents1)[0].cause.name, "hang");
  EXPECT_EQ((*incidents1)[0].failed_at_step.value, 41);
  EXPECT_DOUBLE_EQ(store->LoadLedger(1).value().at("productive"), 8.0);
  EXPECT_EQ(store->LoadJob(1).value().verdict, "training completed");
  EXPECT_DOUBLE_EQ(store->LoadReport(1).value()["ettr"].get<double>(), 0.8);

  Result<JobRecord> none = store->LoadJob(3);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("no run 3 (runs 1 to 2 are recorded)"));

  Result<std::vector<RunSummary>> runs = store->LoadRuns();
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  ASSERT_EQ(runs->size(), 2u);
  const RunSummary& r1 = (*runs)[0];
  EXPECT_EQ(r1.run, 1);
  EXPECT_EQ(r1.job.name, "demo");
  EXPECT_DOUBLE_EQ(r1.job.started_at_unix, 1.7e9);
  EXPECT_EQ(r1.job.finished_at_unix, std::optional<double>(1.7e9 + 10));
  EXPECT_EQ(r1.job.exit_code, std::optional<int>(0));
  EXPECT_EQ(r1.job.verdict, "training completed");
  EXPECT_EQ(r1.incidents, 1);
  EXPECT_EQ(r1.generations, 2);
  EXPECT_TRUE(r1.has_report);
  EXPECT_DOUBLE_EQ(r1.ledger_s.at("productive"), 8.0);
  EXPECT_DOUBLE_EQ(r1.ledger_s.at("startup"), 2.0);
  const RunSummary& r2 = (*runs)[1];
  EXPECT_EQ(r2.run, 2);
  EXPECT_DOUBLE_EQ(r2.job.started_at_unix, 1.7e9 + 60);
  EXPECT_FALSE(r2.job.finished_at_unix.has_value());
  EXPECT_FALSE(r2.job.exit_code.has_value());
  EXPECT_EQ(r2.incidents, 2);
  EXPECT_EQ(r2.generations, 1);
  EXPECT_FALSE(r2.has_report);
  EXPECT_DOUBLE_EQ(r2.ledger_s.at("productive"), 4.0);
}

// The database of schema version 1 (one job, no runs) as the endure before
// runs wrote it: its tables, verbatim.
constexpr char kVersion1Schema[] = R"sql(
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version (version) VALUES (1);
CREATE TABLE job (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  name TEXT NOT NULL,
  spec_path TEXT NOT NULL,
  token_path TEXT NOT NULL,
  started_at REAL NOT NULL,
  finished_at REAL,
  exit_code INTEGER,
  verdict TEXT NOT NULL,
  param_fingerprint TEXT NOT NULL
);
CREATE TABLE generations (
  generation INTEGER PRIMARY KEY,
  started_at REAL NOT NULL,
  restore_step INTEGER NOT NULL,
  world_size INTEGER NOT NULL,
  nodes TEXT NOT NULL,
  ended_at REAL
);
CREATE TABLE incidents (
  id INTEGER PRIMARY KEY,
  generation INTEGER NOT NULL,
  cause TEXT NOT NULL,
  rank INTEGER NOT NULL,
  node INTEGER NOT NULL,
  node_name TEXT NOT NULL,
  injected_at REAL,
  fault_at REAL NOT NULL,
  detected_at REAL NOT NULL,
  stopped_at REAL,
  relaunched_at REAL,
  ready_at REAL,
  recovered_at REAL,
  restore_s REAL NOT NULL,
  failed_at_step INTEGER NOT NULL,
  restored_step INTEGER NOT NULL,
  action TEXT NOT NULL,
  reason TEXT NOT NULL,
  log_line TEXT NOT NULL,
  stacks TEXT NOT NULL
);
CREATE TABLE ledger (
  category TEXT PRIMARY KEY,
  seconds REAL NOT NULL
);
CREATE TABLE report (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  json TEXT NOT NULL
);
)sql";

// Runs `sql` on the database at `path` with SQLite itself, outside the
// StateStore; false (with the error printed) when it fails.
bool RawSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  bool ok = sqlite3_open(path.c_str(), &db) == SQLITE_OK;
  char* error = nullptr;
  if (ok && sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
    ADD_FAILURE() << path << ": " << (error != nullptr ? error : "?");
    ok = false;
  }
  sqlite3_free(error);
  sqlite3_close(db);
  return ok;
}

// The one integer `sql` selects from the database at `path`; -1 on failure.
int64_t RawInt(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_stmt* stmt = nullptr;
  int64_t out = -1;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK &&
      sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    out = sqlite3_column_int64(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

TEST(StateStore, MigratesAVersion1DatabaseIntoRun1) {
  const std::string dir = FreshDir("migrate");
  const std::string path = StateStore::PathIn(dir);
  ASSERT_TRUE(RawSql(path, std::string(kVersion1Schema) + R"sql(
    INSERT INTO job VALUES (1, 'demo', 'demo.toml', 'runs/demo/token', 1700000000.0,
                            1700000030.0, 3, 'gave up after 2 restarts', 'a1b2c3');
    INSERT INTO generations VALUES (0, 0.0, -1, 2, 'node0,node1', 12.0);
    INSERT INTO generations VALUES (1, 12.0, 40, 2, 'node0,node1', NULL);
    INSERT INTO incidents VALUES (1, 0, 'hang', 1, 1, 'node1', 12.5, 12.5, 14.75, 15.0, 15.0,
      16.25, 16.5, 0.125, 41, 40, 'restart_in_place', 'no step progress', '', '["rank 1:"]');
    INSERT INTO ledger VALUES ('productive', 20.0);
    INSERT INTO ledger VALUES ('recovery', 2.0);
    INSERT INTO report VALUES (1, '{"job": "demo", "ettr": 0.66}');
  )sql"));

  const core::TimePoint start = core::At(0s);
  {
    Result<StateStore> store = StateStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ(store->run(), 1);
    Result<JobRecord> job = store->LoadJob();
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    EXPECT_EQ(job->name, "demo");
    EXPECT_EQ(job->token_path, "runs/demo/token");
    EXPECT_EQ(job->exit_code, std::optional<int>(3));
    EXPECT_EQ(job->verdict, "gave up after 2 restarts");
    EXPECT_EQ(job->param_fingerprint, "a1b2c3");
    Result<std::vector<GenerationRecord>> gens = store->LoadGenerations(1);
    ASSERT_TRUE(gens.ok());
    ASSERT_EQ(gens->size(), 2u);
    EXPECT_EQ((*gens)[1].restore_step, 40);
    Result<std::vector<core::Incident>> incidents = store->LoadIncidents(start, 1);
    ASSERT_TRUE(incidents.ok()) << incidents.status().ToString();
    ASSERT_EQ(incidents->size(), 1u);
    EXPECT_EQ((*incidents)[0].cause.name, "hang");
    EXPECT_EQ((*incidents)[0].recovered_at, std::optional<core::TimePoint>(start + 16500ms));
    EXPECT_EQ((*incidents)[0].stacks, std::vector<std::string>{"rank 1:"});
    EXPECT_DOUBLE_EQ(store->LoadLedger(1).value().at("productive"), 20.0);
    EXPECT_DOUBLE_EQ(store->LoadReport(1).value()["ettr"].get<double>(), 0.66);

    // The next start is run 2, and run 1 stays.
    ASSERT_EQ(store->BeginRun({"demo", "demo.toml", "", 1.7e9 + 100, {}, {}, "", ""}).value(), 2);
    ASSERT_TRUE(store->SaveGeneration({0, 0.0, 40, 2, "node0,node1", {}}).ok());
  }
  EXPECT_EQ(RawInt(path, "SELECT version FROM schema_version"), 7);
  EXPECT_EQ(RawInt(path, "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE '%_v1'"), 0);

  Result<StateStore> store = StateStore::OpenExisting(path);  // migrated once only
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Result<std::vector<RunSummary>> runs = store->LoadRuns();
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].incidents, 1);
  EXPECT_EQ((*runs)[0].generations, 2);
  EXPECT_TRUE((*runs)[0].has_report);
  EXPECT_EQ((*runs)[1].generations, 1);
  EXPECT_EQ((*runs)[1].incidents, 0);
}

TEST(StateStore, MigratesAnEmptyVersion1Database) {
  const std::string dir = FreshDir("migrate_empty");
  const std::string path = StateStore::PathIn(dir);
  ASSERT_TRUE(RawSql(path, kVersion1Schema));
  Result<StateStore> store = StateStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(store->run(), 0);
  EXPECT_EQ(store->LoadJob().status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->BeginRun({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).value(), 1);
}

TEST(StateStore, RefusesADatabaseOfANewerSchemaVersion) {
  const std::string dir = FreshDir("future");
  const std::string path = StateStore::PathIn(dir);
  {
    Result<StateStore> store = StateStore::Open(path);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(store->BeginRun({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).ok());
  }
  ASSERT_TRUE(RawSql(path, "UPDATE schema_version SET version = 99"));
  for (bool existing : {false, true}) {
    Result<StateStore> store = existing ? StateStore::OpenExisting(path) : StateStore::Open(path);
    ASSERT_FALSE(store.ok());
    EXPECT_EQ(store.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(store.status().message(), HasSubstr(path));
    EXPECT_THAT(store.status().message(), HasSubstr("schema version 99"));
    EXPECT_THAT(store.status().message(), HasSubstr("use the endure that ran the job"));
  }
  EXPECT_EQ(RawInt(path, "SELECT version FROM schema_version"), 99);  // left as it was
}

// The database of schema version 2 (runs, no journal), verbatim.
constexpr char kVersion2Schema[] = R"sql(
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version (version) VALUES (2);
CREATE TABLE runs (
  run INTEGER PRIMARY KEY CHECK (run >= 1),
  name TEXT NOT NULL,
  spec_path TEXT NOT NULL,
  token_path TEXT NOT NULL,
  started_at REAL NOT NULL,
  finished_at REAL,
  exit_code INTEGER,
  verdict TEXT NOT NULL,
  param_fingerprint TEXT NOT NULL
);
CREATE TABLE generations (
  run INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  started_at REAL NOT NULL,
  restore_step INTEGER NOT NULL,
  world_size INTEGER NOT NULL,
  nodes TEXT NOT NULL,
  ended_at REAL,
  PRIMARY KEY (run, generation)
);
CREATE TABLE incidents (
  run INTEGER NOT NULL,
  id INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  cause TEXT NOT NULL,
  rank INTEGER NOT NULL,
  node INTEGER NOT NULL,
  node_name TEXT NOT NULL,
  injected_at REAL,
  fault_at REAL NOT NULL,
  detected_at REAL NOT NULL,
  stopped_at REAL,
  relaunched_at REAL,
  ready_at REAL,
  recovered_at REAL,
  restore_s REAL NOT NULL,
  failed_at_step INTEGER NOT NULL,
  restored_step INTEGER NOT NULL,
  action TEXT NOT NULL,
  reason TEXT NOT NULL,
  log_line TEXT NOT NULL,
  stacks TEXT NOT NULL,
  PRIMARY KEY (run, id)
);
CREATE TABLE ledger (
  run INTEGER NOT NULL,
  category TEXT NOT NULL,
  seconds REAL NOT NULL,
  PRIMARY KEY (run, category)
);
CREATE TABLE report (
  run INTEGER PRIMARY KEY,
  json TEXT NOT NULL
);
)sql";

TEST(StateStore, MigratesAVersion2DatabaseKeepingItsRuns) {
  const std::string dir = FreshDir("migrate2");
  const std::string path = StateStore::PathIn(dir);
  ASSERT_TRUE(RawSql(path, std::string(kVersion2Schema) + R"sql(
    INSERT INTO runs VALUES (1, 'demo', 'demo.toml', '', 1700000000.0, NULL, NULL, '', '');
    INSERT INTO incidents VALUES (1, 1, 0, 'hang', 1, 1, 'node1', 12.5, 12.5, 14.75, 15.0, 15.0,
      16.25, 16.5, 0.125, 41, 40, 'restart_in_place', 'no step progress', '', '[]');
  )sql"));
  Result<StateStore> store = StateStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(RawInt(path, "SELECT version FROM schema_version"), 7);
  EXPECT_EQ(store->run(), 1);
  EXPECT_EQ(store->LoadJob().value().spec_digest, "");
  ASSERT_EQ(store->LoadIncidents(core::At(0s)).value().size(), 1u);
  EXPECT_TRUE(store->LoadIncidents(core::At(0s)).value()[0].suspects.empty());
  EXPECT_FALSE(store->LoadIncidents(core::At(0s)).value()[0].route.has_value());
  EXPECT_TRUE(store->LoadJournal().value().empty());
  ASSERT_TRUE(store->AppendJournal({1, 2s, "tick"}).ok());
  EXPECT_EQ(store->LoadJournal().value().size(), 1u);
  EXPECT_FALSE(store->LoadSnapshot().value().has_value()) << "it gained the snapshots table";
  ASSERT_TRUE(store->SaveSnapshot({1, 2s, "state"}).ok());
}

// The journal keeps each run's inputs in order, apart from other runs', and
// an input journaled in a transaction that is aborted is not kept.
TEST(StateStore, TheJournalKeepsEachRunsInputsInOrder) {
  const std::string dir = FreshDir("journal");
  const std::string path = StateStore::PathIn(dir);
  {
    Result<StateStore> store = StateStore::Open(path);
    ASSERT_TRUE(store.ok());
    EXPECT_THAT(store->AppendJournal({1, 0s, "tick"}).message(), HasSubstr("before any run"));
    JobRecord job{"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""};
    job.spec_digest = "00ff00ff00ff00ff";
    ASSERT_EQ(store->BeginRun(job).value(), 1);
    ASSERT_TRUE(store->BeginTransaction().ok());
    EXPECT_FALSE(store->BeginTransaction().ok()) << "one at a time";
    ASSERT_TRUE(store->AppendJournal({1, 1500ms, "node_up node=0 name=\"a\" slots=1"}).ok());
    core::EttrLedger ledger(core::At(0s));
    ledger.Advance(core::At(2s));
    ASSERT_TRUE(store->SaveLedger(ledger).ok()) << "inside the transaction";
    ASSERT_TRUE(store->CommitTransaction().ok());
    ASSERT_TRUE(store->BeginTransaction().ok());
    ASSERT_TRUE(store->AppendJournal({2, 2s, "tick"}).ok());
    ASSERT_TRUE(store->AbortTransaction().ok());
    ASSERT_TRUE(store->AppendJournal({2, 3s, "tick"}).ok());
    EXPECT_FALSE(store->AppendJournal({2, 4s, "tick"}).ok()) << "seq 2 exists";
    ASSERT_EQ(store->BeginRun({"demo", "demo.toml", "", 1.7e9 + 10, {}, {}, "", ""}).value(), 2);
    ASSERT_TRUE(store->AppendJournal({1, 0s, "tick"}).ok());
  }
  Result<StateStore> store = StateStore::OpenExisting(path);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->LoadJob(1).value().spec_digest, "00ff00ff00ff00ff");
  const std::vector<JournalEntry> run1 = store->LoadJournal(1).value();
  ASSERT_EQ(run1.size(), 2u);
  EXPECT_EQ(run1[0].seq, 1);
  EXPECT_EQ(run1[0].since_start, 1500ms);
  EXPECT_EQ(run1[0].event, "node_up node=0 name=\"a\" slots=1");
  EXPECT_EQ(run1[1].since_start, 3s);                  // the aborted one is gone
  EXPECT_EQ(store->LoadJournal().value().size(), 1u);  // run 2, the current one
  EXPECT_DOUBLE_EQ(store->LoadLedger(1).value().at("startup"), 2.0);
}

// A run's newest snapshot replaces the one before, and the journal is cut
// behind it in the same transaction: what follows it stays, in order, and
// other runs keep theirs.
TEST(StateStore, ASnapshotReplacesTheLastAndCutsTheJournalBehindIt) {
  const std::string path = StateStore::PathIn(FreshDir("snapshot"));
  Result<StateStore> store = StateStore::Open(path);
  ASSERT_TRUE(store.ok());
  EXPECT_THAT(store->SaveSnapshot({1, 0s, "x"}).message(), HasSubstr("before any run"));
  ASSERT_EQ(store->BeginRun({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).value(), 1);
  for (int64_t seq = 1; seq <= 5; ++seq) ASSERT_TRUE(store->AppendJournal({seq, 1s, "tick"}).ok());
  ASSERT_EQ(store->BeginRun({"demo", "demo.toml", "", 1.7e9 + 1, {}, {}, "", ""}).value(), 2);
  EXPECT_FALSE(store->LoadSnapshot().value().has_value()) << "none yet";
  for (int64_t seq = 1; seq <= 9; ++seq) ASSERT_TRUE(store->AppendJournal({seq, 2s, "tick"}).ok());
  const std::string bytes("state\0with\xff bytes", 19);
  ASSERT_TRUE(store->SaveSnapshot({4, 3s, "older"}).ok());
  ASSERT_TRUE(store->SaveSnapshot({7, 5s, bytes}).ok());
  const std::optional<SnapshotRecord> got = store->LoadSnapshot().value();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->seq, 7);
  EXPECT_EQ(got->since_start, 5s);
  EXPECT_EQ(got->state, bytes) << "bytes, NULs included";
  const std::vector<JournalEntry> after =
      store->LoadJournal(StateStore::kCurrentRun, got->seq).value();
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].seq, 8);
  EXPECT_EQ(store->LoadJournal().value().size(), 2u) << "entries 1 to 7 are cut";
  EXPECT_EQ(store->LoadJournal(1).value().size(), 5u) << "run 1 keeps its journal";
  EXPECT_FALSE(store->LoadSnapshot(1).value().has_value());
  // Inside an open transaction (a group of inputs) a snapshot is refused,
  // and nothing is cut.
  ASSERT_TRUE(store->BeginTransaction().ok());
  EXPECT_FALSE(store->SaveSnapshot({9, 6s, "x"}).ok());
  ASSERT_TRUE(store->AbortTransaction().ok());
  EXPECT_EQ(store->LoadSnapshot().value()->seq, 7);
}

}  // namespace
}  // namespace endure::controller

namespace endure::controller {
namespace {

// The history (the dashboard's and the HTML report's plots) is kept per
// run, replaced by each save, and a database of schema version 6 gains its
// table when it is opened.
TEST(StateStore, EachRunKeepsItsHistoryAndAVersion6DatabaseGainsIt) {
  const std::string path = StateStore::PathIn(FreshDir("history"));
  {
    Result<StateStore> store = StateStore::Open(path);
    ASSERT_TRUE(store.ok());
    EXPECT_THAT(store->SaveHistory({{"t_s", {0}}}).message(), HasSubstr("before any run"));
    ASSERT_EQ(store->BeginRun({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).value(), 1);
    EXPECT_FALSE(store->LoadHistory().value().has_value()) << "none saved yet";
    ASSERT_TRUE(store->SaveHistory({{"t_s", {0, 1}}}).ok());
    ASSERT_TRUE(store->SaveHistory({{"t_s", {0, 1, 2}}}).ok());
    ASSERT_EQ(store->BeginRun({"demo", "demo.toml", "", 1.7e9 + 5, {}, {}, "", ""}).value(), 2);
    ASSERT_TRUE(store->SaveHistory({{"t_s", {7}}}).ok());
    EXPECT_EQ(store->LoadHistory(1).value()->at("t_s").size(), 3u) << "the newest save of run 1";
    EXPECT_EQ(store->LoadHistory().value()->at("t_s").size(), 1u);
    Result<nlohmann::json> report = ReportFromStore(*store, 1);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ((*report)["history"]["t_s"].size(), 3u) << "the report carries its run's history";
  }
  // The same database as version 6 had it: no history table.
  ASSERT_TRUE(RawSql(path, "DROP TABLE history; UPDATE schema_version SET version = 6;"));
  Result<StateStore> store = StateStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(RawInt(path, "SELECT version FROM schema_version"), 7);
  EXPECT_FALSE(store->LoadHistory().value().has_value());
  ASSERT_TRUE(store->SaveHistory({{"t_s", {9}}}).ok());
  EXPECT_EQ(store->LoadHistory().value()->at("t_s")[0], 9);
}

}  // namespace
}  // namespace endure::controller
