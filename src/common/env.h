// Env: the file-system operations Endure's durable code paths use, behind an
// interface so that tests can substitute a fault-injecting implementation
// (ENOSPC, EIO, a crash between two write boundaries). Env::Default() is the
// POSIX implementation; it is thread-safe and never deleted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace endure {

// A file open for appending. Not thread-safe. Close() or destruction releases
// it; data is durable only after Sync() returned OK.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view data) = 0;
  virtual Status Sync() = 0;  // fsync
  virtual Status Close() = 0;
};

class Env {
 public:
  virtual ~Env() = default;
  static Env* Default();

  // Creates or truncates `path`.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  virtual Result<std::string> ReadFile(const std::string& path) = 0;
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  // fsync of a directory, making renames and creations inside it durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  virtual Status CreateDirs(const std::string& dir) = 0;  // mkdir -p
  virtual Status RemoveFile(const std::string& path) = 0;
  virtual Status RemoveAll(const std::string& path) = 0;  // rm -rf
  virtual bool Exists(const std::string& path) = 0;
  // Names (not paths) of the entries of `dir`, sorted.
  virtual Result<std::vector<std::string>> ListDir(const std::string& dir) = 0;
};

// An Env that forwards every call to another one (`target`, which must
// outlive it): tests and fault injectors override only what they change.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return target_->NewWritableFile(path);
  }
  Result<std::string> ReadFile(const std::string& path) override { return target_->ReadFile(path); }
  Status RenameFile(const std::string& from, const std::string& to) override {
    return target_->RenameFile(from, to);
  }
  Status SyncDir(const std::string& dir) override { return target_->SyncDir(dir); }
  Status CreateDirs(const std::string& dir) override { return target_->CreateDirs(dir); }
  Status RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  Status RemoveAll(const std::string& path) override { return target_->RemoveAll(path); }
  bool Exists(const std::string& path) override { return target_->Exists(path); }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    return target_->ListDir(dir);
  }

 private:
  Env* target_;
};

// Writes `data` to `path` so that a reader sees either the old file or the
// whole new one, never a part: data to `path.tmp`, fsync, rename, fsync of
// the directory. On failure the temporary file is removed where possible.
Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data);
// The same without the fsyncs: a reader sees the old file or the whole new
// one, but a crash of the machine may lose it. For what another process
// reads right away and nobody needs after a reboot (a rejoin offer).
Status PublishFile(Env* env, const std::string& path, std::string_view data);

// The directory part of `path` ("." when there is none).
std::string DirName(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace endure
