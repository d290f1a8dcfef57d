// StateStore on the SQLite C API; see state_store.h.
#include "controller/state_store.h"

#include <sqlite3.h>

#include <cmath>
#include <utility>

#include "common/env.h"
#include "controller/sqlite_statement.h"

namespace endure::controller {
namespace {

// Version 1 held one job; version 2 holds runs (see state_store.h); version
// 3 adds each run's journal and spec digest; 4 each incident's suspects; 5
// each incident's recovery route; 6 each run's newest snapshot. Bump it with
// every change, and add the step from the version before to Migrate.
constexpr int kSchemaVersion = 7;

constexpr char kSchema[] = R"sql(
CREATE TABLE runs (
  run INTEGER PRIMARY KEY CHECK (run >= 1),
  name TEXT NOT NULL,
  spec_path TEXT NOT NULL,
  token_path TEXT NOT NULL,
  started_at REAL NOT NULL,
  finished_at REAL,
  exit_code INTEGER,
  verdict TEXT NOT NULL,
  param_fingerprint TEXT NOT NULL,
  spec_digest TEXT NOT NULL DEFAULT ''
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

// The decision core's inputs of each run, in order (JournalEntry): part of
// kSchema, and what version 2 lacks.
constexpr char kJournalTable[] = R"sql(
CREATE TABLE journal (
  run INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  at_ns INTEGER NOT NULL,
  event TEXT NOT NULL,
  PRIMARY KEY (run, seq)
);
)sql";

// Version 3 -> 4 (and the last step of every database's schema): the nodes
// an incident's localization named, a JSON array of names.
constexpr char kIncidentSuspects[] = R"sql(
ALTER TABLE incidents ADD COLUMN suspects TEXT NOT NULL DEFAULT '[]';
)sql";

// Version 5 -> 6 (the last step of every database's schema): each run's
// newest snapshot of its decision core (core::JobMachine::Snapshot), as of
// journal entry `seq`; the journal before it is cut.
constexpr char kSnapshotTable[] = R"sql(
CREATE TABLE snapshots (
  run INTEGER PRIMARY KEY,
  seq INTEGER NOT NULL,
  at_ns INTEGER NOT NULL,
  state BLOB NOT NULL
);
)sql";

// Version 6 -> 7 (the last step of every database's schema): each run's
// history for the dashboard and the HTML report (controller/live_history.h),
// as its JSON columns, rewritten every few seconds.
constexpr char kHistoryTable[] = R"sql(
CREATE TABLE history (
  run INTEGER PRIMARY KEY,
  json TEXT NOT NULL
);
)sql";

// Version 4 -> 5: how an
// incident's job got back to training (core/recovery_route.h; '' for none),
// and why.
constexpr char kIncidentRoute[] = R"sql(
ALTER TABLE incidents ADD COLUMN route TEXT NOT NULL DEFAULT '';
ALTER TABLE incidents ADD COLUMN route_reason TEXT NOT NULL DEFAULT '';
)sql";

// Version 2 -> 3, with kJournalTable.
constexpr char kMigrateFrom2[] = R"sql(
ALTER TABLE runs ADD COLUMN spec_digest TEXT NOT NULL DEFAULT '';
)sql";

// Version 1 -> 2: version 1's one job becomes run 1, and so does everything
// it held. Run after kSchema, with version 1's tables renamed to *_v1.
// Version 1 had a row in `job` from the controller's start on; a database
// without one but with other rows (never written by endure) still keeps them,
// under a run 1 with an empty name.
constexpr char kMigrateFrom1[] = R"sql(
INSERT INTO runs (run, name, spec_path, token_path, started_at, finished_at, exit_code, verdict,
                  param_fingerprint)
  SELECT 1, name, spec_path, token_path, started_at, finished_at, exit_code, verdict,
         param_fingerprint FROM job_v1;
INSERT INTO runs (run, name, spec_path, token_path, started_at, verdict, param_fingerprint)
  SELECT 1, '', '', '', 0, '', '' WHERE NOT EXISTS (SELECT 1 FROM runs) AND (
    EXISTS (SELECT 1 FROM generations_v1) OR EXISTS (SELECT 1 FROM incidents_v1) OR
    EXISTS (SELECT 1 FROM ledger_v1) OR EXISTS (SELECT 1 FROM report_v1));
INSERT INTO generations SELECT 1, * FROM generations_v1;
INSERT INTO incidents SELECT 1, * FROM incidents_v1;
INSERT INTO ledger SELECT 1, * FROM ledger_v1;
INSERT INTO report (run, json) SELECT 1, json FROM report_v1;
DROP TABLE job_v1;
DROP TABLE generations_v1;
DROP TABLE incidents_v1;
DROP TABLE ledger_v1;
DROP TABLE report_v1;
)sql";

constexpr char kRenameVersion1[] = R"sql(
ALTER TABLE job RENAME TO job_v1;
ALTER TABLE generations RENAME TO generations_v1;
ALTER TABLE incidents RENAME TO incidents_v1;
ALTER TABLE ledger RENAME TO ledger_v1;
ALTER TABLE report RENAME TO report_v1;
)sql";

// The columns name, spec_path, token_path, started_at, finished_at,
// exit_code, verdict, param_fingerprint, spec_digest of `runs`, from column
// `col` on.
JobRecord JobFrom(const Statement& q, int col) {
  JobRecord job;
  job.name = q.Text(col + 0);
  job.spec_path = q.Text(col + 1);
  job.token_path = q.Text(col + 2);
  job.started_at_unix = q.Real(col + 3);
  job.finished_at_unix = q.OptReal(col + 4);
  if (!q.Null(col + 5)) job.exit_code = static_cast<int>(q.Int(col + 5));
  job.verdict = q.Text(col + 6);
  job.param_fingerprint = q.Text(col + 7);
  job.spec_digest = q.Text(col + 8);
  return job;
}

double SinceStart(core::TimePoint t, core::TimePoint start) { return Seconds(t - start); }
std::optional<double> SinceStart(const std::optional<core::TimePoint>& t, core::TimePoint start) {
  return t ? std::optional<double>(Seconds(*t - start)) : std::nullopt;
}
core::TimePoint FromStart(double s, core::TimePoint start) {
  return start + Duration(static_cast<int64_t>(std::llround(s * 1e9)));
}
std::optional<core::TimePoint> FromStart(const std::optional<double>& s, core::TimePoint start) {
  return s ? std::optional<core::TimePoint>(FromStart(*s, start)) : std::nullopt;
}

}  // namespace

void StateStore::Closer::operator()(sqlite3* db) const { sqlite3_close_v2(db); }

StateStore::StateStore(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}
StateStore::StateStore(StateStore&&) noexcept = default;
StateStore& StateStore::operator=(StateStore&&) noexcept = default;
StateStore::~StateStore() = default;

std::string StateStore::PathIn(const std::string& state_dir) {
  return JoinPath(state_dir, "controller.db");
}

Result<StateStore> StateStore::Open(const std::string& path) {
  return OpenWithFlags(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
}

Result<StateStore> StateStore::OpenExisting(const std::string& path) {
  if (!Env::Default()->Exists(path)) {
    return NotFound(path + ": no controller database here");
  }
  return OpenWithFlags(path, SQLITE_OPEN_READWRITE);
}

Result<StateStore> StateStore::OpenWithFlags(const std::string& path, int flags) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  StateStore store(path, raw);  // closes `raw` on every path, even on failure
  if (rc != SQLITE_OK) {
    return IOError(path + ": cannot open the controller database: " +
                   (raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  }
  ENDURE_RETURN_IF_ERROR(store.Init());
  return store;
}

Status StateStore::Error(const std::string& what) const {
  const int code = sqlite3_errcode(db_.get());
  const std::string message = path_ + ": " + what + ": " + sqlite3_errmsg(db_.get());
  if (code == SQLITE_NOTADB || code == SQLITE_CORRUPT) return DataLoss(message);
  return IOError(message);
}

Status StateStore::Exec(const char* sql) {
  if (sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
    return Error("SQL failed");
  }
  return Status::Ok();
}

Status StateStore::RolledBack(Status failed) {
  Status rollback = Exec("ROLLBACK");
  if (rollback.ok()) return failed;
  return Status(failed.code(), failed.message() + "; rolling the transaction back failed too (" +
                                   rollback.message() + ")");
}

Status StateStore::Init() {
  sqlite3_busy_timeout(db_.get(), 5000);
  // WAL: a reader (`endure report`) never blocks the controller. NORMAL
  // synchronous: a committed transaction survives the controller's own
  // death (kill -9, the OOM killer: it is in the WAL file), which is what
  // the journal must outlive; an OS crash or power cut may lose the last
  // few, never the database's consistency. FULL (an fsync per commit) cost
  // 3.2 ms per journaled input here against 0.08 ms (failover_bench).
  if (sqlite3_exec(db_.get(), "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", nullptr,
                   nullptr, nullptr) != SQLITE_OK) {
    return Error("not a usable SQLite database");
  }
  ENDURE_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto rollback = [&](Status st) { return RolledBack(std::move(st)); };
  if (Status st = Exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)");
      !st.ok()) {
    return rollback(st);
  }
  std::optional<int64_t> version;
  {
    Statement q(db_.get(), "SELECT version FROM schema_version");
    if (!q.prepared()) return rollback(Error("reading the schema version"));
    if (q.Step() == SQLITE_ROW) version = q.Int(0);
  }
  if (!version) {
    if (Status st = Exec(kSchema); !st.ok()) return rollback(st);
    if (Status st = Exec(kJournalTable); !st.ok()) return rollback(st);
    if (Status st = Exec(kIncidentSuspects); !st.ok()) return rollback(st);
    if (Status st = Exec(kIncidentRoute); !st.ok()) return rollback(st);
    if (Status st = Exec(kSnapshotTable); !st.ok()) return rollback(st);
    if (Status st = Exec(kHistoryTable); !st.ok()) return rollback(st);
    Statement ins(db_.get(), "INSERT INTO schema_version (version) VALUES (?)");
    ins.Bind(1, int64_t{kSchemaVersion});
    if (ins.Step() != SQLITE_DONE) return rollback(Error("writing the schema version"));
  } else if (*version >= 1 && *version < kSchemaVersion) {
    if (Status st = Migrate(static_cast<int>(*version)); !st.ok()) return rollback(st);
  } else if (*version != kSchemaVersion) {
    return rollback(DataLoss(path_ + ": controller database of schema version " +
                             std::to_string(*version) + "; this endure reads versions 1 to " +
                             std::to_string(kSchemaVersion) +
                             ": use the endure that ran the job, or a new state_dir"));
  }
  if (Status st = LoadCurrentRun(); !st.ok()) return rollback(st);
  return Exec("COMMIT");
}

Status StateStore::Migrate(int from) {
  // Inside Init's transaction: a failure leaves the older database as it was.
  const std::string what = "migrating from schema version " + std::to_string(from);
  std::vector<const char*> steps;
  if (from == 1) steps = {kRenameVersion1, kSchema, kJournalTable, kMigrateFrom1};
  if (from == 2) steps = {kMigrateFrom2, kJournalTable};
  if (from <= 3) steps.push_back(kIncidentSuspects);  // 3 -> 4
  if (from <= 4) steps.push_back(kIncidentRoute);     // 4 -> 5
  if (from <= 5) steps.push_back(kSnapshotTable);     // 5 -> 6
  steps.push_back(kHistoryTable);                     // 6 -> 7, the last step of each
  for (const char* sql : steps) {
    if (sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
      return Error(what);
    }
  }
  Statement up(db_.get(), "UPDATE schema_version SET version = ?");
  up.Bind(1, int64_t{kSchemaVersion});
  if (up.Step() != SQLITE_DONE) return Error(what);
  return Status::Ok();
}

Status StateStore::LoadCurrentRun() {
  Statement q(db_.get(), "SELECT COALESCE(MAX(run), 0) FROM runs");
  if (!q.prepared() || q.Step() != SQLITE_ROW) return Error("reading the runs");
  run_ = static_cast<int>(q.Int(0));
  return Status::Ok();
}

int StateStore::RunOrCurrent(int run) const { return run == kCurrentRun ? run_ : run; }

Status StateStore::NeedRun(const std::string& what) const {
  if (run_ > 0) return Status::Ok();
  return Internal(path_ + ": " + what + " before any run began (call BeginRun first)");
}

namespace {

// Binds a run's job columns, in the order of `runs`, to parameters 1..9.
void BindJob(Statement& s, const JobRecord& job) {
  s.Bind(1, job.name);
  s.Bind(2, job.spec_path);
  s.Bind(3, job.token_path);
  s.Bind(4, job.started_at_unix);
  s.Bind(5, job.finished_at_unix);
  s.Bind(6, job.exit_code ? std::optional<int64_t>(*job.exit_code) : std::nullopt);
  s.Bind(7, job.verdict);
  s.Bind(8, job.param_fingerprint);
  s.Bind(9, job.spec_digest);
}

}  // namespace

Result<int> StateStore::BeginRun(const JobRecord& job) {
  // The number is the newest in the database plus 1, in the insert itself:
  // another connection may have begun a run since Open.
  Statement s(db_.get(), R"sql(
    INSERT INTO runs (run, name, spec_path, token_path, started_at, finished_at, exit_code,
                      verdict, param_fingerprint, spec_digest)
    VALUES ((SELECT COALESCE(MAX(run), 0) + 1 FROM runs), ?, ?, ?, ?, ?, ?, ?, ?, ?))sql");
  if (!s.prepared()) return Error("beginning a run");
  BindJob(s, job);
  if (s.Step() != SQLITE_DONE) return Error("beginning a run");
  // `run` is the table's INTEGER PRIMARY KEY: the rowid.
  run_ = static_cast<int>(sqlite3_last_insert_rowid(db_.get()));
  return run_;
}

Status StateStore::SaveJob(const JobRecord& job) {
  ENDURE_RETURN_IF_ERROR(NeedRun("saving the job"));
  Statement s(db_.get(), R"sql(
    UPDATE runs SET name = ?, spec_path = ?, token_path = ?, started_at = ?, finished_at = ?,
      exit_code = ?, verdict = ?, param_fingerprint = ?, spec_digest = ? WHERE run = ?)sql");
  if (!s.prepared()) return Error("saving the job");
  BindJob(s, job);
  s.Bind(10, int64_t{run_});
  if (s.Step() != SQLITE_DONE) return Error("saving the job");
  return Status::Ok();
}

Result<JobRecord> StateStore::LoadJob(int run) {
  Statement q(db_.get(), R"sql(
    SELECT name, spec_path, token_path, started_at, finished_at, exit_code, verdict,
           param_fingerprint, spec_digest FROM runs WHERE run = ?)sql");
  if (!q.prepared()) return Error("loading the job");
  q.Bind(1, int64_t{RunOrCurrent(run)});
  const int rc = q.Step();
  if (rc == SQLITE_DONE) {
    if (run_ == 0) return NotFound(path_ + ": no job recorded yet");
    return NotFound(path_ + ": no run " + std::to_string(run) + " (runs 1 to " +
                    std::to_string(run_) + " are recorded)");
  }
  if (rc != SQLITE_ROW) return Error("loading the job");
  return JobFrom(q, 0);
}

Result<std::vector<RunSummary>> StateStore::LoadRuns() {
  Statement q(db_.get(), R"sql(
    SELECT r.run, r.name, r.spec_path, r.token_path, r.started_at, r.finished_at, r.exit_code,
           r.verdict, r.param_fingerprint, r.spec_digest,
           (SELECT COUNT(*) FROM incidents i WHERE i.run = r.run),
           (SELECT COUNT(*) FROM generations g WHERE g.run = r.run),
           EXISTS (SELECT 1 FROM report p WHERE p.run = r.run)
    FROM runs r ORDER BY r.run)sql");
  if (!q.prepared()) return Error("loading the runs");
  std::vector<RunSummary> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    RunSummary r;
    r.run = static_cast<int>(q.Int(0));
    r.job = JobFrom(q, 1);
    r.incidents = static_cast<int>(q.Int(10));
    r.generations = static_cast<int>(q.Int(11));
    r.has_report = q.Int(12) != 0;
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return Error("loading the runs");
  Statement l(db_.get(), "SELECT run, category, seconds FROM ledger ORDER BY run");
  if (!l.prepared()) return Error("loading the runs' ledgers");
  while ((rc = l.Step()) == SQLITE_ROW) {
    const int run = static_cast<int>(l.Int(0));
    for (RunSummary& r : out) {
      if (r.run == run) r.ledger_s[l.Text(1)] = l.Real(2);
    }
  }
  if (rc != SQLITE_DONE) return Error("loading the runs' ledgers");
  return out;
}

Status StateStore::SaveGeneration(const GenerationRecord& g) {
  ENDURE_RETURN_IF_ERROR(NeedRun("saving a generation"));
  Statement s(db_.get(), R"sql(
    INSERT INTO generations (run, generation, started_at, restore_step, world_size, nodes,
                             ended_at)
    VALUES (?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (run, generation) DO UPDATE SET started_at = excluded.started_at,
      restore_step = excluded.restore_step, world_size = excluded.world_size,
      nodes = excluded.nodes, ended_at = excluded.ended_at)sql");
  if (!s.prepared()) return Error("saving a generation");
  s.Bind(1, int64_t{run_});
  s.Bind(2, int64_t{g.generation});
  s.Bind(3, g.started_at_s);
  s.Bind(4, g.restore_step);
  s.Bind(5, int64_t{g.world_size});
  s.Bind(6, g.nodes);
  s.Bind(7, g.ended_at_s);
  if (s.Step() != SQLITE_DONE) {
    return Error("saving generation " + std::to_string(g.generation));
  }
  return Status::Ok();
}

Result<std::vector<GenerationRecord>> StateStore::LoadGenerations(int run) {
  Statement q(db_.get(), R"sql(
    SELECT generation, started_at, restore_step, world_size, nodes, ended_at
    FROM generations WHERE run = ? ORDER BY generation)sql");
  if (!q.prepared()) return Error("loading the generations");
  q.Bind(1, int64_t{RunOrCurrent(run)});
  std::vector<GenerationRecord> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    GenerationRecord g;
    g.generation = static_cast<int>(q.Int(0));
    g.started_at_s = q.Real(1);
    g.restore_step = q.Int(2);
    g.world_size = static_cast<int>(q.Int(3));
    g.nodes = q.Text(4);
    g.ended_at_s = q.OptReal(5);
    out.push_back(std::move(g));
  }
  if (rc != SQLITE_DONE) return Error("loading the generations");
  return out;
}

Status StateStore::SaveIncident(const core::Incident& inc, core::TimePoint job_start) {
  ENDURE_RETURN_IF_ERROR(NeedRun("saving an incident"));
  Statement s(db_.get(), R"sql(
    INSERT OR REPLACE INTO incidents (id, generation, cause, rank, node, node_name, injected_at,
      fault_at, detected_at, stopped_at, relaunched_at, ready_at, recovered_at, restore_s,
      failed_at_step, restored_step, action, reason, log_line, stacks, run, suspects, route,
      route_reason)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?))sql");
  if (!s.prepared()) return Error("saving an incident");
  s.Bind(21, int64_t{run_});
  s.Bind(1, int64_t{inc.id});
  s.Bind(2, int64_t{inc.generation.value});
  s.Bind(3, inc.cause.name);
  s.Bind(4, int64_t{inc.rank.value});
  s.Bind(5, int64_t{inc.node.value});
  s.Bind(6, inc.node_name);
  s.Bind(7, SinceStart(inc.injected_at, job_start));
  s.Bind(8, SinceStart(inc.fault_at, job_start));
  s.Bind(9, SinceStart(inc.detected_at, job_start));
  s.Bind(10, SinceStart(inc.stopped_at, job_start));
  s.Bind(11, SinceStart(inc.relaunched_at, job_start));
  s.Bind(12, SinceStart(inc.ready_at, job_start));
  s.Bind(13, SinceStart(inc.recovered_at, job_start));
  s.Bind(14, inc.restore_s);
  s.Bind(15, inc.failed_at_step.value);
  s.Bind(16, inc.restored_step.value);
  s.Bind(17, inc.action);
  s.Bind(18, inc.reason);
  s.Bind(19, inc.log_line);
  // A JSON array keeps each rank's multi-line stack intact.
  s.Bind(20, nlohmann::json(inc.stacks).dump());
  s.Bind(22, nlohmann::json(inc.suspects).dump());
  s.Bind(23, inc.route ? std::string(core::RecoveryRouteName(*inc.route)) : std::string());
  s.Bind(24, inc.route_reason);
  if (s.Step() != SQLITE_DONE) return Error("saving incident " + std::to_string(inc.id));
  return Status::Ok();
}

Result<std::vector<core::Incident>> StateStore::LoadIncidents(core::TimePoint job_start, int run) {
  Statement q(db_.get(), R"sql(
    SELECT id, generation, cause, rank, node, node_name, injected_at, fault_at, detected_at,
      stopped_at, relaunched_at, ready_at, recovered_at, restore_s, failed_at_step,
      restored_step, action, reason, log_line, stacks, suspects, route, route_reason
    FROM incidents WHERE run = ?
    ORDER BY id)sql");
  if (!q.prepared()) return Error("loading the incidents");
  q.Bind(1, int64_t{RunOrCurrent(run)});
  std::vector<core::Incident> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    core::Incident inc;
    inc.id = static_cast<int>(q.Int(0));
    inc.generation = core::Generation{static_cast<int32_t>(q.Int(1))};
    inc.cause = core::ParseIncidentCause(q.Text(2));
    inc.rank = core::Rank{static_cast<int32_t>(q.Int(3))};
    inc.node = core::NodeId{static_cast<int32_t>(q.Int(4))};
    inc.node_name = q.Text(5);
    inc.injected_at = FromStart(q.OptReal(6), job_start);
    inc.fault_at = FromStart(q.Real(7), job_start);
    inc.detected_at = FromStart(q.Real(8), job_start);
    inc.stopped_at = FromStart(q.OptReal(9), job_start);
    inc.relaunched_at = FromStart(q.OptReal(10), job_start);
    inc.ready_at = FromStart(q.OptReal(11), job_start);
    inc.recovered_at = FromStart(q.OptReal(12), job_start);
    inc.restore_s = q.Real(13);
    inc.failed_at_step = core::StepNumber{q.Int(14)};
    inc.restored_step = core::StepNumber{q.Int(15)};
    inc.action = q.Text(16);
    inc.reason = q.Text(17);
    inc.log_line = q.Text(18);
    nlohmann::json stacks = nlohmann::json::parse(q.Text(19), nullptr, /*allow_exceptions=*/false);
    if (!stacks.is_array()) {
      return DataLoss(path_ + ": incident " + std::to_string(inc.id) +
                      ": stacks are not a JSON array");
    }
    for (const nlohmann::json& s : stacks) {
      if (s.is_string()) inc.stacks.push_back(s.get<std::string>());
    }
    // Names only; anything else in a damaged row is dropped.
    nlohmann::json suspects = nlohmann::json::parse(q.Text(20), nullptr, false);
    if (suspects.is_array()) {
      for (const nlohmann::json& s : suspects) {
        if (s.is_string()) inc.suspects.push_back(s.get<std::string>());
      }
    }
    // A name this endure does not know (a damaged row) is no route.
    if (Result<core::RecoveryRoute> route = core::ParseRecoveryRoute(q.Text(21)); route.ok()) {
      inc.route = *route;
    }
    inc.route_reason = q.Text(22);
    out.push_back(std::move(inc));
  }
  if (rc != SQLITE_DONE) return Error("loading the incidents");
  return out;
}

Status StateStore::SaveLedger(const core::EttrLedger& ledger) {
  ENDURE_RETURN_IF_ERROR(NeedRun("saving the ledger"));
  // Its own transaction, unless it is part of the caller's (Transaction).
  const bool own = sqlite3_get_autocommit(db_.get()) != 0;
  if (own) ENDURE_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  for (int i = 0; i < core::kNumLedgerCategories; ++i) {
    const auto category = static_cast<core::LedgerCategory>(i);
    Statement s(db_.get(),
                "INSERT OR REPLACE INTO ledger (run, category, seconds) VALUES (?, ?, ?)");
    if (!s.prepared()) break;
    s.Bind(1, int64_t{run_});
    s.Bind(2, std::string(core::LedgerCategoryName(category)));
    s.Bind(3, Seconds(ledger.total(category)));
    if (s.Step() != SQLITE_DONE) {
      return own ? RolledBack(Error("saving the ledger")) : Error("saving the ledger");
    }
  }
  return own ? Exec("COMMIT") : Status::Ok();
}

Result<std::map<std::string, double>> StateStore::LoadLedger(int run) {
  Statement q(db_.get(), "SELECT category, seconds FROM ledger WHERE run = ?");
  if (!q.prepared()) return Error("loading the ledger");
  q.Bind(1, int64_t{RunOrCurrent(run)});
  std::map<std::string, double> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) out[q.Text(0)] = q.Real(1);
  if (rc != SQLITE_DONE) return Error("loading the ledger");
  return out;
}

Status StateStore::SaveHistory(const nlohmann::json& history) {
  ENDURE_RETURN_IF_ERROR(NeedRun("saving the history"));
  Statement s(db_.get(), "INSERT OR REPLACE INTO history (run, json) VALUES (?, ?)");
  if (!s.prepared()) return Error("saving the history");
  s.Bind(1, int64_t{run_});
  s.Bind(2, history.dump());
  if (s.Step() != SQLITE_DONE) return Error("saving the history");
  return Status::Ok();
}

Result<std::optional<nlohmann::json>> StateStore::LoadHistory(int run) {
  Statement q(db_.get(), "SELECT json FROM history WHERE run = ?");
  if (!q.prepared()) return Error("loading the history");
  q.Bind(1, int64_t{RunOrCurrent(run)});
  const int rc = q.Step();
  if (rc == SQLITE_DONE) return std::optional<nlohmann::json>();
  if (rc != SQLITE_ROW) return Error("loading the history");
  nlohmann::json j = nlohmann::json::parse(q.Text(0), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss(path_ + ": the saved history is not JSON");
  return std::optional<nlohmann::json>(std::move(j));
}

Status StateStore::SaveReport(const nlohmann::json& report) {
  ENDURE_RETURN_IF_ERROR(NeedRun("saving the report"));
  Statement s(db_.get(), "INSERT OR REPLACE INTO report (run, json) VALUES (?, ?)");
  if (!s.prepared()) return Error("saving the report");
  s.Bind(1, int64_t{run_});
  s.Bind(2, report.dump());
  if (s.Step() != SQLITE_DONE) return Error("saving the report");
  return Status::Ok();
}

Result<nlohmann::json> StateStore::LoadReport(int run) {
  Statement q(db_.get(), "SELECT json FROM report WHERE run = ?");
  if (!q.prepared()) return Error("loading the report");
  q.Bind(1, int64_t{RunOrCurrent(run)});
  const int rc = q.Step();
  if (rc == SQLITE_DONE)
    return NotFound(path_ + ": no final report yet (the job has not finished)");
  if (rc != SQLITE_ROW) return Error("loading the report");
  nlohmann::json report = nlohmann::json::parse(q.Text(0), nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded()) return DataLoss(path_ + ": the stored report is not valid JSON");
  return report;
}

Status StateStore::BeginTransaction() {
  if (sqlite3_get_autocommit(db_.get()) == 0) {
    return Internal(path_ + ": a transaction is already open");
  }
  return Exec("BEGIN IMMEDIATE");
}

Status StateStore::CommitTransaction() { return Exec("COMMIT"); }

Status StateStore::AbortTransaction() { return Exec("ROLLBACK"); }

Status StateStore::AppendJournal(const JournalEntry& entry) {
  ENDURE_RETURN_IF_ERROR(NeedRun("journaling an input"));
  // Prepared once: parsing the statement was most of an input's cost.
  if (!append_) {
    append_ = std::make_unique<Statement>(
        db_.get(), "INSERT INTO journal (run, seq, at_ns, event) VALUES (?, ?, ?, ?)");
  }
  if (!append_->prepared()) {
    append_.reset();
    return Error("journaling an input");
  }
  Statement& s = *append_;
  s.Bind(1, int64_t{run_});
  s.Bind(2, entry.seq);
  s.Bind(3, static_cast<int64_t>(entry.since_start.count()));
  s.Bind(4, entry.event);
  const int rc = s.Step();
  s.Reset();
  if (rc != SQLITE_DONE) return Error("journaling input " + std::to_string(entry.seq));
  return Status::Ok();
}

Result<std::vector<JournalEntry>> StateStore::LoadJournal(int run, int64_t after_seq) {
  Statement q(db_.get(),
              "SELECT seq, at_ns, event FROM journal WHERE run = ? AND seq > ? ORDER BY seq");
  if (!q.prepared()) return Error("loading the journal");
  q.Bind(1, int64_t{RunOrCurrent(run)});
  q.Bind(2, after_seq);
  std::vector<JournalEntry> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    out.push_back({q.Int(0), Duration(q.Int(1)), q.Text(2)});
  }
  if (rc != SQLITE_DONE) return Error("loading the journal");
  return out;
}

Status StateStore::SaveSnapshot(const SnapshotRecord& snapshot) {
  ENDURE_RETURN_IF_ERROR(NeedRun("saving a snapshot"));
  ENDURE_RETURN_IF_ERROR(BeginTransaction());
  {
    Statement s(db_.get(),
                "INSERT OR REPLACE INTO snapshots (run, seq, at_ns, state) VALUES (?, ?, ?, ?)");
    if (!s.prepared()) return RolledBack(Error("saving a snapshot"));
    s.Bind(1, int64_t{run_});
    s.Bind(2, snapshot.seq);
    s.Bind(3, static_cast<int64_t>(snapshot.since_start.count()));
    s.BindBlob(4, snapshot.state);
    if (s.Step() != SQLITE_DONE) return RolledBack(Error("saving a snapshot"));
    Statement cut(db_.get(), "DELETE FROM journal WHERE run = ? AND seq <= ?");
    if (!cut.prepared()) return RolledBack(Error("cutting the journal"));
    cut.Bind(1, int64_t{run_});
    cut.Bind(2, snapshot.seq);
    if (cut.Step() != SQLITE_DONE) return RolledBack(Error("cutting the journal"));
  }
  return CommitTransaction();
}

Result<std::optional<SnapshotRecord>> StateStore::LoadSnapshot(int run) {
  Statement q(db_.get(), "SELECT seq, at_ns, state FROM snapshots WHERE run = ?");
  if (!q.prepared()) return Error("loading the snapshot");
  q.Bind(1, int64_t{RunOrCurrent(run)});
  const int rc = q.Step();
  if (rc == SQLITE_DONE) return std::optional<SnapshotRecord>();
  if (rc != SQLITE_ROW) return Error("loading the snapshot");
  return std::optional<SnapshotRecord>(SnapshotRecord{q.Int(0), Duration(q.Int(1)), q.Blob(2)});
}

}  // namespace endure::controller
