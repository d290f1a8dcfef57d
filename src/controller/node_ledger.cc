// NodeLedger on the SQLite C API; see node_ledger.h.
#include "controller/node_ledger.h"

#include <sqlite3.h>

#include "common/env.h"
#include "controller/sqlite_statement.h"

namespace endure::controller {
namespace {

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS strikes (
  id INTEGER PRIMARY KEY,
  node TEXT NOT NULL,
  cause TEXT NOT NULL,
  class TEXT NOT NULL,
  at_ms INTEGER NOT NULL,
  job TEXT NOT NULL,
  detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS strikes_by_node ON strikes (node, at_ms);
CREATE TABLE IF NOT EXISTS releases (
  node TEXT PRIMARY KEY,
  at_ms INTEGER NOT NULL,
  note TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS policy (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  soft_strikes INTEGER NOT NULL,
  soft_window_ms INTEGER NOT NULL
);
)sql";

// The strikes of `node` after `after_ms` (exclusive), oldest first.
constexpr char kStrikesAfter[] =
    "SELECT cause, class, at_ms, detail FROM strikes WHERE node = ? AND at_ms > ? "
    "ORDER BY at_ms, id";

}  // namespace

std::string NodeLedger::PathIn(const std::string& state_dir) {
  return JoinPath(state_dir, "nodes.db");
}

Result<NodeLedger> NodeLedger::Open(const std::string& path) {
  return OpenWithFlags(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
}

Result<NodeLedger> NodeLedger::OpenExisting(const std::string& path) {
  if (!Env::Default()->Exists(path)) {
    return NotFound(path + ": no node health ledger (no job has struck a node here)");
  }
  return OpenWithFlags(path, SQLITE_OPEN_READWRITE);
}

Result<NodeLedger> NodeLedger::OpenWithFlags(const std::string& path, int flags) {
  // Strikes are rare and must survive a crash of the machine: an fsync per
  // commit.
  ENDURE_ASSIGN_OR_RETURN(SqliteHandle db,
                          OpenSqlite(path, flags, kSchema, "node health ledger", Sync::kFull));
  return NodeLedger(path, std::move(db));
}

Status NodeLedger::AddStrike(const std::string& node, const core::Strike& strike,
                             const std::string& job) {
  Statement q(db_.get(),
              "INSERT INTO strikes (node, cause, class, at_ms, job, detail) "
              "VALUES (?, ?, ?, ?, ?, ?)");
  if (!q.prepared()) return Error("recording a strike");
  q.Bind(1, node);
  q.Bind(2, strike.cause);
  q.Bind(3, std::string(core::StrikeClassName(strike.cls)));
  q.Bind(4, strike.unix_ms);
  q.Bind(5, job);
  q.Bind(6, strike.detail);
  if (q.Step() != SQLITE_DONE) return Error("recording a strike against " + node);
  return Status::Ok();
}

Result<std::vector<core::Strike>> NodeLedger::ActiveStrikes(const std::string& node) {
  int64_t released = -1;
  {
    Statement q(db_.get(), "SELECT at_ms FROM releases WHERE node = ?");
    if (!q.prepared()) return Error("reading releases");
    q.Bind(1, node);
    if (q.Step() == SQLITE_ROW) released = q.Int(0);
  }
  Statement q(db_.get(), kStrikesAfter);
  if (!q.prepared()) return Error("reading strikes");
  q.Bind(1, node);
  q.Bind(2, released);
  std::vector<core::Strike> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    core::Strike s;
    s.cause = q.Text(0);
    // A class this endure does not know (a newer one wrote it) is judged
    // from the cause, as the strike would be now.
    Result<core::StrikeClass> cls = core::ParseStrikeClass(q.Text(1));
    s.cls = cls.ok() ? *cls : core::StrikeClassOf(s.cause);
    s.unix_ms = q.Int(2);
    s.detail = q.Text(3);
    out.push_back(std::move(s));
  }
  if (rc != SQLITE_DONE) return Error("reading the strikes of " + node);
  return out;
}

Status NodeLedger::Release(const std::string& node, int64_t unix_ms, const std::string& note) {
  {
    Statement q(db_.get(), "SELECT COUNT(*) FROM strikes WHERE node = ?");
    if (!q.prepared()) return Error("reading strikes");
    q.Bind(1, node);
    if (q.Step() != SQLITE_ROW) return Error("reading the strikes of " + node);
    if (q.Int(0) == 0) {
      return NotFound(path_ + ": no node '" + node + "' in the ledger (`endure nodes` lists them)");
    }
  }
  Statement q(db_.get(),
              "INSERT INTO releases (node, at_ms, note) VALUES (?, ?, ?) "
              "ON CONFLICT (node) DO UPDATE SET at_ms = excluded.at_ms, note = excluded.note");
  if (!q.prepared()) return Error("releasing a node");
  q.Bind(1, node);
  q.Bind(2, unix_ms);
  q.Bind(3, note);
  if (q.Step() != SQLITE_DONE) return Error("releasing " + node);
  return Status::Ok();
}

Result<std::vector<NodeRecord>> NodeLedger::List() {
  std::vector<NodeRecord> out;
  {
    Statement q(db_.get(),
                "SELECT s.node, COUNT(*), r.at_ms, COALESCE(r.note, '') FROM strikes s "
                "LEFT JOIN releases r ON r.node = s.node GROUP BY s.node ORDER BY s.node");
    if (!q.prepared()) return Error("listing nodes");
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      NodeRecord r;
      r.node = q.Text(0);
      r.total_strikes = q.Int(1);
      if (!q.Null(2)) r.released_at_ms = q.Int(2);
      r.release_note = q.Text(3);
      out.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return Error("listing nodes");
  }
  for (NodeRecord& r : out) {
    ENDURE_ASSIGN_OR_RETURN(r.strikes, ActiveStrikes(r.node));
  }
  return out;
}

Status NodeLedger::SetPolicy(const core::NodeHealthOptions& options) {
  Statement q(db_.get(),
              "INSERT INTO policy (id, soft_strikes, soft_window_ms) VALUES (1, ?, ?) "
              "ON CONFLICT (id) DO UPDATE SET soft_strikes = excluded.soft_strikes, "
              "soft_window_ms = excluded.soft_window_ms");
  if (!q.prepared()) return Error("saving the policy");
  q.Bind(1, int64_t{options.soft_strikes});
  q.Bind(2,
         static_cast<int64_t>(
             std::chrono::duration_cast<std::chrono::milliseconds>(options.soft_window).count()));
  if (q.Step() != SQLITE_DONE) return Error("saving the policy");
  return Status::Ok();
}

Result<core::NodeHealthOptions> NodeLedger::Policy() {
  core::NodeHealthOptions options;
  Statement q(db_.get(), "SELECT soft_strikes, soft_window_ms FROM policy WHERE id = 1");
  if (!q.prepared()) return Error("reading the policy");
  if (q.Step() == SQLITE_ROW) {
    options.soft_strikes = static_cast<int>(q.Int(0));
    options.soft_window = std::chrono::milliseconds(q.Int(1));
    // A damaged row is no policy: the defaults judge.
    if (!options.Validate().ok()) options = {};
  }
  return options;
}

}  // namespace endure::controller
