// IncidentKb: the incident knowledge base, in SQLite (STATE_DIR/incidents.db,
// where STATE_DIR is the spec's [cluster] state_dir, shared by every job that
// names it, or the job's own state directory). Every incident of every job is
// kept with its signature — the log excerpt that explains it (as printed and
// normalized), its cause, the log rule that matched, the stuck rank's stack
// signature, the node — and its resolution: what the controller did, and what
// an operator recorded later (`endure incidents resolve`).
//
// A new incident is compared with the earlier ones (core::FindSimilar): the
// most similar, with their resolutions, are the proposal the controller puts
// in the incident ("recurrence" in the report) and `endure incidents
// --similar ID` prints. TSGuard (FSE'26) found GPU incidents recur 8.78 times
// on average in Azure, and matching against past ones resolved half of them.
//
// Several controllers may hold the file at once (SQLite's locking and a busy
// timeout); every write is one transaction. Not thread-safe: one owner.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/sqlite_statement.h"
#include "core/incident_match.h"
#include "core/log_classifier.h"

namespace endure::controller {

// How many of the newest incidents a new one is compared with (Similar):
// about 20 ms of matching here.
inline constexpr int64_t kKbCompared = 5'000;

struct KbIncident {
  int64_t id = 0;        // the knowledge base's own, over all jobs
  std::string job;       // the job's name
  std::string job_dir;   // its state directory
  int64_t run = 0;       // its run (endure run, or a resume) there
  int job_incident = 0;  // the incident's id in the job's report
  int64_t at_unix_ms = 0;
  std::string node;
  int rank = -1;
  std::string cause;
  std::string action;    // what the controller did (restart_in_place, evict_node, ...)
  std::string log_rule;  // the log rule that matched; empty: none did
  std::optional<core::LogAction> log_action;  // that rule's action
  std::string excerpt;                        // the worker's last words, as printed (bounded)
  std::string normalized;                     // core::NormalizeExcerpt(excerpt)
  std::string stack_signature;
  // An operator's resolution; empty until one is recorded.
  std::optional<core::LogAction> resolution;
  std::string resolution_cause;
  std::string resolution_note;
  int64_t resolved_at_unix_ms = 0;

  core::IncidentText Text() const { return {id, cause, normalized, stack_signature}; }
};

// A past incident like a new one, and what was done about it.
struct Recurrence {
  int64_t id = 0;
  double score = 0;
  std::string job;
  int job_incident = 0;
  std::string cause;
  std::string action;  // the operator's resolution when there is one, else the controller's
  std::string note;    // the operator's note
  bool resolved = false;
};

class IncidentKb {
 public:
  // STATE_DIR/incidents.db.
  static std::string PathIn(const std::string& state_dir);
  // Opens (creating when missing) the knowledge base at `path`; the directory
  // must exist. IOError naming the path, or DataLoss when it is no database.
  static Result<IncidentKb> Open(const std::string& path);
  // NotFound when `path` does not exist.
  static Result<IncidentKb> OpenExisting(const std::string& path);

  const std::string& path() const { return path_; }

  // Records `incident` (its id is ignored) and returns its id. The same
  // (job_dir, run, job_incident) recorded again — a controller replaying its
  // journal — returns the first id and changes nothing.
  Result<int64_t> Record(const KbIncident& incident);
  // Updates what the controller did (an incident's action changes as it
  // recovers).
  Status UpdateAction(int64_t id, const std::string& action);
  // Records an operator's resolution. NotFound for an unknown id.
  Status Resolve(int64_t id, core::LogAction action, const std::string& cause,
                 const std::string& note, int64_t at_unix_ms);

  Result<std::optional<KbIncident>> Get(int64_t id);
  // Every incident, oldest first; with `newest` > 0, the newest that many.
  Result<std::vector<KbIncident>> List(int64_t newest = 0);

  // The `k` incidents most like `incident` (never itself), at least
  // `min_score` similar, best first; resolved ones before unresolved at equal
  // scores. `earlier_only`: among those recorded before it (a smaller id).
  // Compared with the newest `compared` incidents only (kKbCompared): the
  // controller asks on its event loop at each incident, and a base shared by
  // every job of a cluster grows without end.
  Result<std::vector<Recurrence>> Similar(const KbIncident& incident, int k, double min_score,
                                          bool earlier_only, int64_t compared = kKbCompared);

 private:
  IncidentKb(std::string path, SqliteHandle db) : path_(std::move(path)), db_(std::move(db)) {}
  static Result<IncidentKb> OpenWithFlags(const std::string& path, int flags);
  Status Error(const std::string& what) const { return SqliteError(db_.get(), path_, what); }

  std::string path_;
  SqliteHandle db_;
};

}  // namespace endure::controller
