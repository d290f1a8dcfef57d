// Atomic commit and verification of checkpoint steps.
#include "checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>

#include "common/hash.h"

namespace endure::checkpoint {
namespace {

constexpr char kManifest[] = "MANIFEST.json";
constexpr int kFormatVersion = 2;

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

Status VerifyBytes(const std::string& path, std::string_view bytes, uint64_t size, uint64_t xxh3) {
  if (bytes.size() != size) {
    return DataLoss(path + ": size " + std::to_string(bytes.size()) + " bytes, expected " +
                    std::to_string(size) + " (truncated or partial file)");
  }
  const uint64_t actual = Xxh3(bytes);
  if (actual != xxh3) {
    return DataLoss(path + ": checksum mismatch (xxh3 " + HexU64(actual) + ", expected " +
                    HexU64(xxh3) + ")");
  }
  return Status::Ok();
}

CheckpointDir::CheckpointDir(Env* env, std::string root) : env_(env), root_(std::move(root)) {}

std::string CheckpointDir::StepDir(int64_t step) const {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return JoinPath(root_, name);
}

std::string CheckpointDir::ShardFileName(int shard) {
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05d.bin", shard);
  return name;
}

std::string CheckpointDir::ShardPath(int64_t step, int shard) const {
  return JoinPath(StepDir(step), ShardFileName(shard));
}

Result<CommitStats> CheckpointDir::Commit(const TrainingState& state) {
  std::vector<TensorView> views;
  views.reserve(state.tensors.size());
  for (const TensorBlob& t : state.tensors) views.push_back(ViewOf(t));
  return CommitViews(state.step, state.meta, views);
}

Result<CommitStats> CheckpointDir::CommitViews(int64_t step, const nlohmann::json& meta_in,
                                               const std::vector<TensorView>& tensors) {
  auto start = std::chrono::steady_clock::now();
  const std::string dir = StepDir(step);
  // Leftovers of an interrupted attempt at this step are never committed
  // (or Commit would not be called for it again): start clean.
  if (env_->Exists(dir)) ENDURE_RETURN_IF_ERROR(env_->RemoveAll(dir));

  nlohmann::json meta = meta_in;
  meta["step"] = step;
  const std::string meta_text = meta.dump();
  const std::vector<TensorView> views = ShardViews(meta_text, tensors);
  // Encoded straight from the tensors, hashed while each piece is in cache.
  const size_t size = EncodedSize(views);
  std::unique_ptr<char[]> bytes(new char[size]);
  Xxh3Hasher hasher;
  EncodeTensorsInto(views, bytes.get(), &hasher);
  const std::string_view encoded(bytes.get(), size);
  ENDURE_ASSIGN_OR_RETURN(ShardEntry entry, WriteShard(step, 0, encoded, hasher.Digest()));
  ENDURE_RETURN_IF_ERROR(CommitStep(step, {entry}));
  CommitStats stats;
  stats.bytes = entry.bytes;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

Result<ShardEntry> CheckpointDir::WriteShard(int64_t step, int shard, std::string_view bytes) {
  return WriteShard(step, shard, bytes, Xxh3(bytes));
}

Result<ShardEntry> CheckpointDir::WriteShard(int64_t step, int shard, std::string_view bytes,
                                             uint64_t xxh3) {
  const std::string dir = StepDir(step);
  if (!env_->Exists(dir)) {
    ENDURE_RETURN_IF_ERROR(env_->CreateDirs(dir));
    ENDURE_RETURN_IF_ERROR(env_->SyncDir(root_));
  }
  ENDURE_RETURN_IF_ERROR(WriteFileAtomically(env_, ShardPath(step, shard), bytes));
  return ShardEntry{bytes.size(), xxh3};
}

Status CheckpointDir::CommitStep(int64_t step, const std::vector<ShardEntry>& shards) {
  nlohmann::json manifest = {{"format", kFormatVersion},
                             {"step", step},
                             {"shards", shards.size()},
                             {"files", nlohmann::json::object()}};
  for (size_t i = 0; i < shards.size(); ++i) {
    manifest["files"][ShardFileName(static_cast<int>(i))] = {{"size", shards[i].bytes},
                                                             {"xxh3", HexU64(shards[i].xxh3)}};
  }
  Status st = WriteFileAtomically(env_, JoinPath(StepDir(step), kManifest), manifest.dump(1));
  if (!st.ok()) {
    // The manifest may be in place with the fsync of its directory failed:
    // the step would load, and count for Retain(), although a crash may still
    // drop it. Remove it: nothing is committed on failure.
    Status removed = env_->RemoveFile(JoinPath(StepDir(step), kManifest));
    if (!removed.ok()) {
      return Status(st.code(), st.message() + "; removing the manifest again failed too (" +
                                   removed.message() + "): delete it before loading the step");
    }
    return st;
  }
  return Status::Ok();
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
      !manifest["files"].is_object() || !manifest.contains("step") ||
      !manifest["step"].is_number_integer() || manifest["step"].get<int64_t>() != step ||
      !manifest.contains("shards") || !manifest["shards"].is_number_unsigned() ||
      manifest["shards"].get<uint64_t>() == 0 || manifest["shards"].get<uint64_t>() > 1'000'000) {
    return DataLoss(path + ": manifest is malformed");
  }
  const uint64_t shards = manifest["shards"].get<uint64_t>();
  for (uint64_t i = 0; i < shards; ++i) {
    const std::string name = ShardFileName(static_cast<int>(i));
    const nlohmann::json& files = manifest["files"];
    if (!files.contains(name) || !files[name].is_object() ||
        !files[name].value("size", nlohmann::json()).is_number_unsigned() ||
        !files[name].value("xxh3", nlohmann::json()).is_string()) {
      return DataLoss(path + ": does not list " + name);
    }
  }
  return manifest;
}

Result<std::vector<ShardEntry>> CheckpointDir::CommittedShards(int64_t step) const {
  ENDURE_ASSIGN_OR_RETURN(nlohmann::json manifest, ReadManifest(step));
  std::vector<ShardEntry> shards;
  for (uint64_t i = 0; i < manifest["shards"].get<uint64_t>(); ++i) {
    const nlohmann::json& entry = manifest["files"][ShardFileName(static_cast<int>(i))];
    ShardEntry e;
    e.bytes = entry["size"].get<uint64_t>();
    e.xxh3 = std::strtoull(entry["xxh3"].get<std::string>().c_str(), nullptr, 16);
    shards.push_back(e);
  }
  return shards;
}

Result<std::string> CheckpointDir::ReadShard(int64_t step, int shard) const {
  ENDURE_ASSIGN_OR_RETURN(std::vector<ShardEntry> shards, CommittedShards(step));
  return ReadListedShard(step, shard, shards);
}

Result<std::string> CheckpointDir::ReadListedShard(int64_t step, int shard,
                                                   const std::vector<ShardEntry>& shards) const {
  if (shard < 0 || static_cast<size_t>(shard) >= shards.size()) {
    return DataLoss(JoinPath(StepDir(step), kManifest) + ": has no shard " + std::to_string(shard));
  }
  const std::string path = ShardPath(step, shard);
  Result<std::string> bytes = env_->ReadFile(path);
  if (!bytes.ok()) return DataLoss(path + ": " + bytes.status().message());
  ENDURE_RETURN_IF_ERROR(VerifyBytes(path, *bytes, shards[shard].bytes, shards[shard].xxh3));
  return bytes;
}

// Verify and Load read the manifest once: a step of N shards costs N reads,
// not N manifest parses of N entries each.
Status CheckpointDir::Verify(int64_t step) const {
  ENDURE_ASSIGN_OR_RETURN(std::vector<ShardEntry> shards, CommittedShards(step));
  for (size_t i = 0; i < shards.size(); ++i) {
    ENDURE_RETURN_IF_ERROR(ReadListedShard(step, static_cast<int>(i), shards).status());
  }
  return Status::Ok();
}

Result<TrainingState> CheckpointDir::Load(int64_t step) const {
  ENDURE_ASSIGN_OR_RETURN(std::vector<ShardEntry> shards, CommittedShards(step));
  TrainingState state;
  state.step = step;
  for (size_t i = 0; i < shards.size(); ++i) {
    ENDURE_ASSIGN_OR_RETURN(std::string bytes, ReadListedShard(step, static_cast<int>(i), shards));
    const std::string path = ShardPath(step, static_cast<int>(i));
    ENDURE_ASSIGN_OR_RETURN(DecodedShard shard, DecodeShard(bytes, path));
    if (shard.meta["step"].get<int64_t>() != step) {
      return DataLoss(path + ": holds step " + shard.meta["step"].dump() + ", not " +
                      std::to_string(step));
    }
    if (i == 0) state.meta = std::move(shard.meta);
    for (TensorBlob& t : shard.tensors) state.tensors.push_back(std::move(t));
  }
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

Status CheckpointDir::Retain(int keep, std::optional<int64_t> verified) {
  if (keep < 1) keep = 1;
  const std::vector<int64_t> steps = ListSteps();
  std::vector<int64_t> committed;
  std::vector<int64_t> leftovers;  // no manifest, or a malformed one: never loadable
  for (int64_t step : steps) {
    Result<nlohmann::json> manifest = ReadManifest(step);
    if (manifest.ok()) {
      committed.push_back(step);
    } else if (manifest.status().code() == StatusCode::kDataLoss) {
      leftovers.push_back(step);
    }
    // Any other error (EIO, EACCES) may hide a good step: it is neither
    // counted nor deleted.
  }
  if (committed.empty()) return Status::Ok();
  // A readable manifest is not enough to delete older steps for: the newest
  // step that verifies is kept whatever `keep` says. A step the caller
  // vouches for stands for it without reading a byte of its shards.
  std::optional<int64_t> newest_good;
  if (verified && std::binary_search(committed.begin(), committed.end(), *verified)) {
    newest_good = verified;
  }
  for (auto it = committed.rbegin(); it != committed.rend() && !newest_good; ++it) {
    if (Verify(*it).ok()) newest_good = *it;
  }
  const int64_t newest = committed.back();
  const size_t drop = committed.size() > static_cast<size_t>(keep) ? committed.size() - keep : 0;
  std::vector<int64_t> doomed;
  for (size_t i = 0; i < drop; ++i) {
    if (committed[i] != newest_good) doomed.push_back(committed[i]);
  }
  for (int64_t step : leftovers) {
    if (step < newest) doomed.push_back(step);
  }
  for (int64_t step : doomed) ENDURE_RETURN_IF_ERROR(env_->RemoveAll(StepDir(step)));
  return Status::Ok();
}

Status CheckpointDir::RemoveStep(int64_t step) {
  ENDURE_RETURN_IF_ERROR(env_->RemoveAll(StepDir(step)));
  return env_->SyncDir(root_);
}

Result<std::vector<int64_t>> CheckpointDir::RemoveAfter(int64_t step) {
  std::vector<int64_t> removed;
  for (int64_t s : ListSteps()) {
    if (s <= step) continue;
    ENDURE_RETURN_IF_ERROR(env_->RemoveAll(StepDir(s)));
    removed.push_back(s);
  }
  if (!removed.empty()) ENDURE_RETURN_IF_ERROR(env_->SyncDir(root_));
  return removed;
}

}  // namespace endure::checkpoint
