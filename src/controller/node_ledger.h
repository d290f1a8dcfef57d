// NodeLedger: the node health ledger, in SQLite (STATE_DIR/nodes.db, where
// STATE_DIR is the spec's [cluster] state_dir, shared by every job that
// runs on the same nodes, or the job's own state directory). It keeps each
// node's strikes (cause, class, time, the job that struck it, what it saw)
// keyed by the node's name — its host's identity, not its connection — and
// the times an operator released it back to service. A release forgives the
// strikes before it; the history stays.
//
// What the strikes mean is core::JudgeNode's (src/core/node_health.h): the
// controller asks it when a node registers and after each strike, with the
// options it stores here (SetPolicy) so that `endure nodes` judges alike.
//
// Several controllers (jobs) may hold the file open at once: SQLite's
// locking with a busy timeout serialises their writes; every write is one
// transaction, synchronous (strikes are rare, and must survive a crash of
// the machine). Not thread-safe: one owner per instance.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/sqlite_statement.h"
#include "core/node_health.h"

namespace endure::controller {

// One node as the ledger knows it.
struct NodeRecord {
  std::string node;
  std::vector<core::Strike> strikes;  // since its last release, oldest first
  int64_t total_strikes = 0;          // ever
  std::optional<int64_t> released_at_ms;
  std::string release_note;
};

class NodeLedger {
 public:
  // STATE_DIR/nodes.db.
  static std::string PathIn(const std::string& state_dir);
  // Opens (creating when missing) the ledger at `path`; the directory must
  // exist. IOError naming the path when it cannot; DataLoss when the file
  // is not a ledger.
  static Result<NodeLedger> Open(const std::string& path);
  // NotFound when `path` does not exist.
  static Result<NodeLedger> OpenExisting(const std::string& path);

  NodeLedger(NodeLedger&&) noexcept = default;
  NodeLedger& operator=(NodeLedger&&) noexcept = default;

  const std::string& path() const { return path_; }

  Status AddStrike(const std::string& node, const core::Strike& strike, const std::string& job);
  // The strikes since the node's last release, oldest first (none for a
  // node never struck).
  Result<std::vector<core::Strike>> ActiveStrikes(const std::string& node);
  // Returns the node to service at `unix_ms`: its earlier strikes no longer
  // count. NotFound for a node the ledger has never struck.
  Status Release(const std::string& node, int64_t unix_ms, const std::string& note);
  // Every node ever struck, by name.
  Result<std::vector<NodeRecord>> List();

  // The judgement's options, as the last controller used them (defaults
  // before any did).
  Status SetPolicy(const core::NodeHealthOptions& options);
  Result<core::NodeHealthOptions> Policy();

 private:
  NodeLedger(std::string path, SqliteHandle db) : path_(std::move(path)), db_(std::move(db)) {}
  static Result<NodeLedger> OpenWithFlags(const std::string& path, int flags);
  Status Error(const std::string& what) const { return SqliteError(db_.get(), path_, what); }

  std::string path_;
  SqliteHandle db_;
};

}  // namespace endure::controller
