// Atomic commit and verification of checkpoint steps.
#include "checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>

#include "common/hash.h"

namespace endure::checkpoint {
namespace {

constexpr char kManifest[] = "MANIFEST.json";
constexpr char kTensorsFile[] = "tensors.bin";
constexpr char kMetaFile[] = "meta.json";
constexpr int kFormatVersion = 1;

// Parses "step-00000010"; -1 for anything else (including ".tmp" files).
int64_t ParseStepDirName(const std::string& name) {
  constexpr std::string_view kPrefix = "step-";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  int64_t step = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

}  // namespace

CheckpointDir::CheckpointDir(Env* env, std::string root) : env_(env), root_(std::move(root)) {}

std::string CheckpointDir::StepDir(int64_t step) const {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return JoinPath(root_, name);
}

Result<CommitStats> CheckpointDir::Commit(const TrainingState& state) {
  auto start = std::chrono::steady_clock::now();
  const std::string dir = StepDir(state.step);
  // Leftovers of an interrupted attempt at this step are never committed
  // (or Commit would not be called for it again): start clean.
  if (env_->Exists(dir)) ENDURE_RETURN_IF_ERROR(env_->RemoveAll(dir));
  ENDURE_RETURN_IF_ERROR(env_->CreateDirs(dir));
  ENDURE_RETURN_IF_ERROR(env_->SyncDir(root_));

  nlohmann::json meta = state.meta;
  meta["step"] = state.step;
  const std::map<std::string, std::string> files = {
      {kTensorsFile, EncodeTensors(state.tensors)},
      {kMetaFile, meta.dump(1)},
  };
  nlohmann::json manifest = {{"format", kFormatVersion}, {"step", state.step}, {"files", {}}};
  CommitStats stats;
  for (const auto& [name, bytes] : files) {
    ENDURE_RETURN_IF_ERROR(WriteFileAtomically(env_, JoinPath(dir, name), bytes));
    manifest["files"][name] = {{"size", bytes.size()}, {"xxh3", HexU64(Xxh3(bytes))}};
    stats.bytes += bytes.size();
  }
  Status st = WriteFileAtomically(env_, JoinPath(dir, kManifest), manifest.dump(1));
  if (!st.ok()) {
    // The manifest may be in place with the fsync of its directory failed:
    // the step would load, and count for Retain(), although a crash may still
    // drop it. Remove it: nothing is committed on failure.
    (void)env_->RemoveAll(dir);
    return st;
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

std::vector<int64_t> CheckpointDir::ListSteps() const {
  std::vector<int64_t> steps;
  Result<std::vector<std::string>> names = env_->ListDir(root_);
  if (!names.ok()) return steps;
  for (const std::string& name : *names) {
    int64_t step = ParseStepDirName(name);
    if (step >= 0) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Result<nlohmann::json> CheckpointDir::ReadManifest(int64_t step) const {
  const std::string path = JoinPath(StepDir(step), kManifest);
  Result<std::string> text = env_->ReadFile(path);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) {
      return DataLoss(path + ": manifest missing (the step was never committed)");
    }
    return text.status();
  }
  nlohmann::json manifest = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object() || !manifest.contains("files") ||
      !manifest["files"].is_object() || manifest.value("step", int64_t{-1}) != step) {
    return DataLoss(path + ": manifest is malformed");
  }
  return manifest;
}

Status CheckpointDir::Verify(int64_t step) const {
  ENDURE_ASSIGN_OR_RETURN(nlohmann::json manifest, ReadManifest(step));
  for (const char* name : {kTensorsFile, kMetaFile}) {
    if (!manifest["files"].contains(name)) {
      return DataLoss(JoinPath(StepDir(step), kManifest) + ": does not list " + name);
    }
  }
  for (const auto& [name, entry] : manifest["files"].items()) {
    const std::string path = JoinPath(StepDir(step), name);
    Result<std::string> bytes = env_->ReadFile(path);
    if (!bytes.ok()) return DataLoss(path + ": " + bytes.status().message());
    const uint64_t size = entry.value("size", uint64_t{0});
    if (bytes->size() != size) {
      return DataLoss(path + ": size " + std::to_string(bytes->size()) + " bytes, manifest says " +
                      std::to_string(size) + " (truncated or partial file)");
    }
    const std::string expected = entry.value("xxh3", "");
    const std::string actual = HexU64(Xxh3(*bytes));
    if (actual != expected) {
      return DataLoss(path + ": checksum mismatch (xxh3 " + actual + ", manifest says " + expected +
                      ")");
    }
  }
  return Status::Ok();
}

Result<TrainingState> CheckpointDir::Load(int64_t step) const {
  ENDURE_RETURN_IF_ERROR(Verify(step));
  const std::string dir = StepDir(step);
  TrainingState state;
  state.step = step;
  ENDURE_ASSIGN_OR_RETURN(std::string meta_text, env_->ReadFile(JoinPath(dir, kMetaFile)));
  state.meta = nlohmann::json::parse(meta_text, nullptr, /*allow_exceptions=*/false);
  if (state.meta.is_discarded() || !state.meta.is_object()) {
    return DataLoss(JoinPath(dir, kMetaFile) + ": not a JSON object");
  }
  const std::string tensors_path = JoinPath(dir, kTensorsFile);
  ENDURE_ASSIGN_OR_RETURN(std::string bytes, env_->ReadFile(tensors_path));
  ENDURE_ASSIGN_OR_RETURN(state.tensors, DecodeTensors(bytes, tensors_path));
  return state;
}

Result<TrainingState> CheckpointDir::LoadNewest(std::vector<std::string>* refused) const {
  return LoadNewestAtOrBefore(INT64_MAX, refused);
}

Result<TrainingState> CheckpointDir::LoadNewestAtOrBefore(int64_t step,
                                                          std::vector<std::string>* refused) const {
  std::vector<int64_t> steps = ListSteps();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (*it > step) continue;
    Result<TrainingState> state = Load(*it);
    if (state.ok()) return state;
    if (refused != nullptr) refused->push_back(state.status().message());
  }
  if (step == INT64_MAX) return NotFound("no checkpoint in '" + root_ + "' verifies");
  return NotFound("no checkpoint at or before step " + std::to_string(step) + " in '" + root_ +
                  "' verifies");
}

Status CheckpointDir::Retain(int keep) {
  if (keep < 1) keep = 1;
  std::vector<int64_t> steps = ListSteps();
  std::vector<int64_t> committed;
  for (int64_t step : steps) {
    if (ReadManifest(step).ok()) committed.push_back(step);
  }
  if (committed.empty()) return Status::Ok();
  const int64_t newest = committed.back();
  const size_t drop = committed.size() > static_cast<size_t>(keep) ? committed.size() - keep : 0;
  std::vector<int64_t> doomed(committed.begin(), committed.begin() + static_cast<long>(drop));
  for (int64_t step : steps) {
    bool is_committed = std::binary_search(committed.begin(), committed.end(), step);
    if (!is_committed && step < newest) doomed.push_back(step);
  }
  for (int64_t step : doomed) ENDURE_RETURN_IF_ERROR(env_->RemoveAll(StepDir(step)));
  return Status::Ok();
}

}  // namespace endure::checkpoint
