// TierStore: a node's checkpoint memory (T0, T1) and its persistence (T2).
//
// Workers copy their shard of each step into T0 slot files under SHM/t0
// (src/checkpoint/snapshot_file.h) and announce it. Behind training, at the
// lowest priority (nice 19), the store pins the snapshot in its slot and, reading it in place (no
// copy: the worker writes into its other slots meanwhile), sends it to the
// peer agent (T1, over src/checkpoint/replica_link.h) and, when its step is
// due, writes it to the durable directory (T2: tmp -> fsync -> rename ->
// fsync(dir); the controller commits the step once every shard is durable).
// Replicas from a peer land in SHM/t1, the newest two per shard, streamed
// into their file as they arrive and checked against their checksum on the
// way. Inventory() lists and
// verifies what the node holds, for the controller's choice of restore point.
//
// Everything a worker or a peer says is checked before it names a file: a
// notice's path is the worker's own slot (contract/worker_contract.h), a slot header
// must name the worker's own shard, and a replica's node must be a valid
// node name (common/names.h). A replica is bounded by the generation's
// memory budget (else by ReplicaLimit's default) before its bytes arrive.
//
// Thread-safe: the agent's threads call it; an internal thread does the work,
// and the replica server's thread keeps what peers send.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/replica_link.h"
#include "checkpoint/restore_plan.h"
#include "checkpoint/snapshot_file.h"
#include "common/fault_injection_env.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/tls.h"

namespace endure::agent {

struct TierStoreOptions {
  std::string node;     // this node's name (IsValidNodeName)
  std::string shm_dir;  // where T0 and T1 live (a tmpfs); created, and removed at the end
  std::string token;    // the job token, required on replicas
  std::string host = "127.0.0.1";  // the replica server listens here, on a free port
  // Mutual TLS on the replica link, both ways (this node's identity); null:
  // plain TCP.
  std::shared_ptr<const tls::Context> tls;
};

// What a generation asks of the store.
struct TierConfig {
  std::string durable_dir;     // T2; empty: no persistence
  std::string replica_peer;    // host:port; empty: no T1 copy of this node
  uint64_t memory_budget = 0;  // T0 + T1 bytes on this node; 0: no limit

  bool operator==(const TierConfig&) const = default;
};

// The most bytes one replica may claim under `config`: its memory budget
// when it has one, else kMaxReplicaBytes or half of this machine's memory,
// whichever is less.
uint64_t ReplicaLimit(const TierConfig& config);
inline constexpr uint64_t kMaxReplicaBytes = uint64_t{64} << 30;

// Stale checkpoint memory: removes each directory `parent`/endure-PID-NODE
// (what TierStore::Start names shm_dir: the agent's pid and node) whose
// agent is gone, i.e. `is_live_agent(PID)` is false, and which this user
// owns; never one of a live agent, never a symlink, nothing else in
// `parent`. Returns the paths removed.
std::vector<std::string> SweepStaleShm(const std::string& parent,
                                       const std::function<bool(pid_t)>& is_live_agent);
// Whether `pid` is a running `endure agent` process (its command line says
// so), as seen in /proc.
bool IsLiveEndureAgent(pid_t pid);

// A snapshot a worker announced.
struct SnapshotNotice {
  int rank = 0;
  int64_t step = 0;
  int shards = 1;
  std::string path;
  bool durable = true;  // its step is due in T2 (the node core's cadence)
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
  // The configuration of the last Configure.
  TierConfig config() const;

  // Queues a worker's snapshot for replication and, when it is due there,
  // persistence. At most two notices of each rank wait (core/snapshot_queue.h:
  // the newest due in T2, and the newest of all): a flood of notices cannot
  // grow the queue, nor skip a durable step.
  void Notify(SnapshotNotice notice);
  // Notices queued and not yet taken up (at most two per rank).
  size_t pending_notices() const;
  // Waits until the queued work is done.
  void Drain();
  // The same, until `deadline` at most; false when work is still going on.
  bool DrainUntil(std::chrono::steady_clock::time_point deadline);
  // Persists `rank`'s newest T0 snapshot now unless it already is (a worker
  // that finished cleanly: its final state must be durable).
  void PersistNewest(int rank);
  // Shutdown: persists the newest step that every rank of `ranks` holds in
  // T0 (the node's newest complete step), shard by shard, unless it already
  // is, starting no shard after `deadline`. Returns that step when it
  // persisted a shard of it; -1 when there is none, it is durable already,
  // or the deadline has passed.
  int64_t PersistNewestComplete(const std::set<int>& ranks,
                                std::chrono::steady_clock::time_point deadline);
  // Shutdown: ends a replication in flight at once and sends no more.
  void CancelReplication();

  // Every copy in T0 and T1, each verified against its checksum.
  std::vector<checkpoint::ShardCopy> Inventory() const;
  MemoryUsage Usage() const;

  // Fault injection: persisting fails with `error` from now on.
  void FailPersistence(InjectedError error);
  // Fault injection: flips a byte in every copy of `shard` in `tier` (T0, T1).
  void Corrupt(checkpoint::Tier tier, int shard);

 private:
  TierStore() = default;
  void ReplicateLoop();  // nice 19: replication and persistence, one snapshot at a time
  // Pins the snapshot a notice names, sends and persists it from its slot.
  void Replicate(const SnapshotNotice& notice);
  // Sends it to the replica peer, and persists it when `durable` (its step
  // is due in T2).
  void Send(const checkpoint::SnapshotInfo& info, std::string_view payload, bool durable);
  // Writes a shard to T2; `xxh3` is what the worker saved, which the bytes
  // written must match.
  void Persist(int shard, int shards, int64_t step, std::string_view payload, uint64_t xxh3);
  // Persists the snapshot `file` holds unless its step already is; whether
  // it tried (the outcome goes to on_persist).
  bool PersistSlot(checkpoint::SnapshotFile& file);
  // The replica server's sink: where a peer's replica goes (the older of its
  // shard's two T1 slots), or why it is refused before its bytes come.
  Result<std::unique_ptr<checkpoint::ReplicaTarget>> OpenReplica(
      const checkpoint::ReplicaHeader& header);
  std::vector<std::string> SnapshotPaths(const std::string& dir) const;

  TierStoreOptions o_;
  OnPersist on_persist_;
  std::unique_ptr<checkpoint::ReplicaServer> server_;

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<SnapshotNotice> queue_ GUARDED_BY(mu_);
  bool busy_ GUARDED_BY(mu_) = false;  // a notice taken up
  bool stop_ GUARDED_BY(mu_) = false;
  TierConfig config_ GUARDED_BY(mu_);
  std::unique_ptr<FaultInjectionEnv> faulty_ GUARDED_BY(mu_);  // set once persistence is failed
  std::map<int, int64_t> persisted_ GUARDED_BY(mu_);           // shard -> newest step persisted
  bool replication_cancelled_ GUARDED_BY(mu_) = false;
  int cancel_fd_ = -1;  // an eventfd, readable once replication is cancelled
  Mutex t1_mu_;         // serialises T1 writes and evictions
  std::thread replicator_;
};

}  // namespace endure::agent
