// StateStore on the SQLite C API; see state_store.h.
#include "controller/state_store.h"

#include <sqlite3.h>

#include <cmath>
#include <utility>

#include "common/env.h"

namespace endure::controller {
namespace {

constexpr int kSchemaVersion = 1;

constexpr char kSchema[] = R"sql(
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

// A prepared statement. Bind indexes are 1-based, column indexes 0-based, as
// in SQLite.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool prepared() const { return rc_ == SQLITE_OK; }

  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  void Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  template <typename T>
  void Bind(int i, const std::optional<T>& v) {
    if (v) {
      Bind(i, *v);
    } else {
      sqlite3_bind_null(stmt_, i);
    }
  }

  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return sqlite3_step(stmt_); }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const { return sqlite3_column_double(stmt_, col); }
  bool Null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::optional<double> OptReal(int col) const {
    return Null(col) ? std::nullopt : std::optional<double>(Real(col));
  }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p == nullptr ? ""
                        : std::string(reinterpret_cast<const char*>(p),
                                      static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

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
  // WAL: a reader (`endure report`) never blocks the controller; FULL
  // synchronous: a committed transaction survives a power cut, and the
  // controller writes rarely enough not to notice.
  if (sqlite3_exec(db_.get(), "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", nullptr, nullptr,
                   nullptr) != SQLITE_OK) {
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
    Statement ins(db_.get(), "INSERT INTO schema_version (version) VALUES (?)");
    ins.Bind(1, int64_t{kSchemaVersion});
    if (ins.Step() != SQLITE_DONE) return rollback(Error("writing the schema version"));
  } else if (*version != kSchemaVersion) {
    return rollback(DataLoss(path_ + ": controller database of schema version " +
                             std::to_string(*version) + "; this endure reads version " +
                             std::to_string(kSchemaVersion) +
                             ": use the endure that ran the job, or a new state_dir"));
  }
  return Exec("COMMIT");
}

Status StateStore::SaveJob(const JobRecord& job) {
  Statement s(db_.get(), R"sql(
    INSERT INTO job (id, name, spec_path, token_path, started_at, finished_at, exit_code,
                     verdict, param_fingerprint)
    VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET name = excluded.name, spec_path = excluded.spec_path,
      token_path = excluded.token_path, started_at = excluded.started_at,
      finished_at = excluded.finished_at, exit_code = excluded.exit_code,
      verdict = excluded.verdict, param_fingerprint = excluded.param_fingerprint)sql");
  if (!s.prepared()) return Error("saving the job");
  s.Bind(1, job.name);
  s.Bind(2, job.spec_path);
  s.Bind(3, job.token_path);
  s.Bind(4, job.started_at_unix);
  s.Bind(5, job.finished_at_unix);
  s.Bind(6, job.exit_code ? std::optional<int64_t>(*job.exit_code) : std::nullopt);
  s.Bind(7, job.verdict);
  s.Bind(8, job.param_fingerprint);
  if (s.Step() != SQLITE_DONE) return Error("saving the job");
  return Status::Ok();
}

Result<JobRecord> StateStore::LoadJob() {
  Statement q(db_.get(), R"sql(
    SELECT name, spec_path, token_path, started_at, finished_at, exit_code, verdict,
           param_fingerprint FROM job WHERE id = 1)sql");
  if (!q.prepared()) return Error("loading the job");
  const int rc = q.Step();
  if (rc == SQLITE_DONE) return NotFound(path_ + ": no job recorded yet");
  if (rc != SQLITE_ROW) return Error("loading the job");
  JobRecord job;
  job.name = q.Text(0);
  job.spec_path = q.Text(1);
  job.token_path = q.Text(2);
  job.started_at_unix = q.Real(3);
  job.finished_at_unix = q.OptReal(4);
  if (!q.Null(5)) job.exit_code = static_cast<int>(q.Int(5));
  job.verdict = q.Text(6);
  job.param_fingerprint = q.Text(7);
  return job;
}

Status StateStore::SaveGeneration(const GenerationRecord& g) {
  Statement s(db_.get(), R"sql(
    INSERT INTO generations (generation, started_at, restore_step, world_size, nodes, ended_at)
    VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (generation) DO UPDATE SET started_at = excluded.started_at,
      restore_step = excluded.restore_step, world_size = excluded.world_size,
      nodes = excluded.nodes, ended_at = excluded.ended_at)sql");
  if (!s.prepared()) return Error("saving a generation");
  s.Bind(1, int64_t{g.generation});
  s.Bind(2, g.started_at_s);
  s.Bind(3, g.restore_step);
  s.Bind(4, int64_t{g.world_size});
  s.Bind(5, g.nodes);
  s.Bind(6, g.ended_at_s);
  if (s.Step() != SQLITE_DONE) {
    return Error("saving generation " + std::to_string(g.generation));
  }
  return Status::Ok();
}

Result<std::vector<GenerationRecord>> StateStore::LoadGenerations() {
  Statement q(db_.get(), R"sql(
    SELECT generation, started_at, restore_step, world_size, nodes, ended_at
    FROM generations ORDER BY generation)sql");
  if (!q.prepared()) return Error("loading the generations");
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
  Statement s(db_.get(), R"sql(
    INSERT OR REPLACE INTO incidents (id, generation, cause, rank, node, node_name, injected_at,
      fault_at, detected_at, stopped_at, relaunched_at, ready_at, recovered_at, restore_s,
      failed_at_step, restored_step, action, reason, log_line, stacks)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?))sql");
  if (!s.prepared()) return Error("saving an incident");
  s.Bind(1, int64_t{inc.id});
  s.Bind(2, int64_t{inc.generation});
  s.Bind(3, inc.cause);
  s.Bind(4, int64_t{inc.rank});
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
  s.Bind(15, inc.failed_at_step);
  s.Bind(16, inc.restored_step);
  s.Bind(17, inc.action);
  s.Bind(18, inc.reason);
  s.Bind(19, inc.log_line);
  // A JSON array keeps each rank's multi-line stack intact.
  s.Bind(20, nlohmann::json(inc.stacks).dump());
  if (s.Step() != SQLITE_DONE) return Error("saving incident " + std::to_string(inc.id));
  return Status::Ok();
}

Result<std::vector<core::Incident>> StateStore::LoadIncidents(core::TimePoint job_start) {
  Statement q(db_.get(), R"sql(
    SELECT id, generation, cause, rank, node, node_name, injected_at, fault_at, detected_at,
      stopped_at, relaunched_at, ready_at, recovered_at, restore_s, failed_at_step,
      restored_step, action, reason, log_line, stacks FROM incidents ORDER BY id)sql");
  if (!q.prepared()) return Error("loading the incidents");
  std::vector<core::Incident> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    core::Incident inc;
    inc.id = static_cast<int>(q.Int(0));
    inc.generation = static_cast<int>(q.Int(1));
    inc.cause = q.Text(2);
    inc.rank = static_cast<int>(q.Int(3));
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
    inc.failed_at_step = q.Int(14);
    inc.restored_step = q.Int(15);
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
    out.push_back(std::move(inc));
  }
  if (rc != SQLITE_DONE) return Error("loading the incidents");
  return out;
}

Status StateStore::SaveLedger(const core::EttrLedger& ledger) {
  ENDURE_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  for (int i = 0; i < core::kNumLedgerCategories; ++i) {
    const auto category = static_cast<core::LedgerCategory>(i);
    Statement s(db_.get(), "INSERT OR REPLACE INTO ledger (category, seconds) VALUES (?, ?)");
    if (!s.prepared()) break;
    s.Bind(1, std::string(core::LedgerCategoryName(category)));
    s.Bind(2, Seconds(ledger.total(category)));
    if (s.Step() != SQLITE_DONE) {
      return RolledBack(Error("saving the ledger"));
    }
  }
  return Exec("COMMIT");
}

Result<std::map<std::string, double>> StateStore::LoadLedger() {
  Statement q(db_.get(), "SELECT category, seconds FROM ledger");
  if (!q.prepared()) return Error("loading the ledger");
  std::map<std::string, double> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) out[q.Text(0)] = q.Real(1);
  if (rc != SQLITE_DONE) return Error("loading the ledger");
  return out;
}

Status StateStore::SaveReport(const nlohmann::json& report) {
  Statement s(db_.get(), "INSERT OR REPLACE INTO report (id, json) VALUES (1, ?)");
  if (!s.prepared()) return Error("saving the report");
  s.Bind(1, report.dump());
  if (s.Step() != SQLITE_DONE) return Error("saving the report");
  return Status::Ok();
}

Result<nlohmann::json> StateStore::LoadReport() {
  Statement q(db_.get(), "SELECT json FROM report WHERE id = 1");
  if (!q.prepared()) return Error("loading the report");
  const int rc = q.Step();
  if (rc == SQLITE_DONE)
    return NotFound(path_ + ": no final report yet (the job has not finished)");
  if (rc != SQLITE_ROW) return Error("loading the report");
  nlohmann::json report = nlohmann::json::parse(q.Text(0), nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded()) return DataLoss(path_ + ": the stored report is not valid JSON");
  return report;
}

}  // namespace endure::controller
