// Checkpoint save and load time against state size: CheckpointDir::Commit
// (encode, write, fsync, rename, manifest) and Load (read, verify XXH3,
// decode) on a directory of the real file system. Prints one row per size.
//
//   build/bin/checkpoint_bench [DIR] [MAX_MB]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "checkpoint/checkpoint_dir.h"

using endure::checkpoint::CheckpointDir;
using endure::checkpoint::TrainingState;

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/endure_checkpoint_bench";
  const int max_mb = argc > 2 ? std::atoi(argv[2]) : 256;
  endure::Env* env = endure::Env::Default();
  (void)env->RemoveAll(dir);
  if (!env->CreateDirs(dir).ok()) {
    std::fprintf(stderr, "checkpoint_bench: cannot create %s\n", dir.c_str());
    return 2;
  }
  CheckpointDir ckpt(env, dir);
  std::printf("%10s %12s %12s %12s %12s\n", "state_MB", "save_ms", "save_MB/s", "load_ms",
              "load_MB/s");
  for (int mb = 1; mb <= max_mb; mb *= 4) {
    TrainingState state;
    state.step = mb;
    // Tensors of 1 MiB each, like many parameter tensors of a model.
    for (int i = 0; i < mb; ++i) {
      std::string bytes(1 << 20, '\0');
      for (size_t j = 0; j < bytes.size(); j += 64) bytes[j] = static_cast<char>(i + j);
      state.tensors.push_back({"t" + std::to_string(i), "float32", {1 << 18}, std::move(bytes)});
    }
    auto t0 = std::chrono::steady_clock::now();
    auto stats = ckpt.Commit(state);
    auto t1 = std::chrono::steady_clock::now();
    auto loaded = ckpt.Load(mb);
    auto t2 = std::chrono::steady_clock::now();
    if (!stats.ok() || !loaded.ok()) {
      std::fprintf(stderr, "checkpoint_bench: %s\n",
                   (stats.ok() ? loaded.status() : stats.status()).ToString().c_str());
      return 1;
    }
    const double save_s = std::chrono::duration<double>(t1 - t0).count();
    const double load_s = std::chrono::duration<double>(t2 - t1).count();
    std::printf("%10d %12.1f %12.0f %12.1f %12.0f\n", mb, save_s * 1e3, mb / save_s, load_s * 1e3,
                mb / load_s);
    (void)env->RemoveAll(ckpt.StepDir(mb));
  }
  (void)env->RemoveAll(dir);
  return 0;
}
