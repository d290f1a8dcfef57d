// A prepared SQLite statement, for the controller's databases (the state
// store, the node health ledger). Bind indexes are 1-based, column indexes
// 0-based, as in SQLite. Not thread-safe (as its connection).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace endure::controller {

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
  // Bytes, not text (a snapshot's).
  void BindBlob(int i, std::string_view v) {
    sqlite3_bind_blob64(stmt_, i, v.data(), v.size(), SQLITE_TRANSIENT);
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
  // Ready to be bound and stepped again (a statement kept for reuse).
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const { return sqlite3_column_double(stmt_, col); }
  bool Null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::optional<double> OptReal(int col) const {
    return Null(col) ? std::nullopt : std::optional<double>(Real(col));
  }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p == nullptr ? ""
                        : std::string(static_cast<const char*>(p),
                                      static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
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

struct SqliteCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using SqliteHandle = std::unique_ptr<sqlite3, SqliteCloser>;

// "PATH: what: SQLite's message", DataLoss for a file that is no database
// (or a damaged one), IOError otherwise.
inline Status SqliteError(sqlite3* db, const std::string& path, const std::string& what) {
  const int code = sqlite3_errcode(db);
  const std::string message = path + ": " + what + ": " + sqlite3_errmsg(db);
  if (code == SQLITE_NOTADB || code == SQLITE_CORRUPT) return DataLoss(message);
  return IOError(message);
}

// How commits reach the disk: kNormal survives the process's death (WAL),
// kFull also the machine's (an fsync per commit).
enum class Sync { kNormal, kFull };

// Opens `path` for one owner thread, with a busy timeout for the other
// processes that share the file, in WAL mode, and runs `schema` (CREATE ...
// IF NOT EXISTS). `what` names the database in errors.
inline Result<SqliteHandle> OpenSqlite(const std::string& path, int flags, const char* schema,
                                       const std::string& what, Sync sync = Sync::kNormal) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  SqliteHandle db(raw);
  if (rc != SQLITE_OK) {
    return IOError(path + ": cannot open the " + what + ": " +
                   (raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  }
  sqlite3_busy_timeout(db.get(), 10000);
  const char* pragmas = sync == Sync::kFull ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                                            : "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;";
  if (sqlite3_exec(db.get(), pragmas, nullptr, nullptr, nullptr) != SQLITE_OK) {
    return SqliteError(db.get(), path, "not a usable SQLite database");
  }
  if (sqlite3_exec(db.get(), schema, nullptr, nullptr, nullptr) != SQLITE_OK) {
    return SqliteError(db.get(), path, "creating the " + what + "'s tables");
  }
  return db;
}

}  // namespace endure::controller
