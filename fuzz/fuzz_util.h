// Helpers shared by the fuzz targets: a check that fails the run the way a
// crash does (libFuzzer saves the input), and an in-memory Env for the
// readers that only reach their input through files.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/status.h"

// Aborts with the file, line and condition when an invariant of a parser
// does not hold; libFuzzer reports the abort and writes the input out.
#define FUZZ_CHECK(cond)                                                                     \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

namespace endure::fuzz {

// The fuzzer's bytes as text (they need not be UTF-8).
inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// An Env over a map of paths to contents: no disk, nothing durable to speak
// of, every Sync succeeds. Directories exist when created or when a file
// inside them does. Not thread-safe (each target runs one input at a time).
class MemEnv final : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    files_[path].clear();
    return std::unique_ptr<WritableFile>(new File(&files_[path]));
  }
  Result<std::string> ReadFile(const std::string& path) override {
    auto it = files_.find(path);
    if (it == files_.end()) return NotFound(path + ": no such file");
    return it->second;
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    auto it = files_.find(from);
    if (it == files_.end()) return NotFound(from + ": no such file");
    std::string data = std::move(it->second);
    files_.erase(it);
    files_[to] = std::move(data);
    return Status::Ok();
  }
  Status SyncDir(const std::string&) override { return Status::Ok(); }
  Status CreateDirs(const std::string& dir) override {
    dirs_.insert(dir);
    return Status::Ok();
  }
  Status RemoveFile(const std::string& path) override {
    files_.erase(path);
    return Status::Ok();
  }
  Status RemoveAll(const std::string& path) override {
    const std::string prefix = path + "/";
    for (auto it = files_.begin(); it != files_.end();) {
      it = it->first == path || it->first.rfind(prefix, 0) == 0 ? files_.erase(it) : std::next(it);
    }
    for (auto it = dirs_.begin(); it != dirs_.end();) {
      it = *it == path || it->rfind(prefix, 0) == 0 ? dirs_.erase(it) : std::next(it);
    }
    return Status::Ok();
  }
  bool Exists(const std::string& path) override {
    if (files_.count(path) > 0 || dirs_.count(path) > 0) return true;
    auto it = files_.lower_bound(path + "/");
    return it != files_.end() && it->first.rfind(path + "/", 0) == 0;
  }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    const std::string prefix = dir + "/";
    std::set<std::string> names;
    auto add = [&](const std::string& path) {
      if (path.rfind(prefix, 0) != 0 || path.size() == prefix.size()) return;
      names.insert(path.substr(prefix.size(), path.find('/', prefix.size()) - prefix.size()));
    };
    for (const auto& [path, data] : files_) add(path);
    for (const std::string& d : dirs_) add(d);
    return std::vector<std::string>(names.begin(), names.end());
  }

 private:
  class File final : public WritableFile {
   public:
    explicit File(std::string* data) : data_(data) {}
    Status Append(std::string_view data) override {
      data_->append(data);
      return Status::Ok();
    }
    Status Sync() override { return Status::Ok(); }
    Status Close() override { return Status::Ok(); }

   private:
    std::string* data_;  // an element of files_: std::map never moves its elements
  };

  std::map<std::string, std::string> files_;
  std::set<std::string> dirs_;
};

}  // namespace endure::fuzz
