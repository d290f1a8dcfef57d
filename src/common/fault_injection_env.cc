// FaultInjectionEnv: the durability model, crash and error injection.
//
// Model: inodes (Node) reached from inode 0, the root. A directory has live
// entries (what the real tree holds now) and durable ones (its live entries
// as of its last SyncDir); a file has the bytes appended to it and the prefix
// of them that its last Sync made durable. A crash keeps, recursively from the
// root, only durable entries, and of each file only its synced bytes.
#include "common/fault_injection_env.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

namespace endure {
namespace {

Status Injected(InjectedError error, const std::string& what, const std::string& path) {
  const int err = error == InjectedError::kNoSpace ? ENOSPC : EIO;
  return IOError(what + " '" + path + "': " + std::strerror(err) + " (injected)");
}

Status Crashed(const std::string& what, const std::string& path) {
  return IOError("injected crash: " + what + " '" + path + "' not done");
}

Status OutsideModel(const std::string& path) {
  return Internal("FaultInjectionEnv: '" + path +
                  "' changed outside this Env, or a rename crosses its root");
}

std::string Normalize(const std::string& path) {
  std::string p = std::filesystem::path(path).lexically_normal().generic_string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

}  // namespace

// Forwards to the base file through the Env, which counts, fails and models.
class FaultInjectionEnv::File final : public WritableFile {
 public:
  File(FaultInjectionEnv* env, int64_t generation, int64_t node, std::string path,
       std::unique_ptr<WritableFile> base)
      : env_(env),
        generation_(generation),
        node_(node),
        path_(std::move(path)),
        base_(std::move(base)) {}

  Status Append(std::string_view data) override {
    return env_->FileAppend(generation_, node_, path_, base_.get(), data);
  }
  Status Sync() override { return env_->FileSync(generation_, node_, path_, base_.get()); }
  Status Close() override { return env_->FileClose(generation_, node_, path_, base_.get()); }

 private:
  FaultInjectionEnv* env_;  // a WritableFile must not outlive the Env that made it
  int64_t generation_;      // the env's generation when opened
  int64_t node_;            // -1 when outside the root
  std::string path_;
  std::unique_ptr<WritableFile> base_;
};

FaultInjectionEnv::FaultInjectionEnv(Env* base, std::string root, bool real_syncs)
    : base_(base), root_(Normalize(root)), real_syncs_(real_syncs) {
  MutexLock lock(&mu_);
  Reset();
}

int64_t FaultInjectionEnv::boundary_ops() const {
  MutexLock lock(&mu_);
  return ops_;
}

void FaultInjectionEnv::CrashAfter(int64_t n) {
  MutexLock lock(&mu_);
  crash_after_ = ops_ + n;
}

void FaultInjectionEnv::FailNthAppend(int64_t nth, InjectedError error) {
  MutexLock lock(&mu_);
  append_fault_ = {nth, error};
}

void FaultInjectionEnv::FailNthSync(int64_t nth, InjectedError error) {
  MutexLock lock(&mu_);
  sync_fault_ = {nth, error};
}

void FaultInjectionEnv::FailWritesUnder(std::string prefix, InjectedError error) {
  MutexLock lock(&mu_);
  prefix_ = prefix.empty() ? prefix : Normalize(prefix);
  prefix_error_ = error;
}

void FaultInjectionEnv::ClearFaults() {
  MutexLock lock(&mu_);
  crash_after_ = -1;
  crashed_ = false;
  append_fault_ = {};
  sync_fault_ = {};
  prefix_.clear();
}

bool FaultInjectionEnv::Split(const std::string& path, std::vector<std::string>* names) const {
  const std::string p = Normalize(path);
  names->clear();
  if (p == root_) return true;
  const std::string prefix = root_ == "/" ? root_ : root_ + "/";
  if (p.compare(0, prefix.size(), prefix) != 0) return false;
  size_t start = prefix.size();
  while (start <= p.size()) {
    size_t slash = p.find('/', start);
    if (slash == std::string::npos) slash = p.size();
    names->push_back(p.substr(start, slash - start));
    start = slash + 1;
  }
  return true;
}

int64_t FaultInjectionEnv::Lookup(const std::vector<std::string>& names) const {
  int64_t id = 0;
  for (const std::string& name : names) {
    const Node& node = nodes_.at(id);
    if (!node.is_dir) return -1;
    auto it = node.live.find(name);
    if (it == node.live.end()) return -1;
    id = it->second;
  }
  return id;
}

int64_t FaultInjectionEnv::NewNode(bool is_dir) {
  const int64_t id = next_node_++;
  nodes_[id].is_dir = is_dir;
  return id;
}

void FaultInjectionEnv::Import(int64_t dir, const std::string& path) {
  Result<std::vector<std::string>> names = base_->ListDir(path);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    const std::string child = JoinPath(path, name);
    // Only ListDir and ReadFile are in the Env interface: a directory is
    // what lists.
    const bool is_dir = base_->ListDir(child).ok();
    const int64_t id = NewNode(is_dir);
    if (is_dir) {
      Import(id, child);
    } else {
      Result<std::string> data = base_->ReadFile(child);
      if (data.ok()) nodes_[id].data = nodes_[id].synced = std::move(*data);
    }
    nodes_[dir].live[name] = nodes_[dir].durable[name] = id;
  }
}

Status FaultInjectionEnv::Boundary(const std::string& what, const std::string& path) {
  if (crashed_) return Crashed(what, path);
  if (crash_after_ >= 0 && ops_ >= crash_after_) {
    crashed_ = true;
    return Crashed(what, path);
  }
  ++ops_;
  return Status::Ok();
}

Status FaultInjectionEnv::PrefixFault(const std::string& what, const std::string& path) const {
  if (!prefix_.empty() && Normalize(path).compare(0, prefix_.size(), prefix_) == 0) {
    return Injected(prefix_error_, what, path);
  }
  return Status::Ok();
}

Status FaultInjectionEnv::SimulateCrash() {
  MutexLock lock(&mu_);
  // Empty the real root, then write back what was durable.
  if (base_->Exists(root_)) {
    ENDURE_ASSIGN_OR_RETURN(std::vector<std::string> names, base_->ListDir(root_));
    for (const std::string& name : names) {
      ENDURE_RETURN_IF_ERROR(base_->RemoveAll(JoinPath(root_, name)));
    }
  } else {
    ENDURE_RETURN_IF_ERROR(base_->CreateDirs(root_));
  }
  std::set<int64_t> ancestors;
  ENDURE_RETURN_IF_ERROR(Rebuild(0, root_, &ancestors));
  Reset();
  return Status::Ok();
}

Status FaultInjectionEnv::Rebuild(int64_t dir, const std::string& path,
                                  std::set<int64_t>* ancestors) {
  // Durable entries of different directories may disagree (a directory moved
  // between two unsynced parents); a cycle is cut where it closes.
  if (!ancestors->insert(dir).second) return Status::Ok();
  for (const auto& [name, id] : nodes_.at(dir).durable) {
    const std::string child = JoinPath(path, name);
    const Node& node = nodes_.at(id);
    if (node.is_dir) {
      ENDURE_RETURN_IF_ERROR(base_->CreateDirs(child));
      ENDURE_RETURN_IF_ERROR(Rebuild(id, child, ancestors));
    } else {
      // No fsync: the model, not the disk, is what the next crash consults.
      ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->NewWritableFile(child));
      ENDURE_RETURN_IF_ERROR(file->Append(node.synced));
      ENDURE_RETURN_IF_ERROR(file->Close());
    }
  }
  ancestors->erase(dir);
  return Status::Ok();
}

void FaultInjectionEnv::Reset() {
  // After a reboot the real tree is the durable state: read it back.
  nodes_.clear();
  nodes_[0].is_dir = true;
  next_node_ = 1;
  Import(0, root_);
  ++generation_;
  ops_ = 0;
  crash_after_ = -1;
  crashed_ = false;
  append_fault_ = {};
  sync_fault_ = {};
  prefix_.clear();
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path) {
  MutexLock lock(&mu_);
  if (crashed_) return Crashed("create", path);
  std::vector<std::string> names;
  if (!Split(path, &names)) {
    ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->NewWritableFile(path));
    return std::unique_ptr<WritableFile>(new File(this, generation_, -1, path, std::move(file)));
  }
  ENDURE_RETURN_IF_ERROR(PrefixFault("cannot create", path));
  ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->NewWritableFile(path));
  if (names.empty()) return OutsideModel(path);
  const std::string name = names.back();
  names.pop_back();
  const int64_t parent = Lookup(names);
  if (parent < 0 || !nodes_[parent].is_dir) return OutsideModel(path);
  auto it = nodes_[parent].live.find(name);
  int64_t id;
  if (it != nodes_[parent].live.end()) {
    // O_TRUNC of an existing file; taken as durable at once (simplification).
    id = it->second;
    nodes_[id].data.clear();
    nodes_[id].synced.clear();
  } else {
    id = NewNode(/*is_dir=*/false);
    nodes_[parent].live[name] = id;
  }
  return std::unique_ptr<WritableFile>(new File(this, generation_, id, path, std::move(file)));
}

Status FaultInjectionEnv::FileAppend(int64_t generation, int64_t node, const std::string& path,
                                     WritableFile* base, std::string_view data) {
  MutexLock lock(&mu_);
  if (generation != generation_) return IOError("'" + path + "' was opened before a crash");
  if (node < 0) {
    if (crashed_) return Crashed("write", path);
    return base->Append(data);
  }
  ENDURE_RETURN_IF_ERROR(Boundary("write", path));
  if (append_fault_.countdown > 0 && --append_fault_.countdown == 0) {
    // A short write: half the data lands before the error.
    std::string_view half = data.substr(0, data.size() / 2);
    if (base->Append(half).ok()) nodes_[node].data.append(half);
    return Injected(append_fault_.error, "write", path);
  }
  ENDURE_RETURN_IF_ERROR(PrefixFault("write", path));
  Status st = base->Append(data);
  if (st.ok()) nodes_[node].data.append(data);
  return st;
}

Status FaultInjectionEnv::FileSync(int64_t generation, int64_t node, const std::string& path,
                                   WritableFile* base) {
  MutexLock lock(&mu_);
  if (generation != generation_) return IOError("'" + path + "' was opened before a crash");
  if (node < 0) {
    if (crashed_) return Crashed("fsync", path);
    return base->Sync();
  }
  ENDURE_RETURN_IF_ERROR(Boundary("fsync", path));
  if (sync_fault_.countdown > 0 && --sync_fault_.countdown == 0) {
    return Injected(sync_fault_.error, "fsync", path);
  }
  ENDURE_RETURN_IF_ERROR(PrefixFault("fsync", path));
  if (real_syncs_) ENDURE_RETURN_IF_ERROR(base->Sync());
  nodes_[node].synced = nodes_[node].data;
  return Status::Ok();
}

Status FaultInjectionEnv::FileClose(int64_t generation, int64_t node, const std::string& path,
                                    WritableFile* base) {
  MutexLock lock(&mu_);
  if (generation != generation_) return IOError("'" + path + "' was opened before a crash");
  if (node < 0) {
    if (crashed_) return Crashed("close", path);
  } else {
    ENDURE_RETURN_IF_ERROR(Boundary("close", path));
  }
  return base->Close();
}

Result<std::string> FaultInjectionEnv::ReadFile(const std::string& path) {
  {
    MutexLock lock(&mu_);
    if (crashed_) return Crashed("read", path);
  }
  return base_->ReadFile(path);
}

Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  MutexLock lock(&mu_);
  std::vector<std::string> from_names, to_names;
  const bool from_inside = Split(from, &from_names);
  const bool to_inside = Split(to, &to_names);
  if (!from_inside && !to_inside) {
    if (crashed_) return Crashed("rename", from);
    return base_->RenameFile(from, to);
  }
  if (from_inside != to_inside || from_names.empty() || to_names.empty()) {
    return OutsideModel(from_inside ? from : to);
  }
  ENDURE_RETURN_IF_ERROR(Boundary("rename to " + to, from));
  ENDURE_RETURN_IF_ERROR(PrefixFault("rename to " + to, to));
  ENDURE_RETURN_IF_ERROR(base_->RenameFile(from, to));
  const std::string from_name = from_names.back(), to_name = to_names.back();
  from_names.pop_back();
  to_names.pop_back();
  const int64_t from_dir = Lookup(from_names), to_dir = Lookup(to_names);
  if (from_dir < 0 || to_dir < 0) return OutsideModel(from);
  auto it = nodes_[from_dir].live.find(from_name);
  if (it == nodes_[from_dir].live.end()) return OutsideModel(from);
  const int64_t id = it->second;
  nodes_[from_dir].live.erase(it);
  nodes_[to_dir].live[to_name] = id;
  return Status::Ok();
}

Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  if (!Split(dir, &names)) {
    if (crashed_) return Crashed("fsync directory", dir);
    return base_->SyncDir(dir);
  }
  ENDURE_RETURN_IF_ERROR(Boundary("fsync directory", dir));
  if (sync_fault_.countdown > 0 && --sync_fault_.countdown == 0) {
    return Injected(sync_fault_.error, "fsync directory", dir);
  }
  ENDURE_RETURN_IF_ERROR(PrefixFault("fsync directory", dir));
  if (real_syncs_) ENDURE_RETURN_IF_ERROR(base_->SyncDir(dir));
  const int64_t id = Lookup(names);
  if (id < 0 || !nodes_[id].is_dir) {
    return IOError("cannot open directory '" + dir + "': " + std::strerror(ENOENT));
  }
  nodes_[id].durable = nodes_[id].live;
  return Status::Ok();
}

Status FaultInjectionEnv::CreateDirs(const std::string& dir) {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  if (!Split(dir, &names)) {
    if (crashed_) return Crashed("create directory", dir);
    return base_->CreateDirs(dir);
  }
  ENDURE_RETURN_IF_ERROR(Boundary("create directory", dir));
  ENDURE_RETURN_IF_ERROR(PrefixFault("cannot create directory", dir));
  ENDURE_RETURN_IF_ERROR(base_->CreateDirs(dir));
  int64_t id = 0;
  for (const std::string& name : names) {
    auto it = nodes_[id].live.find(name);
    if (it == nodes_[id].live.end()) {
      const int64_t child = NewNode(/*is_dir=*/true);
      nodes_[id].live[name] = child;
      id = child;
    } else {
      id = it->second;
      if (!nodes_[id].is_dir) return OutsideModel(dir);
    }
  }
  return Status::Ok();
}

Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  if (!Split(path, &names)) {
    if (crashed_) return Crashed("unlink", path);
    return base_->RemoveFile(path);
  }
  if (names.empty()) return OutsideModel(path);
  ENDURE_RETURN_IF_ERROR(Boundary("unlink", path));
  ENDURE_RETURN_IF_ERROR(base_->RemoveFile(path));
  const std::string name = names.back();
  names.pop_back();
  const int64_t parent = Lookup(names);
  if (parent >= 0 && nodes_[parent].is_dir) nodes_[parent].live.erase(name);
  return Status::Ok();
}

Status FaultInjectionEnv::RemoveAll(const std::string& path) {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  if (!Split(path, &names)) {
    if (crashed_) return Crashed("remove", path);
    return base_->RemoveAll(path);
  }
  ENDURE_RETURN_IF_ERROR(Boundary("remove", path));
  ENDURE_RETURN_IF_ERROR(base_->RemoveAll(path));
  if (names.empty()) {  // the root: its entries go; SimulateCrash recreates it
    nodes_[0].live.clear();
    return Status::Ok();
  }
  const std::string name = names.back();
  names.pop_back();
  const int64_t parent = Lookup(names);
  if (parent >= 0 && nodes_[parent].is_dir) nodes_[parent].live.erase(name);
  return Status::Ok();
}

bool FaultInjectionEnv::Exists(const std::string& path) {
  {
    MutexLock lock(&mu_);
    if (crashed_) return false;
  }
  return base_->Exists(path);
}

Result<std::vector<std::string>> FaultInjectionEnv::ListDir(const std::string& dir) {
  {
    MutexLock lock(&mu_);
    if (crashed_) return Crashed("list", dir);
  }
  return base_->ListDir(dir);
}

}  // namespace endure
