// The checkpoint engine's figures, printed:
//  1. blocking time per save against state size: the copy into a T0 slot in
//     shared memory (what a training step waits for under Endure) against a
//     synchronous save (serialize, write, fsync, rename, manifest: what
//     torch.save to disk inside the step costs), and their ratio;
//  2. restore time of the demo job's state (875,264 parameters with AdamW:
//     10.5 MB in 2 shards) from each tier: T0/T1 (a snapshot file in shared
//     memory, checked against its XXH3) and T2 (the durable directory,
//     checked against the manifest), decoding included;
//  3. durable load time (read + verify + decode) against state size.
//
//   build/bin/checkpoint_bench [DIR] [MAX_MB]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/snapshot_file.h"

using endure::checkpoint::CheckpointDir;
using endure::checkpoint::TensorView;
using endure::checkpoint::TrainingState;

namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `mb` tensors of 1 MiB each, like many parameter tensors of a model.
TrainingState State(int64_t step, int mb) {
  TrainingState state;
  state.step = step;
  state.meta = {{"step", step}};
  for (int i = 0; i < mb; ++i) {
    std::string bytes(1 << 20, '\0');
    for (size_t j = 0; j < bytes.size(); j += 64) bytes[j] = static_cast<char>(i + j);
    state.tensors.push_back({"t" + std::to_string(i), "float32", {1 << 18}, std::move(bytes)});
  }
  return state;
}

std::vector<TensorView> Views(const TrainingState& state, const std::string& meta) {
  std::vector<TensorView> v;
  for (const auto& t : state.tensors) v.push_back(endure::checkpoint::ViewOf(t));
  return endure::checkpoint::ShardViews(meta, std::move(v));
}

void Fail(const endure::Status& st) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", st.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/endure_checkpoint_bench";
  const int max_mb = argc > 2 ? std::atoi(argv[2]) : 1024;
  endure::Env* env = endure::Env::Default();
  (void)env->RemoveAll(dir);
  const std::string shm = "/dev/shm/endure_checkpoint_bench";
  (void)env->RemoveAll(shm);
  if (!env->CreateDirs(dir).ok() || !env->CreateDirs(shm).ok()) {
    std::fprintf(stderr, "checkpoint_bench: cannot create %s or %s\n", dir.c_str(), shm.c_str());
    return 2;
  }
  CheckpointDir ckpt(env, dir);

  std::printf("== blocking time per save: copy into a T0 slot vs. a synchronous durable save\n");
  std::printf("%10s %12s %12s %14s %10s %12s\n", "state_MB", "t0_save_ms", "t0_GB/s",
              "sync_save_ms", "sync/t0", "load_ms");
  for (int size_mb : {1, 4, 16, 64, 256, 1024}) {
    if (size_mb > max_mb) break;
    TrainingState state = State(size_mb, size_mb);
    const std::string meta = state.meta.dump();
    auto writer = endure::checkpoint::SnapshotWriter::Open(shm, size_mb, 1, 0);
    if (!writer.ok()) Fail(writer.status());
    // The first save into each slot sizes it (and faults its pages in): it
    // happens once per job. Then the steady state, as every step sees it.
    std::vector<double> t0;
    for (int i = 0; i < 2 + 5; ++i) {
      auto start = std::chrono::steady_clock::now();
      auto saved = (*writer)->Save(i + 1, Views(state, meta));
      if (!saved.ok()) Fail(saved.status());
      if (i >= 2) t0.push_back(Since(start));
    }
    std::vector<double> sync;
    for (int i = 0; i < (size_mb >= 256 ? 1 : 3); ++i) {
      auto start = std::chrono::steady_clock::now();
      auto stats = ckpt.Commit(state);
      if (!stats.ok()) Fail(stats.status());
      sync.push_back(Since(start));
    }
    auto start = std::chrono::steady_clock::now();
    auto loaded = ckpt.Load(state.step);
    if (!loaded.ok()) Fail(loaded.status());
    const double load_s = Since(start);
    const double t0_s = Median(t0), sync_s = Median(sync);
    std::printf("%10d %12.2f %12.2f %14.1f %10.0f %12.1f\n", size_mb, t0_s * 1e3,
                size_mb / 1024.0 / t0_s, sync_s * 1e3, sync_s / t0_s, load_s * 1e3);
    (void)env->RemoveAll(ckpt.StepDir(state.step));
    writer->reset();
    for (int slot = 0; slot < 2; ++slot) {
      (void)env->RemoveFile(endure::checkpoint::SlotPath(shm, size_mb, slot));
    }
  }

  // The demo job's state: 875,264 parameters, each with two AdamW moments,
  // float32, split over 2 ranks.
  std::printf("\n== restore of the demo job's state (10.5 MB in 2 shards) from each tier\n");
  const int64_t floats = 875264 * 3;
  TrainingState demo;
  demo.step = 100;
  for (int s = 0; s < 2; ++s) {
    demo.tensors.push_back({"shard" + std::to_string(s),
                            "float32",
                            {floats / 2},
                            std::string(static_cast<size_t>(floats / 2 * 4), '\x3f')});
  }
  std::vector<endure::checkpoint::ShardCopy> t0_copies, t2_copies;
  std::vector<endure::checkpoint::ShardEntry> entries;
  for (int s = 0; s < 2; ++s) {
    const std::string meta = "{\"step\":100}";
    auto writer = endure::checkpoint::SnapshotWriter::Open(shm, s, 2, 0);
    if (!writer.ok()) Fail(writer.status());
    std::vector<TensorView> v = endure::checkpoint::ShardViews(
        meta, {endure::checkpoint::ViewOf(demo.tensors[static_cast<size_t>(s)])});
    auto saved = (*writer)->Save(100, v);
    if (!saved.ok() || !saved->has_value()) Fail(endure::Internal("demo save"));
    endure::checkpoint::ShardCopy c;
    c.step = 100;
    c.shard = s;
    c.shards = 2;
    c.path = (*saved)->path;
    c.bytes = (*saved)->bytes;
    c.xxh3 = (*saved)->xxh3;
    t0_copies.push_back(c);
    std::string bytes(endure::checkpoint::EncodedSize(v), '\0');
    endure::checkpoint::EncodeTensorsInto(v, bytes.data());
    auto entry = ckpt.WriteShard(100, s, bytes);
    if (!entry.ok()) Fail(entry.status());
    entries.push_back(*entry);
    c.tier = endure::checkpoint::Tier::kT2;
    c.path = ckpt.ShardPath(100, s);
    t2_copies.push_back(c);
  }
  if (auto st = ckpt.CommitStep(100, entries); !st.ok()) Fail(st);
  std::printf("%-22s %12s %12s\n", "tier", "shard_ms", "state_ms");
  for (int row = 0; row < 3; ++row) {
    const auto* copies = row == 0 ? &t0_copies : &t2_copies;
    const bool cold = row == 2;
    std::vector<double> shard_s, state_s;
    for (int i = 0; i < 5; ++i) {
      if (cold) {
        // Out of the page cache: the read goes to the disk.
        for (const auto& c : *copies) {
          const int fd = open(c.path.c_str(), O_RDONLY);
          if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
          }
        }
      }
      auto start = std::chrono::steady_clock::now();
      double first = 0;
      for (const auto& c : *copies) {
        auto bytes = endure::checkpoint::ReadShardCopy(c);
        if (!bytes.ok()) Fail(bytes.status());
        auto decoded = endure::checkpoint::DecodeShard(*bytes, c.path);
        if (!decoded.ok()) Fail(decoded.status());
        if (first == 0) first = Since(start);
      }
      shard_s.push_back(first);
      state_s.push_back(Since(start));
    }
    const char* names[] = {"T0/T1 (shared memory)", "T2 (page cache)", "T2 (cold, from disk)"};
    std::printf("%-22s %12.2f %12.2f\n", names[row], Median(shard_s) * 1e3, Median(state_s) * 1e3);
  }
  (void)env->RemoveAll(dir);
  (void)env->RemoveAll(shm);
  return 0;
}
