// The checkpoint directory the manifest target reads: step kStep of a small
// fixed state in two shards, written by CheckpointDir itself. The seed
// generator (fuzz_seeds) writes the manifest CheckpointDir commits for it,
// so that seeds get as far as loading the shards.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/tensor_blob.h"
#include "fuzz/fuzz_util.h"

namespace endure::fuzz {

inline constexpr int64_t kManifestStep = 10;
inline constexpr char kManifestRoot[] = "/ckpt";

// Writes the two shards of kManifestStep into `env` (not committed) and
// returns their entries, as CommitStep takes them.
inline std::vector<checkpoint::ShardEntry> WriteFixtureShards(Env* env) {
  checkpoint::CheckpointDir dir(env, kManifestRoot);
  std::vector<checkpoint::ShardEntry> entries;
  for (int shard = 0; shard < 2; ++shard) {
    const std::string meta = R"({"step":10,"shard":)" + std::to_string(shard) + "}";
    const std::string values(16, static_cast<char>('a' + shard));
    const checkpoint::TensorBlob blob{"model/w" + std::to_string(shard), "float32", {2, 2}, values};
    std::vector<checkpoint::TensorView> views =
        checkpoint::ShardViews(meta, {checkpoint::ViewOf(blob)});
    std::string bytes(checkpoint::EncodedSize(views), '\0');
    checkpoint::EncodeTensorsInto(views, bytes.data());
    Result<checkpoint::ShardEntry> e = dir.WriteShard(kManifestStep, shard, bytes);
    FUZZ_CHECK(e.ok());
    entries.push_back(*e);
  }
  return entries;
}

}  // namespace endure::fuzz
