// The node's checkpoint tiers: T0 slots, T1 replicas, persistence to T2.
#include "agent/tier_store.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "checkpoint/snapshot_file.h"
#include "common/env.h"
#include "common/hash.h"

namespace endure::agent {
namespace {

using checkpoint::ShardCopy;
using checkpoint::SlotState;
using checkpoint::SnapshotFile;
using checkpoint::Tier;

constexpr uint64_t kMaxReplicaBytes = uint64_t{64} << 30;
constexpr Duration kReplicaTimeout = std::chrono::seconds(30);

bool Holds(const checkpoint::SnapshotInfo& info) {
  return info.state == SlotState::kReady || info.state == SlotState::kPinned;
}

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Checkpoint work yields the CPU to training: the calling thread runs at
// `nice` (a thread's own priority on Linux). On a node with spare cores that
// changes nothing; on a busy one training comes first. Nice 10 is about a
// tenth of a core's share when contended: enough for the copy a worker may
// wait for, and for replication to keep up (at nice 19 replicas fell several
// steps behind on 2 busy cores).
void YieldToTraining(int nice) {
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), nice);
}

}  // namespace

Result<std::unique_ptr<TierStore>> TierStore::Start(TierStoreOptions options,
                                                    OnPersist on_persist) {
  std::unique_ptr<TierStore> s(new TierStore());
  s->o_ = std::move(options);
  s->on_persist_ = std::move(on_persist);
  Env* env = Env::Default();
  // Snapshots of an earlier agent on this node belong to no generation we know.
  if (env->Exists(s->o_.shm_dir)) ENDURE_RETURN_IF_ERROR(env->RemoveAll(s->o_.shm_dir));
  ENDURE_RETURN_IF_ERROR(env->CreateDirs(JoinPath(s->o_.shm_dir, "t0")));
  ENDURE_RETURN_IF_ERROR(env->CreateDirs(JoinPath(s->o_.shm_dir, "t1")));
  TierStore* self = s.get();
  ENDURE_ASSIGN_OR_RETURN(s->server_,
                          checkpoint::ReplicaServer::Start(
                              s->o_.host, 0, s->o_.token, kMaxReplicaBytes,
                              [self](const checkpoint::ReplicaHeader& h, std::string payload) {
                                self->KeepReplica(h, std::move(payload));
                              }));
  s->copier_ = std::thread(&TierStore::CopyLoop, self);
  s->sender_ = std::thread(&TierStore::SendLoop, self);
  return s;
}

TierStore::~TierStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (copier_.joinable()) copier_.join();
  if (sender_.joinable()) sender_.join();
  server_.reset();
  (void)Env::Default()->RemoveAll(o_.shm_dir);
}

std::string TierStore::t0_dir() const { return JoinPath(o_.shm_dir, "t0"); }

int TierStore::replica_port() const { return server_->port(); }

std::vector<std::string> TierStore::SnapshotPaths(const std::string& dir) const {
  std::vector<std::string> paths;
  Result<std::vector<std::string>> names = Env::Default()->ListDir(dir);
  if (!names.ok()) return paths;
  for (const std::string& name : *names) {
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) continue;
    paths.push_back(JoinPath(dir, name));
  }
  return paths;
}

void TierStore::Configure(const TierConfig& config, int64_t discard_after) {
  Drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    config_ = config;
    if (discard_after < 0) return;
    std::erase_if(persisted_, [&](const auto& p) { return p.second > discard_after; });
  }
  for (const std::string& path : SnapshotPaths(t0_dir())) {
    Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(path);
    if (f.ok() && (*f)->info().step > discard_after) (*f)->Invalidate();
  }
  // Not under mu_: KeepReplica takes t1_mu_, then mu_.
  std::lock_guard<std::mutex> t1(t1_mu_);
  for (const std::string& path : SnapshotPaths(JoinPath(o_.shm_dir, "t1"))) {
    Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(path);
    if (!f.ok() || (*f)->info().step > discard_after) (void)Env::Default()->RemoveFile(path);
  }
}

void TierStore::Notify(SnapshotNotice notice) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(notice));
  }
  cv_.notify_all();
}

void TierStore::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return (queue_.empty() && !copying_ && !job_ && !sending_) || stop_; });
}

void TierStore::CopyLoop() {
  YieldToTraining(10);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Copied as soon as it is announced, well before the worker needs the
    // slot again; a copy the sender has not taken yet is replaced by a newer.
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    SnapshotNotice n = std::move(queue_.front());
    queue_.pop_front();
    // Only the newest snapshot of a rank matters: older queued ones are
    // skipped when the worker is ahead of replication.
    bool newer_queued = std::any_of(queue_.begin(), queue_.end(), [&](const SnapshotNotice& q) {
      return q.rank == n.rank && q.step > n.step;
    });
    if (newer_queued) continue;
    copying_ = true;
    lock.unlock();
    std::optional<Job> job = CopyOut(n);
    lock.lock();
    copying_ = false;
    if (job) job_ = std::move(job);
    cv_.notify_all();
  }
}

std::optional<TierStore::Job> TierStore::CopyOut(const SnapshotNotice& n) {
  // Pinned only for this copy, on a thread that training does not starve
  // (nice 10): the worker may need the slot again one step from now.
  Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(n.path);
  if (!f.ok() || !(*f)->Pin(n.step)) return std::nullopt;  // already overwritten
  Job job;
  job.path = n.path;
  job.info = (*f)->info();
  Result<std::string_view> payload = (*f)->payload();
  if (payload.ok()) job.bytes.assign(payload->data(), payload->size());
  (*f)->Unpin();
  if (!payload.ok()) return std::nullopt;
  return job;
}

void TierStore::SendLoop() {
  YieldToTraining(10);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || job_.has_value(); });
    if (stop_) return;
    Job job = std::move(*job_);
    job_.reset();
    sending_ = true;
    cv_.notify_all();
    lock.unlock();
    Send(job);
    lock.lock();
    sending_ = false;
    cv_.notify_all();
  }
}

void TierStore::Send(const Job& job) {
  // The worker's checksum travels with the bytes: the peer checks it before
  // keeping a replica, and Persist before reporting a shard durable.
  const checkpoint::SnapshotInfo& info = job.info;
  TierConfig config;
  {
    std::lock_guard<std::mutex> lock(mu_);
    config = config_;
  }
  if (!config.replica_peer.empty()) {
    checkpoint::ReplicaHeader h{o_.node, info.shard, info.shards, info.step, info.bytes, info.xxh3};
    Status st =
        checkpoint::SendReplica(config.replica_peer, o_.token, h, job.bytes, kReplicaTimeout);
    if (!st.ok()) {
      std::fprintf(stderr, "endure agent %s: replica of step %lld shard %d to %s failed: %s\n",
                   o_.node.c_str(), static_cast<long long>(info.step), info.shard,
                   config.replica_peer.c_str(), st.message().c_str());
    }
  }
  const bool due = !config.durable_dir.empty() &&
                   (config.persist_every_steps <= 0 || info.step % config.persist_every_steps == 0);
  if (due) Persist(info.shard, info.shards, info.step, job.bytes, info.xxh3);
}

void TierStore::Persist(int shard, int shards, int64_t step, std::string_view payload,
                        uint64_t xxh3) {
  std::string root;
  Env* env = Env::Default();
  {
    std::lock_guard<std::mutex> lock(mu_);
    root = config_.durable_dir;
    if (faulty_) env = faulty_.get();
  }
  PersistReport report{step, shard, shards, {}, ""};
  Status st = env->CreateDirs(root);
  if (st.ok()) {
    checkpoint::CheckpointDir dir(env, root);
    Result<checkpoint::ShardEntry> entry = dir.WriteShard(step, shard, payload);
    if (!entry.ok()) {
      st = entry.status();
    } else if (entry->xxh3 != xxh3) {
      // Damaged in memory after the worker saved it: never committed.
      st = DataLoss("step " + std::to_string(step) + " shard " + std::to_string(shard) +
                    " changed in memory after it was saved (xxh3 " + HexU64(entry->xxh3) +
                    ", saved as " + HexU64(xxh3) + ")");
    } else {
      report.entry = *entry;
    }
  }
  if (!st.ok()) {
    report.error = st.message();
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    persisted_[shard] = std::max(persisted_[shard], step);
  }
  on_persist_(report);
}

void TierStore::PersistNewest(int rank) {
  Drain();
  std::unique_ptr<SnapshotFile> newest;
  for (int slot = 0; slot < 2; ++slot) {
    Result<std::unique_ptr<SnapshotFile>> f =
        SnapshotFile::Open(checkpoint::SlotPath(t0_dir(), rank, slot));
    if (!f.ok() || !Holds((*f)->info())) continue;
    if (!newest || (*f)->info().step > newest->info().step) newest = std::move(f).value();
  }
  if (!newest) return;
  const checkpoint::SnapshotInfo info = newest->info();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (config_.durable_dir.empty()) return;
    auto it = persisted_.find(info.shard);
    if (it != persisted_.end() && it->second >= info.step) return;
  }
  if (!newest->Pin(info.step)) return;
  Result<std::string_view> payload = newest->payload();
  if (payload.ok()) Persist(info.shard, info.shards, info.step, *payload, info.xxh3);
  newest->Unpin();
}

void TierStore::KeepReplica(const checkpoint::ReplicaHeader& h, std::string payload) {
  YieldToTraining(10);  // the replica server's thread: a syscall, once a replica
  std::lock_guard<std::mutex> t1(t1_mu_);
  uint64_t budget = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    budget = config_.memory_budget;
  }
  // Two slots per peer shard, like T0: the new replica replaces the older.
  const std::string dir = JoinPath(o_.shm_dir, "t1");
  std::string slots[2];
  int64_t steps[2] = {-1, -1};
  for (int i = 0; i < 2; ++i) {
    slots[i] =
        JoinPath(dir, h.node + "-shard-" + std::to_string(h.shard) + ".slot-" + std::to_string(i));
    Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(slots[i]);
    if (f.ok() && Holds((*f)->info())) steps[i] = (*f)->info().step;
  }
  const int target = steps[0] <= steps[1] ? 0 : 1;
  if (budget > 0) {
    // The target's own bytes are reused; the other copy goes first if need be.
    const MemoryUsage used = Usage();
    uint64_t held = used.t0_bytes + used.t1_bytes - FileSize(slots[target]);
    const uint64_t need = payload.size() + 64;
    if (held + need > budget) {
      (void)Env::Default()->RemoveFile(slots[1 - target]);
      const MemoryUsage now = Usage();
      held = now.t0_bytes + now.t1_bytes - FileSize(slots[target]);
    }
    if (held + need > budget) {
      (void)Env::Default()->RemoveFile(slots[target]);
      std::fprintf(stderr,
                   "endure agent %s: replica of step %lld shard %d from %s dropped: %llu bytes "
                   "would exceed the memory budget of %llu\n",
                   o_.node.c_str(), static_cast<long long>(h.step), h.shard, h.node.c_str(),
                   static_cast<unsigned long long>(need), static_cast<unsigned long long>(budget));
      return;
    }
  }
  checkpoint::SnapshotInfo info;
  info.step = h.step;
  info.shard = h.shard;
  info.shards = h.shards;
  info.xxh3 = h.xxh3;
  Status st = checkpoint::WriteSnapshotFile(slots[target], info, payload);
  if (!st.ok()) {
    std::fprintf(stderr, "endure agent %s: cannot keep a replica: %s\n", o_.node.c_str(),
                 st.message().c_str());
  }
}

std::vector<ShardCopy> TierStore::Inventory() const {
  std::vector<ShardCopy> copies;
  for (Tier tier : {Tier::kT0, Tier::kT1}) {
    const std::string dir = JoinPath(o_.shm_dir, tier == Tier::kT0 ? "t0" : "t1");
    for (const std::string& path : SnapshotPaths(dir)) {
      Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(path);
      if (!f.ok()) continue;
      const checkpoint::SnapshotInfo info = (*f)->info();
      if (!Holds(info)) continue;
      ShardCopy c;
      c.step = info.step;
      c.shard = info.shard;
      c.shards = info.shards;
      c.tier = tier;
      c.node = o_.node;
      c.path = path;
      c.bytes = info.bytes;
      c.xxh3 = info.xxh3;
      Status st = (*f)->Verify();
      if (!st.ok()) c.refused = st.message();
      copies.push_back(std::move(c));
    }
  }
  return copies;
}

MemoryUsage TierStore::Usage() const {
  MemoryUsage u;
  for (const std::string& p : SnapshotPaths(JoinPath(o_.shm_dir, "t0"))) u.t0_bytes += FileSize(p);
  for (const std::string& p : SnapshotPaths(JoinPath(o_.shm_dir, "t1"))) u.t1_bytes += FileSize(p);
  return u;
}

void TierStore::FailPersistence(InjectedError error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (config_.durable_dir.empty()) return;
  (void)Env::Default()->CreateDirs(config_.durable_dir);
  faulty_ = std::make_unique<FaultInjectionEnv>(Env::Default(), config_.durable_dir,
                                                /*real_syncs=*/true);
  faulty_->FailWritesUnder(config_.durable_dir, error);
}

void TierStore::Corrupt(Tier tier, int shard) {
  const std::string dir = JoinPath(o_.shm_dir, tier == Tier::kT0 ? "t0" : "t1");
  for (const std::string& path : SnapshotPaths(dir)) {
    Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(path);
    if (f.ok() && Holds((*f)->info()) && (*f)->info().shard == shard) (*f)->InjectCorruption();
  }
}

}  // namespace endure::agent
