// CheckpointDir: durable checkpoints of a training state in one directory,
// committed atomically and verified before they are loaded.
//
// Layout: ROOT/step-00000010/{shard-00000.bin, ..., MANIFEST.json}: one
// shard per rank that saved a part of the state (DecodeShard form; a single
// writer saves everything as shard 0). Each file is written tmp -> fsync ->
// rename -> fsync(dir); MANIFEST.json, which lists every shard with its size
// and XXH3-64 checksum, is written last the same way, once every shard is
// durable, and its presence is what commits the step. A step whose manifest
// is missing, unreadable, or whose files do not match it is refused with a
// message naming the file, and never loaded.
//
// Shards of one step may be written by different processes (one per node);
// the manifest and Retain by one committer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/tensor_blob.h"
#include "common/env.h"
#include "common/status.h"

namespace endure::checkpoint {

// What a trainer hands over to be saved: named tensors plus JSON metadata.
struct TrainingState {
  int64_t step = 0;  // steps completed; training resumes at this step index
  nlohmann::json meta = nlohmann::json::object();
  std::vector<TensorBlob> tensors;
};

// A durable shard as the manifest lists it.
struct ShardEntry {
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

struct CommitStats {
  uint64_t bytes = 0;
  double seconds = 0;
};

// Checks `bytes` (read from `path`) against the size and XXH3 they were
// saved with: kDataLoss naming the path and what differs otherwise.
Status VerifyBytes(const std::string& path, std::string_view bytes, uint64_t size, uint64_t xxh3);

class CheckpointDir {
 public:
  // `env` must outlive this object.
  CheckpointDir(Env* env, std::string root);

  const std::string& root() const { return root_; }
  std::string StepDir(int64_t step) const;

  static std::string ShardFileName(int shard);  // "shard-00003.bin"
  std::string ShardPath(int64_t step, int shard) const;

  // Writes and commits `state` as step `state.step` in one shard, replacing
  // any uncommitted leftovers of that step. On failure nothing is committed.
  Result<CommitStats> Commit(const TrainingState& state);
  // The same from tensors seen in place (no copy of the state first).
  Result<CommitStats> CommitViews(int64_t step, const nlohmann::json& meta,
                                  const std::vector<TensorView>& tensors);

  // Writes one shard of `step` durably (creating the step's directory);
  // does not commit the step. Returns its size and checksum.
  Result<ShardEntry> WriteShard(int64_t step, int shard, std::string_view bytes);
  // The same for bytes whose checksum the caller computed while producing them.
  Result<ShardEntry> WriteShard(int64_t step, int shard, std::string_view bytes, uint64_t xxh3);

  // Commits `step`, whose shards (index = shard) are already durable, by
  // writing its manifest. On failure nothing is committed.
  Status CommitStep(int64_t step, const std::vector<ShardEntry>& shards);

  // The shards a committed step's manifest lists (index = shard), without
  // reading them; kDataLoss when the manifest is missing or malformed.
  Result<std::vector<ShardEntry>> CommittedShards(int64_t step) const;

  // Steps that have a directory, committed or not, ascending.
  std::vector<int64_t> ListSteps() const;

  // Checks the manifest and every file of `step` against it.
  Status Verify(int64_t step) const;

  // Reads one shard of a committed step and checks it against the manifest.
  Result<std::string> ReadShard(int64_t step, int shard) const;
  // The same with the step's manifest already read (CommittedShards): a
  // caller that reads several shards of a step parses its manifest once.
  Result<std::string> ReadListedShard(int64_t step, int shard,
                                      const std::vector<ShardEntry>& shards) const;

  // Loads and verifies `step` (every shard, merged).
  Result<TrainingState> Load(int64_t step) const;

  // Loads the newest step that verifies. Each refused step is described in
  // `refused` (if non-null), newest first. kNotFound when none verifies.
  Result<TrainingState> LoadNewest(std::vector<std::string>* refused) const;

  // Loads the newest step at or before `step` that verifies (a rollback to
  // before an anomaly); newer steps are not looked at. Each refused step is
  // described in `refused` (if non-null), newest first. kNotFound when none
  // verifies.
  Result<TrainingState> LoadNewestAtOrBefore(int64_t step, std::vector<std::string>* refused) const;

  // Deletes all but the newest `keep` committed steps, and uncommitted
  // leftovers (no manifest, or a malformed one) older than the newest
  // committed one. Never deletes the newest committed step that verifies,
  // nor a step whose manifest cannot be read (an I/O error may hide a good
  // one). To find the newest step that verifies it re-reads and hashes whole
  // shards, newest first, unless `verified` names a committed step the caller
  // knows to verify (it wrote the manifest from the checksums of the bytes it
  // wrote): that step is then kept in its place and no shard is read.
  Status Retain(int keep, std::optional<int64_t> verified = std::nullopt);

  // Deletes one step's directory, committed or not, and syncs the root.
  Status RemoveStep(int64_t step);

  // Deletes every step after `step`, committed or not (a rollback abandons
  // them). Returns the steps deleted.
  Result<std::vector<int64_t>> RemoveAfter(int64_t step);

 private:
  Result<nlohmann::json> ReadManifest(int64_t step) const;

  Env* env_;
  std::string root_;
};

}  // namespace endure::checkpoint
