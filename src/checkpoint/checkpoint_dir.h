// CheckpointDir: durable checkpoints of a training state in one directory,
// committed atomically and verified before they are loaded.
//
// Layout: ROOT/step-00000010/{tensors.bin, meta.json, MANIFEST.json}. Each
// file is written tmp -> fsync -> rename -> fsync(dir); MANIFEST.json, which
// lists every file with its size and XXH3-64 checksum, is written last the
// same way, and its presence is what commits the step. A step whose manifest
// is missing, unreadable, or whose files do not match it is refused with a
// message naming the file, and never loaded.
//
// Not thread-safe; one writer per directory.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
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

struct CommitStats {
  uint64_t bytes = 0;
  double seconds = 0;
};

class CheckpointDir {
 public:
  // `env` must outlive this object.
  CheckpointDir(Env* env, std::string root);

  const std::string& root() const { return root_; }
  std::string StepDir(int64_t step) const;

  // Writes and commits `state` as step `state.step`, replacing any
  // uncommitted leftovers of that step. On failure nothing is committed.
  Result<CommitStats> Commit(const TrainingState& state);

  // Steps that have a directory, committed or not, ascending.
  std::vector<int64_t> ListSteps() const;

  // Checks the manifest and every file of `step` against it.
  Status Verify(int64_t step) const;

  // Loads and verifies `step`.
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
  // leftovers older than the newest committed one. Never deletes the newest
  // committed step.
  Status Retain(int keep);

 private:
  Result<nlohmann::json> ReadManifest(int64_t step) const;

  Env* env_;
  std::string root_;
};

}  // namespace endure::checkpoint
