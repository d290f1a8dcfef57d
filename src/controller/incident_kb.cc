// IncidentKb on the SQLite C API; see incident_kb.h.
#include "controller/incident_kb.h"

#include <sqlite3.h>

#include <algorithm>
#include <map>

#include "common/env.h"

namespace endure::controller {
namespace {

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS incidents (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job TEXT NOT NULL,
  job_dir TEXT NOT NULL,
  run INTEGER NOT NULL,
  job_incident INTEGER NOT NULL,
  at_ms INTEGER NOT NULL,
  node TEXT NOT NULL,
  rank INTEGER NOT NULL,
  cause TEXT NOT NULL,
  action TEXT NOT NULL,
  log_rule TEXT NOT NULL,
  log_action TEXT NOT NULL,
  excerpt TEXT NOT NULL,
  normalized TEXT NOT NULL,
  stack_signature TEXT NOT NULL,
  resolution TEXT,
  resolution_cause TEXT NOT NULL DEFAULT '',
  resolution_note TEXT NOT NULL DEFAULT '',
  resolved_at_ms INTEGER NOT NULL DEFAULT 0,
  UNIQUE (job_dir, run, job_incident)
);
)sql";

constexpr char kColumns[] =
    "id, job, job_dir, run, job_incident, at_ms, node, rank, cause, action, log_rule, "
    "log_action, excerpt, normalized, stack_signature, resolution, resolution_cause, "
    "resolution_note, resolved_at_ms";

KbIncident Row(const Statement& q) {
  KbIncident k;
  k.id = q.Int(0);
  k.job = q.Text(1);
  k.job_dir = q.Text(2);
  k.run = q.Int(3);
  k.job_incident = static_cast<int>(q.Int(4));
  k.at_unix_ms = q.Int(5);
  k.node = q.Text(6);
  k.rank = static_cast<int>(q.Int(7));
  k.cause = q.Text(8);
  k.action = q.Text(9);
  k.log_rule = q.Text(10);
  if (Result<core::LogAction> a = core::ParseLogAction(q.Text(11)); a.ok()) k.log_action = *a;
  k.excerpt = q.Text(12);
  k.normalized = q.Text(13);
  k.stack_signature = q.Text(14);
  // A resolution this endure cannot read (a newer one wrote it) is none.
  if (!q.Null(15)) {
    if (Result<core::LogAction> a = core::ParseLogAction(q.Text(15)); a.ok()) k.resolution = *a;
  }
  k.resolution_cause = q.Text(16);
  k.resolution_note = q.Text(17);
  k.resolved_at_unix_ms = q.Int(18);
  return k;
}

}  // namespace

std::string IncidentKb::PathIn(const std::string& state_dir) {
  return JoinPath(state_dir, "incidents.db");
}

Result<IncidentKb> IncidentKb::Open(const std::string& path) {
  return OpenWithFlags(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
}

Result<IncidentKb> IncidentKb::OpenExisting(const std::string& path) {
  if (!Env::Default()->Exists(path)) {
    return NotFound(path + ": no incident knowledge base (no job has recorded an incident here)");
  }
  return OpenWithFlags(path, SQLITE_OPEN_READWRITE);
}

Result<IncidentKb> IncidentKb::OpenWithFlags(const std::string& path, int flags) {
  ENDURE_ASSIGN_OR_RETURN(SqliteHandle db,
                          OpenSqlite(path, flags, kSchema, "incident knowledge base"));
  return IncidentKb(path, std::move(db));
}

Result<int64_t> IncidentKb::Record(const KbIncident& k) {
  {
    Statement q(db_.get(),
                "INSERT OR IGNORE INTO incidents (job, job_dir, run, job_incident, at_ms, node, "
                "rank, cause, action, log_rule, log_action, excerpt, normalized, "
                "stack_signature) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    if (!q.prepared()) return Error("recording an incident");
    q.Bind(1, k.job);
    q.Bind(2, k.job_dir);
    q.Bind(3, k.run);
    q.Bind(4, static_cast<int64_t>(k.job_incident));
    q.Bind(5, k.at_unix_ms);
    q.Bind(6, k.node);
    q.Bind(7, static_cast<int64_t>(k.rank));
    q.Bind(8, k.cause);
    q.Bind(9, k.action);
    q.Bind(10, k.log_rule);
    q.Bind(11, k.log_action ? std::string(core::LogActionName(*k.log_action)) : std::string());
    q.Bind(12, k.excerpt);
    q.Bind(13, k.normalized);
    q.Bind(14, k.stack_signature);
    if (q.Step() != SQLITE_DONE) return Error("recording an incident");
  }
  Statement q(db_.get(),
              "SELECT id FROM incidents WHERE job_dir = ? AND run = ? AND job_incident = ?");
  if (!q.prepared()) return Error("reading an incident's id");
  q.Bind(1, k.job_dir);
  q.Bind(2, k.run);
  q.Bind(3, static_cast<int64_t>(k.job_incident));
  if (q.Step() != SQLITE_ROW) return Error("reading an incident's id");
  return q.Int(0);
}

Status IncidentKb::UpdateAction(int64_t id, const std::string& action) {
  Statement q(db_.get(), "UPDATE incidents SET action = ? WHERE id = ?");
  if (!q.prepared()) return Error("updating an incident");
  q.Bind(1, action);
  q.Bind(2, id);
  if (q.Step() != SQLITE_DONE) return Error("updating incident " + std::to_string(id));
  return Status::Ok();
}

Status IncidentKb::Resolve(int64_t id, core::LogAction action, const std::string& cause,
                           const std::string& note, int64_t at_unix_ms) {
  Statement q(db_.get(),
              "UPDATE incidents SET resolution = ?, resolution_cause = ?, resolution_note = ?, "
              "resolved_at_ms = ? WHERE id = ?");
  if (!q.prepared()) return Error("resolving an incident");
  q.Bind(1, std::string(core::LogActionName(action)));
  q.Bind(2, cause);
  q.Bind(3, note);
  q.Bind(4, at_unix_ms);
  q.Bind(5, id);
  if (q.Step() != SQLITE_DONE) return Error("resolving incident " + std::to_string(id));
  if (sqlite3_changes(db_.get()) == 0) {
    return NotFound(path_ + ": no incident " + std::to_string(id) +
                    "; `endure incidents DIR` lists them");
  }
  return Status::Ok();
}

Result<std::optional<KbIncident>> IncidentKb::Get(int64_t id) {
  Statement q(db_.get(),
              (std::string("SELECT ") + kColumns + " FROM incidents WHERE id = ?").c_str());
  if (!q.prepared()) return Error("reading an incident");
  q.Bind(1, id);
  const int rc = q.Step();
  if (rc == SQLITE_DONE) return std::optional<KbIncident>();
  if (rc != SQLITE_ROW) return Error("reading incident " + std::to_string(id));
  return std::optional<KbIncident>(Row(q));
}

Result<std::vector<KbIncident>> IncidentKb::List(int64_t newest) {
  Statement q(db_.get(), (std::string("SELECT ") + kColumns +
                          " FROM (SELECT * FROM incidents ORDER BY id DESC LIMIT ?) ORDER BY id")
                             .c_str());
  if (!q.prepared()) return Error("reading incidents");
  q.Bind(1, newest > 0 ? newest : int64_t{-1});  // -1: no limit
  std::vector<KbIncident> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) out.push_back(Row(q));
  if (rc != SQLITE_DONE) return Error("reading incidents");
  return out;
}

Result<std::vector<Recurrence>> IncidentKb::Similar(const KbIncident& incident, int k,
                                                    double min_score, bool earlier_only,
                                                    int64_t compared) {
  // The newest `compared` before it (earlier_only) or of all.
  const bool before = earlier_only && incident.id > 0;
  Statement q(db_.get(), (std::string("SELECT ") + kColumns +
                          " FROM incidents WHERE id != ? AND (? = 0 OR id < ?) "
                          "ORDER BY id DESC LIMIT ?")
                             .c_str());
  if (!q.prepared()) return Error("reading incidents");
  q.Bind(1, incident.id);
  q.Bind(2, int64_t{before ? 1 : 0});
  q.Bind(3, incident.id);
  q.Bind(4, compared > 0 ? compared : int64_t{-1});
  std::vector<KbIncident> all;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) all.push_back(Row(q));
  if (rc != SQLITE_DONE) return Error("reading incidents");
  std::reverse(all.begin(), all.end());  // oldest first, as FindSimilar breaks ties
  std::vector<core::IncidentText> past;
  std::map<int64_t, const KbIncident*> by_id;
  for (const KbIncident& p : all) {
    past.push_back(p.Text());
    by_id[p.id] = &p;
  }
  std::vector<core::Similar> similar =
      core::FindSimilar(incident.Text(), past, static_cast<int>(past.size()), min_score);
  std::vector<Recurrence> out;
  for (const core::Similar& s : similar) {
    auto found = by_id.find(s.id);
    if (found == by_id.end()) continue;
    const KbIncident* p = found->second;
    Recurrence r;
    r.id = p->id;
    r.score = s.score;
    r.job = p->job;
    r.job_incident = p->job_incident;
    r.cause = p->resolution_cause.empty() ? p->cause : p->resolution_cause;
    r.resolved = p->resolution.has_value();
    r.action = r.resolved ? std::string(core::LogActionName(*p->resolution)) : p->action;
    r.note = p->resolution_note;
    out.push_back(std::move(r));
  }
  // Scores rounded to 0.01: what an operator did beats what the controller did.
  std::stable_sort(out.begin(), out.end(), [](const Recurrence& a, const Recurrence& b) {
    const int sa = static_cast<int>(a.score * 100 + 0.5),
              sb = static_cast<int>(b.score * 100 + 0.5);
    if (sa != sb) return sa > sb;
    return a.resolved && !b.resolved;
  });
  if (k >= 0 && out.size() > static_cast<size_t>(k)) out.resize(k);
  return out;
}

}  // namespace endure::controller
