// StateStore: the controller's durable state in SQLite, STATE_DIR/controller.db.
// It holds the runs of the job in that state directory: each controller
// start begins a new run (1, 2, ...) and nothing of an earlier run is
// deleted. A run holds the job as that start saw it (name, spec, token file,
// start and end, exit code, verdict, final parameter fingerprint), its
// generations, its incidents, its ETTR ledger and its final report, so that
// `endure report STATE_DIR` can print any run's report again and the history
// of the runs before it.
//
// Every Save* is an upsert into the current run (the one BeginRun began):
// the controller calls it again whenever the thing changes (SaveIncident on
// each step of an incident's timeline, SaveLedger now and then). Each call is
// one transaction; the database is in WAL mode, so a crash leaves either the
// old or the new row. Every Load* reads the current run, or the run it is
// given.
//
// Times inside a run (generations, incidents) are stored as seconds since
// the run started, so they survive a controller restart with a new steady
// clock; a run's own start and end are Unix times (seconds).
//
// Each run also keeps its journal: every input the controller fed its
// decision core (core::JobMachine), in order, with its time, written in the
// same transaction as what the input changed (incidents, the ledger) and
// before the controller acts on it. Now and then the controller saves a
// snapshot of its decision core and the journal behind it is cut (each run
// keeps its newest). A controller that starts on the state directory of an
// unfinished run restores the snapshot, replays the journal after it and
// carries the run on.
//
// A database of schema version 1 (one job, before runs) is migrated when
// opened: its job and everything it held become run 1. One of version 2
// (runs, no journal) gains the journal table and the spec digest column;
// every older one gains the snapshots table.
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
class Statement;
}  // namespace endure::controller

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
  // The spec the run was started with (JobSpecDigest): a controller carries
  // on an unfinished run only under the same spec.
  std::string spec_digest;
};

// One input of the job's decision core, as the controller fed it: in order
// (`seq` from 1), at `since_start` since the run's start, the event as
// core::EncodeEvent writes it.
struct JournalEntry {
  int64_t seq = 0;
  Duration since_start{0};
  std::string event;
};

// The decision core's state as of journal entry `seq` (JobMachine::Snapshot),
// taken at `since_start`: a restart restores it and replays the journal that
// follows.
struct SnapshotRecord {
  int64_t seq = 0;
  Duration since_start{0};
  std::string state;
};

struct GenerationRecord {
  int generation = 0;
  double started_at_s = 0;    // since the job started
  int64_t restore_step = -1;  // as in StartGenerationAction
  int world_size = 0;
  std::string nodes;  // e.g. "node0,node1", in rank order
  std::optional<double> ended_at_s;
};

// One run as LoadRuns lists it: its job record and what it held.
struct RunSummary {
  int run = 0;
  JobRecord job;
  int incidents = 0;
  int generations = 0;
  std::map<std::string, double> ledger_s;  // as LoadLedger; empty before SaveLedger
  bool has_report = false;                 // its final report was saved
};

class StateStore {
 public:
  // For the Load* calls: the current run.
  static constexpr int kCurrentRun = 0;

  // The database file of a state directory: STATE_DIR/controller.db.
  static std::string PathIn(const std::string& state_dir);

  // Opens the database at `path`, creating the file and the schema when
  // missing (the directory must exist), migrating one of an older schema
  // version. The current run is then the newest one recorded (none in a new
  // database). IOError when SQLite cannot open or create it; DataLoss when
  // it is not a database, or one of a schema version this endure does not
  // know (written by a newer one).
  static Result<StateStore> Open(const std::string& path);

  // Opens an existing database only: NotFound when `path` does not exist.
  static Result<StateStore> OpenExisting(const std::string& path);

  StateStore(StateStore&&) noexcept;
  StateStore& operator=(StateStore&&) noexcept;
  ~StateStore();

  const std::string& path() const { return path_; }

  // Begins a new run, numbered the newest one in the database plus 1, with
  // `job` as its record, and makes it the current run; returns its number.
  // IOError when it cannot be written.
  Result<int> BeginRun(const JobRecord& job);
  // The current run: the one BeginRun began, or after Open the newest one
  // recorded; 0 while the database holds none.
  int run() const { return run_; }
  // Every run, ascending.
  Result<std::vector<RunSummary>> LoadRuns();

  // The Save* calls write to the current run: Internal before any run began
  // (a database opened without one and no BeginRun yet).

  // Updates the current run's job record.
  Status SaveJob(const JobRecord& job);
  // NotFound when there is no such run (before the first BeginRun).
  Result<JobRecord> LoadJob(int run = kCurrentRun);

  Status SaveGeneration(const GenerationRecord& generation);
  // Ascending by generation; empty for a run without any (or none at all).
  Result<std::vector<GenerationRecord>> LoadGenerations(int run = kCurrentRun);

  // Upserts incident `incident.id`; times become seconds since `job_start`.
  Status SaveIncident(const core::Incident& incident, core::TimePoint job_start);
  // Ascending by id; times are `job_start` + the stored seconds (to the
  // nearest nanosecond a double holds).
  Result<std::vector<core::Incident>> LoadIncidents(core::TimePoint job_start,
                                                    int run = kCurrentRun);

  // Replaces the ledger with `ledger`'s totals per category.
  Status SaveLedger(const core::EttrLedger& ledger);
  // The run's history (controller/live_history.h's JSON), replacing the
  // one saved before; none before the first save.
  Status SaveHistory(const nlohmann::json& history);
  Result<std::optional<nlohmann::json>> LoadHistory(int run = kCurrentRun);
  // Category name (LedgerCategoryName) -> seconds; empty before SaveLedger.
  Result<std::map<std::string, double>> LoadLedger(int run = kCurrentRun);

  // One transaction around several calls (a journaled input and what it
  // changed): Begin, the calls, then Commit, or Abort after an error.
  // Internal when one is open already.
  [[nodiscard]] Status BeginTransaction();
  [[nodiscard]] Status CommitTransaction();
  [[nodiscard]] Status AbortTransaction();

  // Appends an input to the current run's journal. AlreadyExists-like
  // errors (a `seq` written before) are IOError naming the entry.
  Status AppendJournal(const JournalEntry& entry);
  // The run's journal after entry `after_seq`, in order; empty for a run
  // that journaled nothing since.
  Result<std::vector<JournalEntry>> LoadJournal(int run = kCurrentRun, int64_t after_seq = 0);

  // Replaces the run's snapshot with `snapshot` and cuts the journal behind
  // it (its entries up to snapshot.seq), in one transaction of its own.
  Status SaveSnapshot(const SnapshotRecord& snapshot);
  // The run's snapshot; nullopt when it has none.
  Result<std::optional<SnapshotRecord>> LoadSnapshot(int run = kCurrentRun);

  Status SaveReport(const nlohmann::json& report);
  // NotFound until SaveReport in that run (it has not finished, or its
  // controller died first).
  Result<nlohmann::json> LoadReport(int run = kCurrentRun);

 private:
  struct Closer {
    void operator()(sqlite3* db) const;
  };

  StateStore(std::string path, sqlite3* db);
  static Result<StateStore> OpenWithFlags(const std::string& path, int flags);
  Status Init();
  // Version `from` (1 or 2) -> the current one, inside Init's transaction.
  Status Migrate(int from);
  Status LoadCurrentRun();
  int RunOrCurrent(int run) const;
  // Internal unless a run is current; `what` names the write.
  Status NeedRun(const std::string& what) const;
  Status Exec(const char* sql);
  // Rolls back the open transaction after `failed`; returns `failed`, with
  // the rollback's own error added when that fails too.
  Status RolledBack(Status failed);
  Status Error(const std::string& what) const;

  std::string path_;
  std::unique_ptr<sqlite3, Closer> db_;
  int run_ = 0;  // the current run; 0 while there is none
  // AppendJournal's statement, kept (finalized before db_ closes).
  std::unique_ptr<Statement> append_;
};

}  // namespace endure::controller
