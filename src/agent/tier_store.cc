// The node's checkpoint tiers: T0 slots, T1 replicas, persistence to T2.
#include "agent/tier_store.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "checkpoint/snapshot_file.h"
#include "common/env.h"
#include "common/hash.h"
#include "common/names.h"
#include "core/snapshot_queue.h"

namespace endure::agent {
namespace {

using checkpoint::ShardCopy;
using checkpoint::SlotState;
using checkpoint::SnapshotFile;
using checkpoint::Tier;

// The most T1 files a node keeps (two slots per peer shard).
constexpr size_t kMaxT1Files = 8192;
constexpr Duration kReplicaTimeout = std::chrono::seconds(30);

bool Holds(const checkpoint::SnapshotInfo& info) {
  return info.state == SlotState::kReady || info.state == SlotState::kPinned;
}

// File operations on checkpoint memory that nothing waits for (removals,
// mostly): a failure leaves bytes behind, which the operator hears of; the
// store goes on.
void WarnOnError(const std::string& node, const Status& st) {
  if (!st.ok()) {
    std::fprintf(stderr, "endure agent %s: %s\n", node.c_str(), st.message().c_str());
  }
}

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Checkpoint work runs at the lowest priority a thread can take without
// being starved: nice 19 (a weight of 15 against training's 1024). On a node
// with spare cores, a GPU node's, that changes nothing; on one whose cores
// are kept busy, the replica work gets about 1.5% of a core and waits for
// the gaps training leaves (an allreduce's wait, a step's end), and a
// sleeping thread of it is back on a core within about 50 ms. Not
// SCHED_IDLE: measured on Linux 6.18 with a core kept busy, a SCHED_IDLE
// thread got 0.3% of it and waited up to 0.42 s after each wake-up, so a
// replica's exchange (a TLS handshake, a stream of chunks, an
// acknowledgement: a wake-up at each) outlived its deadlines and no replica
// arrived at all, and an agent's shutdown waited for its store. Where the
// store falls behind, the worker never waits for it (three T0 slots): a
// replica is older, and a restore after a node loss may take an older step.
// Unprivileged, a thread cannot lower its nice value again: it is set once,
// on the store's own threads.
void RunAtLowestPriority() {
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19) != 0) {
    std::fprintf(stderr, "endure agent: could not lower the checkpoint thread's priority: %s\n",
                 std::strerror(errno));
  }
}

// The name TierStore gives its shared memory: "endure-PID-NODE".
bool ParseShmName(const std::string& name, pid_t* pid) {
  constexpr std::string_view kPrefix = "endure-";
  if (name.rfind(kPrefix, 0) != 0) return false;
  const char* begin = name.data() + kPrefix.size();
  const char* end = name.data() + name.size();
  long long value = 0;
  const auto [p, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || p == begin || p == end || *p != '-' || value <= 1 ||
      value > std::numeric_limits<pid_t>::max()) {
    return false;
  }
  *pid = static_cast<pid_t>(value);
  return IsValidNodeName(std::string_view(p + 1, static_cast<size_t>(end - p - 1)));
}

}  // namespace

uint64_t ReplicaLimit(const TierConfig& config) {
  uint64_t limit = kMaxReplicaBytes;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    limit = std::min(limit, static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2);
  }
  if (config.memory_budget > 0) limit = std::min(limit, config.memory_budget);
  return std::max<uint64_t>(limit, 1);
}

bool IsLiveEndureAgent(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  if (!f) return true;  // it exists and cannot be read: it may be one
  std::string cmdline((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (cmdline.empty()) return false;  // a zombie, or exiting
  std::vector<std::string> argv;
  size_t pos = 0;
  while (pos < cmdline.size() && argv.size() < 2) {
    size_t end = cmdline.find('\0', pos);
    if (end == std::string::npos) end = cmdline.size();
    argv.push_back(cmdline.substr(pos, end - pos));
    pos = end + 1;
  }
  return argv.size() == 2 && argv[1] == "agent" &&
         std::filesystem::path(argv[0]).filename().string().rfind("endure", 0) == 0;
}

std::vector<std::string> SweepStaleShm(const std::string& parent,
                                       const std::function<bool(pid_t)>& is_live_agent) {
  std::vector<std::string> removed;
  Result<std::vector<std::string>> names = Env::Default()->ListDir(parent);
  if (!names.ok()) return removed;
  for (const std::string& name : *names) {
    pid_t pid = 0;
    if (!ParseShmName(name, &pid) || pid == ::getpid()) continue;
    const std::string path = JoinPath(parent, name);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;
    }
    if (is_live_agent(pid)) continue;
    if (Env::Default()->RemoveAll(path).ok()) removed.push_back(path);
  }
  return removed;
}

Result<std::unique_ptr<TierStore>> TierStore::Start(TierStoreOptions options,
                                                    OnPersist on_persist) {
  ENDURE_RETURN_IF_ERROR(CheckNodeName(options.node, "the node name"));
  std::unique_ptr<TierStore> s(new TierStore());
  s->o_ = std::move(options);
  s->on_persist_ = std::move(on_persist);
  s->cancel_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->cancel_fd_ < 0) return IOError(std::string("eventfd: ") + std::strerror(errno));
  Env* env = Env::Default();
  // Snapshots of an earlier agent on this node belong to no generation we know.
  if (env->Exists(s->o_.shm_dir)) ENDURE_RETURN_IF_ERROR(env->RemoveAll(s->o_.shm_dir));
  ENDURE_RETURN_IF_ERROR(env->CreateDirs(JoinPath(s->o_.shm_dir, "t0")));
  ENDURE_RETURN_IF_ERROR(env->CreateDirs(JoinPath(s->o_.shm_dir, "t1")));
  TierStore* self = s.get();
  ENDURE_ASSIGN_OR_RETURN(
      s->server_,
      checkpoint::ReplicaServer::Start(
          s->o_.host, 0, s->o_.token, ReplicaLimit(TierConfig{}),
          [self](const checkpoint::ReplicaHeader& h) { return self->OpenReplica(h); }, s->o_.tls));
  s->replicator_ = std::thread(&TierStore::ReplicateLoop, self);
  return s;
}

TierStore::~TierStore() {
  CancelReplication();  // a send in flight ends now, so the join below is prompt
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (replicator_.joinable()) replicator_.join();
  server_.reset();
  if (cancel_fd_ >= 0) ::close(cancel_fd_);
  WarnOnError(o_.node, Env::Default()->RemoveAll(o_.shm_dir));
}

void TierStore::CancelReplication() {
  {
    MutexLock lock(&mu_);
    replication_cancelled_ = true;
  }
  // The eventfd stays readable from now on: every wait in SendReplica ends.
  const uint64_t one = 1;
  if (cancel_fd_ >= 0) {
    while (::write(cancel_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
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
  // Frames that claim more than the budget are refused before their bytes come.
  if (server_) server_->set_max_bytes(ReplicaLimit(config));
  {
    MutexLock lock(&mu_);
    config_ = config;
    if (discard_after < 0) return;
    std::erase_if(persisted_, [&](const auto& p) { return p.second > discard_after; });
  }
  for (const std::string& path : SnapshotPaths(t0_dir())) {
    Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(path);
    if (f.ok() && (*f)->info().step > discard_after) (*f)->Invalidate();
  }
  // Not under mu_: OpenReplica takes t1_mu_, then mu_.
  MutexLock t1(&t1_mu_);
  for (const std::string& path : SnapshotPaths(JoinPath(o_.shm_dir, "t1"))) {
    Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(path);
    if (!f.ok() || (*f)->info().step > discard_after)
      WarnOnError(o_.node, Env::Default()->RemoveFile(path));
  }
}

TierConfig TierStore::config() const {
  MutexLock lock(&mu_);
  return config_;
}

void TierStore::Notify(SnapshotNotice notice) {
  {
    MutexLock lock(&mu_);
    core::QueueSnapshot(queue_, std::move(notice));
  }
  cv_.NotifyAll();
}

size_t TierStore::pending_notices() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

void TierStore::Drain() {
  MutexLock lock(&mu_);
  cv_.Wait(lock, [&]() REQUIRES(mu_) { return (queue_.empty() && !busy_) || stop_; });
}

bool TierStore::DrainUntil(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  return cv_.WaitUntil(lock, deadline,
                       [&]() REQUIRES(mu_) { return (queue_.empty() && !busy_) || stop_; });
}

void TierStore::ReplicateLoop() {
  RunAtLowestPriority();
  MutexLock lock(&mu_);
  while (true) {
    cv_.Wait(lock, [&]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
    if (stop_) return;
    SnapshotNotice n = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.Unlock();
    Replicate(n);
    lock.Lock();
    busy_ = false;
    cv_.NotifyAll();
  }
}

void TierStore::Replicate(const SnapshotNotice& n) {
  // Read in place, pinned for as long as it takes: the worker writes its
  // next snapshots into its other slots meanwhile (kT0Slots).
  Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(n.path);
  if (!f.ok() || !(*f)->Pin(n.step)) return;  // already overwritten by a newer one
  const checkpoint::SnapshotInfo info = (*f)->info();
  // The worker wrote the header: it may only speak for its own shard, which
  // is what gets replicated and persisted under that number.
  if (info.shard != n.rank || info.shards < 1 || info.shard >= info.shards) {
    (*f)->Unpin();
    std::fprintf(stderr,
                 "endure agent %s: ignored the snapshot of step %lld in %s: its header says "
                 "shard %d of %d, the slot is rank %d's\n",
                 o_.node.c_str(), static_cast<long long>(n.step), n.path.c_str(), info.shard,
                 info.shards, n.rank);
    return;
  }
  Result<std::string_view> payload = (*f)->payload();
  if (payload.ok()) Send(info, *payload, n.durable);
  (*f)->Unpin();
}

void TierStore::Send(const checkpoint::SnapshotInfo& info, std::string_view payload, bool durable) {
  // The worker's checksum travels with the bytes: the peer checks it as they
  // arrive, and Persist before reporting a shard durable.
  TierConfig config;
  bool cancelled = false;
  {
    MutexLock lock(&mu_);
    config = config_;
    cancelled = replication_cancelled_;
  }
  if (!config.replica_peer.empty() && !cancelled) {
    checkpoint::ReplicaHeader h{o_.node, info.shard, info.shards, info.step, info.bytes, info.xxh3};
    Status st = checkpoint::SendReplica(config.replica_peer, o_.token, h, payload, kReplicaTimeout,
                                        cancel_fd_, o_.tls);
    if (!st.ok()) {
      std::fprintf(stderr, "endure agent %s: replica of step %lld shard %d to %s failed: %s\n",
                   o_.node.c_str(), static_cast<long long>(info.step), info.shard,
                   config.replica_peer.c_str(), st.message().c_str());
    }
  }
  if (durable && !config.durable_dir.empty()) {
    Persist(info.shard, info.shards, info.step, payload, info.xxh3);
  }
}

void TierStore::Persist(int shard, int shards, int64_t step, std::string_view payload,
                        uint64_t xxh3) {
  std::string root;
  Env* env = Env::Default();
  {
    MutexLock lock(&mu_);
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
    MutexLock lock(&mu_);
    persisted_[shard] = std::max(persisted_[shard], step);
  }
  on_persist_(report);
}

void TierStore::PersistNewest(int rank) {
  Drain();
  std::unique_ptr<SnapshotFile> newest;
  for (int slot = 0; slot < checkpoint::kT0Slots; ++slot) {
    Result<std::unique_ptr<SnapshotFile>> f =
        SnapshotFile::Open(checkpoint::SlotPath(t0_dir(), rank, slot));
    if (!f.ok() || !Holds((*f)->info()) || (*f)->info().shard != rank) continue;
    if (!newest || (*f)->info().step > newest->info().step) newest = std::move(f).value();
  }
  if (newest) PersistSlot(*newest);
}

bool TierStore::PersistSlot(SnapshotFile& file) {
  const checkpoint::SnapshotInfo info = file.info();
  {
    MutexLock lock(&mu_);
    if (config_.durable_dir.empty()) return false;
    auto it = persisted_.find(info.shard);
    if (it != persisted_.end() && it->second >= info.step) return false;
  }
  if (!file.Pin(info.step)) return false;
  Result<std::string_view> payload = file.payload();
  if (payload.ok()) Persist(info.shard, info.shards, info.step, *payload, info.xxh3);
  file.Unpin();
  return payload.ok();
}

int64_t TierStore::PersistNewestComplete(const std::set<int>& ranks,
                                         std::chrono::steady_clock::time_point deadline) {
  if (ranks.empty() || std::chrono::steady_clock::now() >= deadline || !DrainUntil(deadline)) {
    return -1;
  }
  // Each rank's snapshots by step; the newest step all of them hold.
  std::map<int, std::map<int64_t, std::unique_ptr<SnapshotFile>>> held;
  for (int rank : ranks) {
    for (int slot = 0; slot < checkpoint::kT0Slots; ++slot) {
      Result<std::unique_ptr<SnapshotFile>> f =
          SnapshotFile::Open(checkpoint::SlotPath(t0_dir(), rank, slot));
      if (!f.ok() || !Holds((*f)->info()) || (*f)->info().shard != rank) continue;
      const int64_t step = (*f)->info().step;
      held[rank][step] = std::move(f).value();
    }
  }
  int64_t newest = -1;
  for (const auto& [step, file] : held[*ranks.begin()]) {
    const bool everywhere = std::all_of(
        ranks.begin(), ranks.end(), [&, step = step](int r) { return held[r].count(step) > 0; });
    if (everywhere) newest = std::max(newest, step);
  }
  if (newest < 0) return -1;
  bool wrote = false;
  for (int rank : ranks) {
    if (std::chrono::steady_clock::now() >= deadline) break;
    wrote |= PersistSlot(*held[rank][newest]);
  }
  return wrote ? newest : -1;
}

namespace {

// A peer's replica, written into its T1 slot as the bytes arrive.
class T1Target : public checkpoint::ReplicaTarget {
 public:
  explicit T1Target(std::unique_ptr<checkpoint::SnapshotFileWriter> file)
      : file_(std::move(file)) {}
  Status Write(std::string_view chunk) override { return file_->Append(chunk); }
  Status Commit() override { return file_->Finish(); }

 private:
  std::unique_ptr<checkpoint::SnapshotFileWriter> file_;
};

}  // namespace

Result<std::unique_ptr<checkpoint::ReplicaTarget>> TierStore::OpenReplica(
    const checkpoint::ReplicaHeader& h) {
  RunAtLowestPriority();  // the replica server's thread (a syscall, once a replica)
  // Every refusal below reaches the sending agent, which logs it.
  const auto refuse = [&](Status st) {
    std::fprintf(stderr, "endure agent %s: refused a replica: %s\n", o_.node.c_str(),
                 st.message().c_str());
    return st;
  };
  // The frame decoder checked these already; the file name is built here, so
  // they are checked again where it is.
  if (Status st = CheckNodeName(h.node, "a replica's node"); !st.ok()) return refuse(st);
  if (h.shards < 1 || h.shard < 0 || h.shard >= h.shards || h.step < 0) {
    return refuse(InvalidArgument("replica of shard " + std::to_string(h.shard) + " of " +
                                  std::to_string(h.shards) + ", step " + std::to_string(h.step)));
  }
  // Held while the slot is chosen and opened, not while the bytes arrive: a
  // rollback (Configure) does not wait for a transfer; a slot it removes
  // meanwhile takes the rest of the replica with it.
  MutexLock t1(&t1_mu_);
  uint64_t budget = 0;
  {
    MutexLock lock(&mu_);
    budget = config_.memory_budget;
  }
  // Two slots per peer shard: the new replica replaces the older.
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
  const std::string what = "replica of step " + std::to_string(h.step) + " shard " +
                           std::to_string(h.shard) + " from " + h.node;
  // Without a budget, the number of files still bounds what peers can make
  // this node keep: two per peer shard, for at most kMaxT1Files / 2 shards.
  if (!Env::Default()->Exists(slots[0]) && !Env::Default()->Exists(slots[1]) &&
      SnapshotPaths(dir).size() + 2 > kMaxT1Files) {
    return refuse(Unavailable(what + " dropped: this node keeps replicas of at most " +
                              std::to_string(kMaxT1Files / 2) + " peer shards"));
  }
  if (budget > 0) {
    // The target's own bytes are reused; the other copy goes first if need be.
    const MemoryUsage used = Usage();
    uint64_t held = used.t0_bytes + used.t1_bytes - FileSize(slots[target]);
    const uint64_t need = h.bytes + 64;
    if (held + need > budget) {
      WarnOnError(o_.node, Env::Default()->RemoveFile(slots[1 - target]));
      const MemoryUsage now = Usage();
      held = now.t0_bytes + now.t1_bytes - FileSize(slots[target]);
    }
    if (held + need > budget) {
      WarnOnError(o_.node, Env::Default()->RemoveFile(slots[target]));
      return refuse(Unavailable(what + " dropped: " + std::to_string(need) +
                                " bytes would exceed the memory budget of " +
                                std::to_string(budget)));
    }
  }
  checkpoint::SnapshotInfo info;
  info.step = h.step;
  info.shard = h.shard;
  info.shards = h.shards;
  info.bytes = h.bytes;
  info.xxh3 = h.xxh3;
  Result<std::unique_ptr<checkpoint::SnapshotFileWriter>> file =
      checkpoint::SnapshotFileWriter::Begin(slots[target], info);
  if (!file.ok()) return refuse(IOError("cannot keep a " + what + ": " + file.status().message()));
  return std::unique_ptr<checkpoint::ReplicaTarget>(new T1Target(std::move(file).value()));
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
  MutexLock lock(&mu_);
  if (config_.durable_dir.empty()) return;
  // The injected fault applies under the directory whether or not it exists
  // yet; the persist that follows reports any real error.
  WarnOnError(o_.node, Env::Default()->CreateDirs(config_.durable_dir));
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
