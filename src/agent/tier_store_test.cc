// TierStore's checks on what workers and peers send it, and the sweep of
// checkpoint memory that dead agents left behind.
#include "agent/tier_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <tuple>

#include "common/hash.h"
#include "common/mutex.h"

namespace endure::agent {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr char kToken[] = "job-token";

// A pid that no process has: a child that has exited and been reaped.
pid_t DeadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

class TierStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_tier_store_test.XXXXXX";
    root_ = mkdtemp(tmpl);
    fs::create_directories(root_ / "shm");
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(root_);
  }

  void StartStore(const std::string& node = "node0") {
    TierStoreOptions o;
    o.node = node;
    o.shm_dir = (root_ / "shm" / ("endure-1-" + node)).string();
    o.token = kToken;
    auto s = TierStore::Start(o, [this](const PersistReport& r) {
      MutexLock lock(&mu_);
      reports_.push_back(r);
    });
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }

  std::string Peer() const { return "127.0.0.1:" + std::to_string(store_->replica_port()); }

  // Every regular file under root_, relative to it.
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(root_)) {
      if (e.is_regular_file()) out.push_back(fs::relative(e.path(), root_).string());
    }
    return out;
  }

  fs::path root_;
  Mutex mu_;
  std::vector<PersistReport> reports_ GUARDED_BY(mu_);
  std::unique_ptr<TierStore> store_;
};

TEST_F(TierStoreTest, AReplicaWhoseNodeNameLeavesTheDirectoryWritesNothing) {
  StartStore();
  const std::string payload = "attacker-chosen contents";
  for (const char* node : {"../../../escaped", "..", "a/../../b", "/tmp/abs"}) {
    checkpoint::ReplicaHeader h{node, 0, 1, 7, payload.size(), Xxh3(payload)};
    const Status st = checkpoint::SendReplica(Peer(), kToken, h, payload, 10s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << node << ": " << st.ToString();
    EXPECT_NE(st.message().find("is not a valid node name"), std::string::npos) << st.message();
  }
  // Nothing anywhere under the test's directory, T1 included.
  EXPECT_TRUE(Files().empty()) << ::testing::PrintToString(Files());
  EXPECT_FALSE(fs::exists(root_ / "escaped"));
  EXPECT_FALSE(fs::exists("/tmp/abs-shard-0.slot-0"));
  // A valid one lands in T1.
  checkpoint::ReplicaHeader h{"node1", 0, 1, 7, payload.size(), Xxh3(payload)};
  ASSERT_TRUE(checkpoint::SendReplica(Peer(), kToken, h, payload, 10s).ok());
  EXPECT_EQ(Files(), std::vector<std::string>{"shm/endure-1-node0/t1/node1-shard-0.slot-0"});
}

TEST_F(TierStoreTest, AReplicaLargerThanTheMemoryBudgetIsRefusedBeforeItsBytes) {
  StartStore();
  TierConfig config;
  config.memory_budget = 1 << 20;
  store_->Configure(config, -1);
  const std::string payload(2 << 20, 'x');
  checkpoint::ReplicaHeader h{"node1", 0, 1, 7, payload.size(), Xxh3(payload)};
  const Status st = checkpoint::SendReplica(Peer(), kToken, h, payload, 10s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("exceeds this agent's limit of 1048576"), std::string::npos)
      << st.message();
  EXPECT_TRUE(Files().empty());
}

TEST_F(TierStoreTest, AFloodOfSnapshotNoticesKeepsAtMostTwoPerRank) {
  // Workers announce snapshots faster than they can be replicated: only the
  // newest notice of each rank waits, and the newest due in T2, whatever the
  // flood.
  StartStore();
  size_t most = 0;
  for (int i = 0; i < 100000; ++i) {
    const int rank = i % 3;
    store_->Notify({rank, i, 3, checkpoint::SlotPath(store_->t0_dir(), rank, i % 2), i % 30 < 3});
    most = std::max(most, store_->pending_notices());
  }
  EXPECT_LE(most, 6u);
  store_->Drain();
  EXPECT_EQ(store_->pending_notices(), 0u);
}

TEST(ReplicaLimit, IsTheBudgetOrASaneMaximum) {
  TierConfig config;
  EXPECT_LE(ReplicaLimit(config), kMaxReplicaBytes);
  EXPECT_GT(ReplicaLimit(config), uint64_t{1} << 20);
  config.memory_budget = 12345;
  EXPECT_EQ(ReplicaLimit(config), 12345u);
}

TEST_F(TierStoreTest, AWorkerCannotPassItsSnapshotOffAsAnotherShard) {
  StartStore();
  TierConfig config;
  config.durable_dir = (root_ / "durable").string();
  store_->Configure(config, -1);
  // Rank 0's slot, whose header (written by the worker) claims shard 1.
  const std::string path = checkpoint::SlotPath(store_->t0_dir(), 0, 0);
  checkpoint::SnapshotInfo info;
  info.step = 4;
  info.shard = 1;
  info.shards = 2;
  const std::string payload = "not rank 1's state";
  info.xxh3 = Xxh3(payload);
  ASSERT_TRUE(checkpoint::WriteSnapshotFile(path, info, payload).ok());
  store_->Notify({0, 4, 2, path});
  store_->Drain();
  store_->PersistNewest(0);
  MutexLock lock(&mu_);
  EXPECT_TRUE(reports_.empty());
  EXPECT_FALSE(fs::exists(root_ / "durable"));
}

TEST_F(TierStoreTest, TheNewestStepEveryRankHoldsIsPersistedOnShutdown) {
  StartStore();
  TierConfig config;
  config.durable_dir = (root_ / "durable").string();
  store_->Configure(config, -1);
  // Rank 0 holds steps 5 and 6, rank 1 steps 4 and 5: step 5 is complete.
  for (auto [rank, slot, step] : {std::tuple{0, 0, 5}, {0, 1, 6}, {1, 0, 4}, {1, 1, 5}}) {
    checkpoint::SnapshotInfo info;
    info.step = step;
    info.shard = rank;
    info.shards = 2;
    const std::string payload = "rank " + std::to_string(rank) + " step " + std::to_string(step);
    info.xxh3 = Xxh3(payload);
    ASSERT_TRUE(checkpoint::WriteSnapshotFile(checkpoint::SlotPath(store_->t0_dir(), rank, slot),
                                              info, payload)
                    .ok());
  }
  EXPECT_EQ(store_->PersistNewestComplete({0, 1}, std::chrono::steady_clock::now() + 5s), 5);
  {
    MutexLock lock(&mu_);
    ASSERT_EQ(reports_.size(), 2u);
    for (const PersistReport& r : reports_) {
      EXPECT_EQ(r.step, 5);
      EXPECT_TRUE(r.error.empty()) << r.error;
    }
  }
  // Durable already: nothing more to do; a deadline already passed starts nothing.
  EXPECT_EQ(store_->PersistNewestComplete({0, 1}, std::chrono::steady_clock::now() + 5s), -1);
  EXPECT_EQ(store_->PersistNewestComplete({0, 1}, std::chrono::steady_clock::now() - 1s), -1);
  MutexLock lock(&mu_);
  EXPECT_EQ(reports_.size(), 2u);
}

TEST(SweepStaleShm, RemovesOnlyTheDirectoriesOfAgentsThatAreGone) {
  char tmpl[] = "/tmp/endure_sweep_test.XXXXXX";
  const fs::path parent = mkdtemp(tmpl);
  const pid_t dead = DeadPid();
  const pid_t live = ::getppid();  // stands in for a live agent below
  const fs::path stale = parent / ("endure-" + std::to_string(dead) + "-node1");
  const fs::path kept = parent / ("endure-" + std::to_string(live) + "-node2");
  fs::create_directories(stale / "t0");
  std::ofstream(stale / "t0" / "rank-0.slot-0") << "x";
  fs::create_directories(kept / "t0");
  // Not what TierStore names its memory, or not a directory: left alone.
  fs::create_directories(parent / "endure-abc-node3");
  fs::create_directories(parent / ("endure-" + std::to_string(dead) + "-..") / "x");
  fs::create_directories(parent / "other-123-node4");
  std::ofstream(parent / ("endure-" + std::to_string(dead) + "-file"));
  fs::create_directories(parent / "target");
  fs::create_directory_symlink(parent / "target",
                               parent / ("endure-" + std::to_string(dead) + "-link"));

  const std::vector<std::string> removed =
      SweepStaleShm(parent.string(), [&](pid_t pid) { return pid == live; });
  EXPECT_EQ(removed, std::vector<std::string>{stale.string()});
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_TRUE(fs::exists(parent / "endure-abc-node3"));
  EXPECT_TRUE(fs::exists(parent / "other-123-node4"));
  EXPECT_TRUE(fs::exists(parent / ("endure-" + std::to_string(dead) + "-file")));
  EXPECT_TRUE(fs::exists(parent / "target"));
  fs::remove_all(parent);
}

TEST(IsLiveEndureAgent, KnowsADeadPidAndAProcessThatIsNoAgent) {
  EXPECT_FALSE(IsLiveEndureAgent(DeadPid()));
  EXPECT_FALSE(IsLiveEndureAgent(::getpid()));  // a test binary
  EXPECT_FALSE(IsLiveEndureAgent(0));
}

// Configure with a rollback takes mu_ and t1_mu_ one after the other, never
// one inside the other: a replica arriving (OpenReplica) takes t1_mu_ and
// then mu_, and with mu_ held around t1_mu_ the two deadlocked (ecb4ae3).
// Many T0 slots widen the window in which Configure scans them while
// replicas keep arriving. Deadlocked threads cannot be joined: on a timeout
// the store and the threads are left behind (all they touch is leaked or
// shared), so that the test fails instead of hanging.
TEST_F(TierStoreTest, ARollbackDoesNotDeadlockWithArrivingReplicas) {
  StartStore();
  constexpr int kSlots = 200;
  for (int rank = 0; rank < kSlots; ++rank) {
    const std::string payload = "shard " + std::to_string(rank);
    checkpoint::SnapshotInfo info;
    info.step = 1;
    info.shard = rank;
    info.shards = kSlots;
    info.xxh3 = Xxh3(payload);
    ASSERT_TRUE(checkpoint::WriteSnapshotFile(checkpoint::SlotPath(store_->t0_dir(), rank, 0), info,
                                              payload)
                    .ok());
  }
  struct Shared {
    std::atomic<bool> stop{false};
    std::atomic<int> replicas{0};
    Mutex mu;
    CondVar cv;
    bool configured GUARDED_BY(mu) = false;
  };
  auto shared = std::make_shared<Shared>();
  std::thread replicas([shared, peer = Peer()] {
    const std::string payload(1024, 'r');
    int64_t step = 0;
    while (!shared->stop) {
      checkpoint::ReplicaHeader h{"node1", 0, 1, ++step % 50, payload.size(), Xxh3(payload)};
      if (checkpoint::SendReplica(peer, kToken, h, payload, 2s).ok()) ++shared->replicas;
    }
  });
  TierStore* store = store_.get();
  std::thread configure([shared, store] {
    TierConfig config;
    for (int i = 0; i < 100; ++i) {
      // Wait for the replicas to flow before the first round.
      while (i == 0 && shared->replicas == 0 && !shared->stop) std::this_thread::yield();
      store->Configure(config, /*discard_after=*/100);
    }
    MutexLock lock(&shared->mu);
    shared->configured = true;
    shared->cv.NotifyAll();
  });
  bool configured = false;
  {
    MutexLock lock(&shared->mu);
    configured =
        shared->cv.WaitFor(lock, 30s, [&]() REQUIRES(shared->mu) { return shared->configured; });
  }
  shared->stop = true;
  if (!configured) {
    ADD_FAILURE() << "Configure and OpenReplica deadlocked (" << shared->replicas
                  << " replicas kept before)";
    (void)store_.release();  // its threads are stuck on its mutexes
    configure.detach();
    replicas.detach();
    return;
  }
  configure.join();
  replicas.join();
  EXPECT_GT(shared->replicas, 0);
  // The replicas that arrived are there, under the rollback point.
  bool replica_kept = false;
  for (const checkpoint::ShardCopy& c : store_->Inventory()) {
    if (c.tier == checkpoint::Tier::kT1) replica_kept = true;
  }
  EXPECT_TRUE(replica_kept);
}

}  // namespace
}  // namespace endure::agent
