// StateStore: the controller's durable state in SQLite, STATE_DIR/controller.db.
// It holds the job (name, spec, token file, start and end, exit code,
// verdict, final parameter fingerprint), its generations, its incidents, the
// ETTR ledger and the final report, so that a restarted controller carries on
// and `endure report STATE_DIR` can print the report again.
//
// Every Save* is an upsert: the controller calls it again whenever the thing
// changes (SaveIncident on each step of an incident's timeline, SaveLedger
// now and then). Each call is one transaction; the database is in WAL mode,
// so a crash leaves either the old or the new row.
//
// Times inside the job (generations, incidents) are stored as seconds since
// the job started, so they survive a controller restart with a new steady
// clock; the job's own start and end are Unix times (seconds).
//
// One SQLite connection; a StateStore is not thread-safe: the controller's
// event loop owns it. Errors are Status values naming the database path.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "core/ettr_ledger.h"
#include "core/ids.h"
#include "core/job_machine.h"

struct sqlite3;

namespace endure::controller {

struct JobRecord {
  std::string name;
  std::string spec_path;
  std::string token_path;
  double started_at_unix = 0;              // seconds since the epoch
  std::optional<double> finished_at_unix;  // unset while running
  std::optional<int> exit_code;            // unset while running
  std::string verdict;                     // why it ended, e.g. "training completed"
  std::string param_fingerprint;           // the trainer's final one
};

struct GenerationRecord {
  int generation = 0;
  double started_at_s = 0;    // since the job started
  int64_t restore_step = -1;  // as in StartGenerationAction
  int world_size = 0;
  std::string nodes;  // e.g. "node0,node1", in rank order
  std::optional<double> ended_at_s;
};

class StateStore {
 public:
  // The database file of a state directory: STATE_DIR/controller.db.
  static std::string PathIn(const std::string& state_dir);

  // Opens the database at `path`, creating the file and the schema when
  // missing (the directory must exist). IOError when SQLite cannot open or
  // create it; DataLoss when it is not a database of this schema version.
  static Result<StateStore> Open(const std::string& path);

  // Opens an existing database only: NotFound when `path` does not exist.
  static Result<StateStore> OpenExisting(const std::string& path);

  StateStore(StateStore&&) noexcept = default;
  StateStore& operator=(StateStore&&) noexcept = default;
  ~StateStore() = default;

  const std::string& path() const { return path_; }

  // The one job of this store.
  Status SaveJob(const JobRecord& job);
  // NotFound before the first SaveJob.
  Result<JobRecord> LoadJob();

  Status SaveGeneration(const GenerationRecord& generation);
  // Ascending by generation.
  Result<std::vector<GenerationRecord>> LoadGenerations();

  // Upserts incident `incident.id`; times become seconds since `job_start`.
  Status SaveIncident(const core::Incident& incident, core::TimePoint job_start);
  // Ascending by id; times are `job_start` + the stored seconds (to the
  // nearest nanosecond a double holds).
  Result<std::vector<core::Incident>> LoadIncidents(core::TimePoint job_start);

  // Replaces the ledger with `ledger`'s totals per category.
  Status SaveLedger(const core::EttrLedger& ledger);
  // Category name (LedgerCategoryName) -> seconds; empty before SaveLedger.
  Result<std::map<std::string, double>> LoadLedger();

  Status SaveReport(const nlohmann::json& report);
  // NotFound until SaveReport (the job has not finished).
  Result<nlohmann::json> LoadReport();

 private:
  struct Closer {
    void operator()(sqlite3* db) const;
  };

  StateStore(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}
  static Result<StateStore> OpenWithFlags(const std::string& path, int flags);
  Status Init();
  Status Exec(const char* sql);
  // Rolls back the open transaction after `failed`; returns `failed`, with
  // the rollback's own error added when that fails too.
  Status RolledBack(Status failed);
  Status Error(const std::string& what) const;

  std::string path_;
  std::unique_ptr<sqlite3, Closer> db_;
};

}  // namespace endure::controller
