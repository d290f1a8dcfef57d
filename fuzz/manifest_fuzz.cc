// Fuzz target: the manifest reader of CheckpointDir (MANIFEST.json of a
// step) on any text, in an in-memory directory that holds two real shards
// of the step. Whatever the manifest says, the readers return a Status;
// a manifest they accept lists what CommitStep would write for the same
// entries, and a step that loads also verifies.
#include <cstddef>
#include <cstdint>

#include "checkpoint/checkpoint_dir.h"
#include "common/env.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/manifest_fixture.h"

using namespace endure;
using checkpoint::CheckpointDir;
using checkpoint::ShardEntry;

namespace {

bool SameEntries(const std::vector<ShardEntry>& a, const std::vector<ShardEntry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].bytes != b[i].bytes || a[i].xxh3 != b[i].xxh3) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::MemEnv* const base = [] {
    auto* env = new fuzz::MemEnv;
    fuzz::WriteFixtureShards(env);
    return env;
  }();
  fuzz::MemEnv env = *base;
  CheckpointDir dir(&env, fuzz::kManifestRoot);
  const int64_t step = fuzz::kManifestStep;
  FUZZ_CHECK(WriteFileAtomically(&env, JoinPath(dir.StepDir(step), "MANIFEST.json"),
                                 fuzz::AsText(data, size))
                 .ok());

  Result<std::vector<ShardEntry>> shards = dir.CommittedShards(step);
  const Status verified = dir.Verify(step);
  Result<checkpoint::TrainingState> loaded = dir.Load(step);
  std::vector<std::string> refused;
  Result<checkpoint::TrainingState> newest = dir.LoadNewest(&refused);
  FUZZ_CHECK(loaded.ok() == newest.ok());
  if (!shards.ok()) {
    FUZZ_CHECK(shards.status().code() == StatusCode::kDataLoss);
    FUZZ_CHECK(!verified.ok() && !loaded.ok());
    FUZZ_CHECK(refused.size() == 1);
    return 0;
  }
  FUZZ_CHECK(!shards->empty());
  for (int i = -1; i <= static_cast<int>(std::min<size_t>(shards->size(), 4)); ++i) {
    Result<std::string> bytes = dir.ReadShard(step, i);
    if (i < 0 || i >= static_cast<int>(shards->size())) FUZZ_CHECK(!bytes.ok());
    if (bytes.ok()) FUZZ_CHECK(bytes->size() == (*shards)[static_cast<size_t>(i)].bytes);
  }
  if (loaded.ok()) {
    FUZZ_CHECK(verified.ok());
    FUZZ_CHECK(loaded->step == step && newest->step == step);
    FUZZ_CHECK(loaded->meta.is_object());
  }

  // What the manifest lists is what CommitStep writes for those entries.
  fuzz::MemEnv fresh;
  CheckpointDir copy(&fresh, fuzz::kManifestRoot);
  FUZZ_CHECK(fresh.CreateDirs(copy.StepDir(step)).ok());
  FUZZ_CHECK(copy.CommitStep(step, *shards).ok());
  Result<std::vector<ShardEntry>> again = copy.CommittedShards(step);
  FUZZ_CHECK(again.ok() && SameEntries(*shards, *again));

  // Retention never deletes the only committed step.
  FUZZ_CHECK(dir.Retain(1).ok());
  FUZZ_CHECK(dir.CommittedShards(step).ok());
  return 0;
}
