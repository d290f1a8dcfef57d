// The CPU cost of the memory tiers behind training, per snapshot of the demo
// job's shard (875,264 parameters with two AdamW moments, float32, over 2
// ranks: 5.25 MB): a worker's copy into its T0 slot, and what its agent does
// next (tier store: the replica to the peer agent over TCP, read from the
// pinned slot, the peer streaming it into T1, and a durable write when one
// is due).
// Two agents' tier stores run in this process on 127.0.0.1; the figures are
// this process's CPU time (every thread) per snapshot, the worker's own copy
// apart, and the wall time until the replica is kept.
//
//   build/bin/replication_bench [DIR] [SNAPSHOTS]
#include <malloc.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "agent/tier_store.h"
#include "checkpoint/snapshot_file.h"
#include "common/env.h"

using endure::agent::TierConfig;
using endure::agent::TierStore;

namespace {

double CpuSeconds(int who) {
  rusage ru{};
  getrusage(who, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

template <typename T>
T Check(endure::Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "replication_bench: %s: %s\n", what, r.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

std::unique_ptr<TierStore> Store(const std::string& node, const std::string& shm) {
  endure::agent::TierStoreOptions o;
  o.node = node;
  o.shm_dir = shm;
  o.token = "bench-token";
  return Check(TierStore::Start(o,
                                [](const endure::agent::PersistReport& r) {
                                  if (!r.error.empty())
                                    std::fprintf(stderr, "persist: %s\n", r.error.c_str());
                                }),
               "start a tier store");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/endure_replication_bench";
  const int snapshots = argc > 2 ? std::atoi(argv[2]) : 200;
  // As `endure agent` does (agent.cc): freed buffers stay in the heap.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  endure::Env* env = endure::Env::Default();
  if (!env->RemoveAll(dir).ok() || !env->CreateDirs(dir).ok()) {
    std::fprintf(stderr, "replication_bench: cannot create %s\n", dir.c_str());
    return 2;
  }
  std::unique_ptr<TierStore> sender = Store("node0", "/dev/shm/endure-replication-bench-0");
  std::unique_ptr<TierStore> receiver = Store("node1", "/dev/shm/endure-replication-bench-1");
  const std::string peer = "127.0.0.1:" + std::to_string(receiver->replica_port());

  // The demo shard, as a few tensors of the sizes a GPT's state has.
  const int64_t floats = 875264 * 3 / 2;
  std::vector<std::vector<float>> tensors;
  for (int64_t left = floats; left > 0;) {
    const int64_t n = std::min<int64_t>(left, 128 * 512);
    tensors.emplace_back(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tensors.back()[static_cast<size_t>(i)] = 1e-3f * (i % 977);
    left -= n;
  }
  std::vector<endure::checkpoint::TensorView> views;
  for (size_t i = 0; i < tensors.size(); ++i) {
    views.push_back({"t" + std::to_string(i),
                     "float32",
                     {static_cast<int64_t>(tensors[i].size())},
                     tensors[i].data(),
                     tensors[i].size() * sizeof(float)});
  }
  views = endure::checkpoint::ShardViews("{\"step\":0}", std::move(views));
  auto writer = Check(endure::checkpoint::SnapshotWriter::Open(sender->t0_dir(), 0, 2, 0),
                      "open the T0 slots");

  struct Case {
    const char* title;
    TierConfig config;
  };
  const std::vector<Case> cases = {
      {"T0 only (taken up, nothing to send)", TierConfig{}},
      {"T0 + T1 replica to the peer", TierConfig{.replica_peer = peer}},
      {"T0 + T1 + T2 on every snapshot", TierConfig{.durable_dir = dir, .replica_peer = peer}},
  };
  std::printf("%zu snapshots of %.2f MB each\n", static_cast<size_t>(snapshots),
              static_cast<double>(floats) * 4 / 1e6);
  std::printf("%-40s %12s %14s %12s\n", "tiers", "save_ms", "agent_cpu_ms", "wall_ms");
  int64_t step = 0;
  for (const Case& c : cases) {
    sender->Configure(c.config, -1);
    receiver->Configure(TierConfig{}, -1);
    double save_cpu = 0, agent_cpu = 0, wall = 0;
    for (int i = 0; i < snapshots + 5; ++i) {
      ++step;
      const double before = CpuSeconds(RUSAGE_SELF);
      const auto start = std::chrono::steady_clock::now();
      const double thread_before = CpuSeconds(RUSAGE_THREAD);
      auto saved = Check(writer->Save(step, views, std::chrono::seconds(10)), "save");
      if (!saved) {
        std::fprintf(stderr, "replication_bench: the slot stayed pinned\n");
        return 1;
      }
      const double save = CpuSeconds(RUSAGE_THREAD) - thread_before;
      sender->Notify({0, step, 2, saved->path});
      sender->Drain();
      const double total = CpuSeconds(RUSAGE_SELF) - before;
      if (i < 5) continue;  // warm-up: slots and buffers sized
      save_cpu += save;
      agent_cpu += total - save;
      wall += Since(start);
    }
    std::printf("%-40s %12.2f %14.2f %12.2f\n", c.title, 1e3 * save_cpu / snapshots,
                1e3 * agent_cpu / snapshots, 1e3 * wall / snapshots);
  }
  writer.reset();
  sender.reset();
  receiver.reset();
  if (!env->RemoveAll(dir).ok()) return 1;
  return 0;
}
