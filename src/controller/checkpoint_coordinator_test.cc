#include "controller/checkpoint_coordinator.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/tensor_blob.h"

namespace endure::controller {
namespace {

using checkpoint::ShardCopy;
using checkpoint::ShardEntry;
using checkpoint::Tier;

class CheckpointCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure-coordinator-XXXXXX";
    root_ = mkdtemp(tmpl);
    CoordinatorOptions o;
    o.dir = root_;
    o.keep = 2;
    o.world_size = 2;
    o.ranks_per_node = 1;
    o.memory_budget = 1000;
    coordinator_.emplace(Env::Default(), o);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Persists both shards of `step` as the agents would, and reports them.
  void Persist(int64_t step, int shards = 2) {
    checkpoint::CheckpointDir dir(Env::Default(), root_);
    for (int s = 0; s < shards; ++s) {
      const std::string meta = "{\"step\":" + std::to_string(step) + "}";
      std::vector<checkpoint::TensorView> v = checkpoint::ShardViews(meta, {});
      std::string bytes(checkpoint::EncodedSize(v), '\0');
      checkpoint::EncodeTensorsInto(v, bytes.data());
      Result<ShardEntry> e = dir.WriteShard(step, s, bytes);
      ASSERT_TRUE(e.ok());
      ASSERT_TRUE(coordinator_->OnPersisted(step, s, 2, *e).ok());
    }
  }

  ShardCopy Memory(int64_t step, int shard, Tier tier, const std::string& node) {
    ShardCopy c;
    c.step = step;
    c.shard = shard;
    c.shards = 2;
    c.tier = tier;
    c.node = node;
    c.path = "/dev/shm/x";
    return c;
  }

  std::string root_;
  std::optional<CheckpointCoordinator> coordinator_;
};

TEST_F(CheckpointCoordinatorTest, CommitsOnlyCompleteStepsAndKeepsTheNewest) {
  checkpoint::CheckpointDir dir(Env::Default(), root_);
  Persist(5, 1);  // one shard of two: not committed
  EXPECT_FALSE(dir.Verify(5).ok());
  for (int64_t s : {10, 15, 20}) Persist(s);
  EXPECT_TRUE(dir.Verify(20).ok());
  EXPECT_EQ(dir.ListSteps(), (std::vector<int64_t>{15, 20}));  // keep = 2, the partial step gone
  EXPECT_EQ(coordinator_->ReportJson()["durable_commits"], 3);
  EXPECT_EQ(coordinator_->ReportJson()["newest_durable_step"], 20);
}

TEST_F(CheckpointCoordinatorTest, PlansFromMemoryFirstAndVerifiesDurableCopies) {
  Persist(10);
  Persist(20);
  // node1 is gone; node0 holds its own shard 0 and a replica of shard 1.
  coordinator_->OnInventory("node0",
                            {Memory(22, 0, Tier::kT0, "node0"), Memory(22, 1, Tier::kT1, "node0"),
                             Memory(21, 0, Tier::kT0, "node0")},
                            300, 300);
  coordinator_->OnInventory("node1", {Memory(22, 1, Tier::kT0, "node1")}, 300, 300);
  coordinator_->OnNodeGone("node1");
  checkpoint::RestorePlan plan = coordinator_->Plan({"node0", "node2"}, -1, false);
  EXPECT_EQ(plan.Summary(), "step 22 from T0 x1, T1 x1");
  EXPECT_EQ(plan.sources[1].loader_rank, 0);  // node0 reads the replica for rank 1

  // Without memory copies, the durable step is verified before use: a
  // flipped byte in step 20 falls back to step 10, and the notes say why.
  coordinator_->OnNodeGone("node0");
  checkpoint::CheckpointDir dir(Env::Default(), root_);
  {
    std::fstream f(dir.ShardPath(20, 1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.put('\x7f');
  }
  plan = coordinator_->Plan({"node2", "node3"}, -1, false);
  EXPECT_EQ(plan.Summary(), "step 10 from T2 x2");
  ASSERT_FALSE(plan.notes.empty());
  EXPECT_NE(plan.notes[0].find("refused step 20 shard 1 in T2"), std::string::npos)
      << plan.notes[0];
  EXPECT_NE(plan.notes[0].find("checksum mismatch"), std::string::npos) << plan.notes[0];
}

TEST_F(CheckpointCoordinatorTest, RollbackDropsLaterDurableStepsAndBudgetSplitsSlots) {
  for (int64_t s : {10, 20}) Persist(s);
  checkpoint::RestorePlan plan = coordinator_->Plan({"node0", "node1"}, 15, true);
  EXPECT_EQ(plan.step, 10);
  EXPECT_EQ(checkpoint::CheckpointDir(Env::Default(), root_).ListSteps(),
            (std::vector<int64_t>{10}));
  EXPECT_EQ(coordinator_->Plan({"node0", "node1"}, 0, true).Summary(), "fresh start");
  // 1000 bytes per node: two T0 slots and two T1 replicas per rank.
  EXPECT_EQ(coordinator_->SlotBytes(), 250u);
  coordinator_->OnMemory(600, 200);
  EXPECT_EQ(coordinator_->ReportJson()["peak_t0_bytes"], 600);
}

}  // namespace
}  // namespace endure::controller
