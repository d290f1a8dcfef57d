// TierStore: a node's checkpoint memory (T0, T1) and its persistence (T2).
//
// Workers copy their shard of each step into T0 slot files under SHM/t0
// (src/checkpoint/snapshot_file.h) and announce it. Behind training, at nice
// 10, the store copies the snapshot out of its slot (pinned only for that
// copy), then sends it to the peer agent (T1, over
// src/checkpoint/replica_link.h) and, when its step is due, writes it to the
// durable directory (T2: tmp -> fsync -> rename -> fsync(dir); the
// controller commits the step once every shard is durable). Replicas from a
// peer land in SHM/t1, the newest two per shard. Inventory() lists and
// verifies what the node holds, for the controller's choice of restore point.
//
// Thread-safe: the agent's threads call it; two internal threads do the work.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/replica_link.h"
#include "checkpoint/restore_plan.h"
#include "checkpoint/snapshot_file.h"
#include "common/fault_injection_env.h"
#include "common/status.h"

namespace endure::agent {

struct TierStoreOptions {
  std::string node;     // this node's name
  std::string shm_dir;  // where T0 and T1 live (a tmpfs); created, and removed at the end
  std::string token;    // the job token, required on replicas
  std::string host = "127.0.0.1";  // the replica server listens here, on a free port
};

// What a generation asks of the store.
struct TierConfig {
  std::string durable_dir;          // T2; empty: no persistence
  int64_t persist_every_steps = 0;  // persist every N-th step; 0: every snapshot
  std::string replica_peer;         // host:port; empty: no T1 copy of this node
  uint64_t memory_budget = 0;       // T0 + T1 bytes on this node; 0: no limit
};

// A snapshot a worker announced.
struct SnapshotNotice {
  int rank = 0;
  int64_t step = 0;
  int shards = 1;
  std::string path;
};

struct PersistReport {
  int64_t step = 0;
  int shard = 0;
  int shards = 1;
  checkpoint::ShardEntry entry;
  std::string error;  // non-empty: it failed
};

struct MemoryUsage {
  uint64_t t0_bytes = 0;
  uint64_t t1_bytes = 0;
};

class TierStore {
 public:
  using OnPersist = std::function<void(const PersistReport&)>;
  static Result<std::unique_ptr<TierStore>> Start(TierStoreOptions options, OnPersist on_persist);
  ~TierStore();

  const std::string& shm_dir() const { return o_.shm_dir; }
  std::string t0_dir() const;
  int replica_port() const;

  // A new generation: its configuration, and snapshots of steps after
  // `discard_after` (>= 0) are dropped from T0 and T1 (a rollback).
  void Configure(const TierConfig& config, int64_t discard_after);

  // Queues a worker's snapshot for replication and persistence.
  void Notify(SnapshotNotice notice);
  // Waits until the queued work is done.
  void Drain();
  // Persists `rank`'s newest T0 snapshot now unless it already is (a worker
  // that finished cleanly: its final state must be durable).
  void PersistNewest(int rank);

  // Every copy in T0 and T1, each verified against its checksum.
  std::vector<checkpoint::ShardCopy> Inventory() const;
  MemoryUsage Usage() const;

  // Fault injection: persisting fails with `error` from now on.
  void FailPersistence(InjectedError error);
  // Fault injection: flips a byte in every copy of `shard` in `tier` (T0, T1).
  void Corrupt(checkpoint::Tier tier, int shard);

 private:
  TierStore() = default;
  // A snapshot copied out of its T0 slot, to replicate and persist.
  struct Job {
    std::string path;
    checkpoint::SnapshotInfo info;
    std::string bytes;
  };
  void CopyLoop();  // nice 10: pins a slot only to copy it out
  std::optional<Job> CopyOut(const SnapshotNotice& notice);
  void SendLoop();  // nice 10: replication and persistence
  void Send(const Job& job);
  // Writes a shard to T2; `xxh3` is what the worker saved, which the bytes
  // written must match.
  void Persist(int shard, int shards, int64_t step, std::string_view payload, uint64_t xxh3);
  void KeepReplica(const checkpoint::ReplicaHeader& header, std::string payload);
  std::vector<std::string> SnapshotPaths(const std::string& dir) const;

  TierStoreOptions o_;
  OnPersist on_persist_;
  std::unique_ptr<checkpoint::ReplicaServer> server_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SnapshotNotice> queue_;           // GUARDED_BY(mu_)
  bool copying_ = false;                       // GUARDED_BY(mu_)
  std::optional<Job> job_;                     // copied, not yet taken; GUARDED_BY(mu_)
  bool sending_ = false;                       // GUARDED_BY(mu_)
  bool stop_ = false;                          // GUARDED_BY(mu_)
  TierConfig config_;                          // GUARDED_BY(mu_)
  std::unique_ptr<FaultInjectionEnv> faulty_;  // GUARDED_BY(mu_); set once persistence is failed
  std::map<int, int64_t> persisted_;           // shard -> newest step persisted; GUARDED_BY(mu_)
  std::mutex t1_mu_;                           // serialises T1 writes and evictions
  std::thread copier_, sender_;
};

}  // namespace endure::agent
