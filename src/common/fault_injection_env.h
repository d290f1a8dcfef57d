// FaultInjectionEnv: an Env for tests that wraps a real one working in a
// directory tree and can make it fail the way storage fails: a crash (power
// loss) after any write boundary, and ENOSPC or EIO on chosen writes.
//
// It keeps a model of what is durable under `root`: for each file, the bytes
// that a WritableFile::Sync made durable; for each directory, the entries
// (creations, renames, removals) that a SyncDir of that directory made
// durable. SimulateCrash() rewrites the real tree to exactly that durable
// state, as strict POSIX allows after a power loss: unsynced appends are lost,
// a file whose directory entry was never synced disappears, and a rename or
// removal not followed by a SyncDir of its directory is undone.
//
// Simplifications: the tree under `root` is assumed durable when the Env is
// created, and is changed only through this Env; truncating an existing file
// (NewWritableFile) is durable at once; the root directory itself always
// survives. Paths outside `root` pass through to the base Env untouched, and
// are neither modelled nor failed.
//
// Thread-safe: one mutex guards the model and the fault settings.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/mutex.h"
#include "common/status.h"

namespace endure {

// What an injected storage error looks like: the message contains the
// strerror text ("No space left on device", "Input/output error").
enum class InjectedError { kNoSpace, kIO };

class FaultInjectionEnv final : public Env {
 public:
  // `base` (usually Env::Default()) must outlive this object; `root` must be
  // an existing directory, whose current contents count as durable. Syncs
  // under `root` reach the base Env only with `real_syncs`: the model, not
  // the disk, decides what a crash keeps, and real fsyncs make tests slow.
  FaultInjectionEnv(Env* base, std::string root, bool real_syncs = false);

  // Write boundaries: Append, Sync, Close, RenameFile, SyncDir, CreateDirs,
  // RemoveFile and RemoveAll on a path under `root`. Returns how many have
  // been attempted since construction or the last SimulateCrash().
  int64_t boundary_ops() const;

  // After `n` more write boundaries have run, the process "crashes": that
  // operation and every later one (reads included) fail with
  // IOError("injected crash") and change nothing.
  void CrashAfter(int64_t n);

  // The `nth` (1-based) Append, or fsync (WritableFile::Sync or SyncDir),
  // under `root` from now on fails with `error`. A failing Append first
  // writes half of its data, as a short write would; a failing fsync makes
  // nothing durable.
  void FailNthAppend(int64_t nth, InjectedError error);
  void FailNthSync(int64_t nth, InjectedError error);
  // Every write (NewWritableFile, Append, Sync, RenameFile's target,
  // SyncDir, CreateDirs) on a path that starts with `prefix` fails with
  // `error`. Removals still succeed: they are what cleans up after ENOSPC.
  void FailWritesUnder(std::string prefix, InjectedError error);
  // Removes every injected error and any pending or past crash.
  void ClearFaults();

  // Rewrites the real tree under `root` to the durable state (see above),
  // then "reboots": faults are cleared, the counter restarts at zero, and
  // WritableFiles opened before fail from now on. Returns an error only if
  // the base Env cannot rewrite the tree.
  Status SimulateCrash();

  // Env.
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Result<std::string> ReadFile(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& dir) override;
  Status CreateDirs(const std::string& dir) override;
  Status RemoveFile(const std::string& path) override;
  Status RemoveAll(const std::string& path) override;
  bool Exists(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& dir) override;

 private:
  class File;
  friend class File;

  // An inode: a directory with its live and durable entries, or a file with
  // its live and synced bytes. Entries map names to inode ids, so that a
  // renamed directory keeps its contents.
  struct Node {
    bool is_dir = false;
    std::map<std::string, int64_t> live;     // directories
    std::map<std::string, int64_t> durable;  // directories
    std::string data;                        // files: what has been appended
    std::string synced;                      // files: what Sync made durable
  };
  struct Fault {
    int64_t countdown = 0;  // fails when it reaches zero; 0 = not armed
    InjectedError error = InjectedError::kNoSpace;
  };

  // Path relative to root_ split into names; false if not under root_.
  bool Split(const std::string& path, std::vector<std::string>* names) const;
  // Inode of the live path under root_, or -1.
  int64_t Lookup(const std::vector<std::string>& names) const REQUIRES(mu_);
  int64_t NewNode(bool is_dir) REQUIRES(mu_);
  void Import(int64_t dir, const std::string& path) REQUIRES(mu_);  // durable as found
  // Counts a write boundary (`what` on `path`); an error once crashed.
  Status Boundary(const std::string& what, const std::string& path) REQUIRES(mu_);
  Status PrefixFault(const std::string& what, const std::string& path) const REQUIRES(mu_);
  // Writes the durable contents of directory inode `dir` to `path`.
  Status Rebuild(int64_t dir, const std::string& path, std::set<int64_t>* ancestors) REQUIRES(mu_);
  void Reset() REQUIRES(mu_);  // reads the model back from the real tree, clears faults

  Status FileAppend(int64_t generation, int64_t node, const std::string& path, WritableFile* base,
                    std::string_view data);
  Status FileSync(int64_t generation, int64_t node, const std::string& path, WritableFile* base);
  Status FileClose(int64_t generation, int64_t node, const std::string& path, WritableFile* base);

  Env* const base_;
  const std::string root_;
  const bool real_syncs_;
  mutable Mutex mu_;
  std::map<int64_t, Node> nodes_ GUARDED_BY(mu_);  // inode 0 is root_
  int64_t next_node_ GUARDED_BY(mu_) = 1;
  int64_t generation_ GUARDED_BY(mu_) = 0;  // bumped by SimulateCrash
  int64_t ops_ GUARDED_BY(mu_) = 0;
  int64_t crash_after_ GUARDED_BY(mu_) = -1;  // -1 = never
  bool crashed_ GUARDED_BY(mu_) = false;
  Fault append_fault_ GUARDED_BY(mu_);
  Fault sync_fault_ GUARDED_BY(mu_);
  std::string prefix_ GUARDED_BY(mu_);  // empty = none
  InjectedError prefix_error_ GUARDED_BY(mu_) = InjectedError::kNoSpace;
};

}  // namespace endure
