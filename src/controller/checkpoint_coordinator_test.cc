#include "controller/checkpoint_coordinator.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <variant>

#include "checkpoint/tensor_blob.h"
#include "core/job_machine.h"

namespace endure::controller {
namespace {

using checkpoint::ShardCopy;
using checkpoint::ShardEntry;
using checkpoint::Tier;

// Writes every shard of `step` into `root` as the agents would and reports
// them to `c`, the way the controller does when their "persisted" arrive.
void PersistWith(CheckpointCoordinator& c, const std::string& root, int64_t step, int shards = 2,
                 size_t payload = 0) {
  checkpoint::CheckpointDir dir(Env::Default(), root);
  for (int s = 0; s < shards; ++s) {
    const std::string meta = "{\"step\":" + std::to_string(step) + "}";
    checkpoint::TensorBlob blob{"w",
                                "uint8",
                                {static_cast<int64_t>(payload)},
                                std::string(payload, static_cast<char>('a' + s))};
    std::vector<checkpoint::TensorView> v = checkpoint::ShardViews(
        meta, payload > 0 ? std::vector<checkpoint::TensorView>{checkpoint::ViewOf(blob)}
                          : std::vector<checkpoint::TensorView>{});
    std::string bytes(checkpoint::EncodedSize(v), '\0');
    checkpoint::EncodeTensorsInto(v, bytes.data());
    Result<ShardEntry> e = dir.WriteShard(step, s, bytes);
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE(c.OnPersisted(step, s, shards, *e).ok());
  }
}

class CheckpointCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure-coordinator-XXXXXX";
    root_ = mkdtemp(tmpl);
    CoordinatorOptions o;
    o.dir = root_;
    o.keep = 2;
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
  checkpoint::RestorePlan plan = coordinator_->Plan({"node0", "node2"}, -1, -1);
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
  plan = coordinator_->Plan({"node2", "node3"}, -1, -1);
  EXPECT_EQ(plan.Summary(), "step 10 from T2 x2");
  ASSERT_FALSE(plan.notes.empty());
  EXPECT_NE(plan.notes[0].find("refused step 20 shard 1 in T2"), std::string::npos)
      << plan.notes[0];
  EXPECT_NE(plan.notes[0].find("checksum mismatch"), std::string::npos) << plan.notes[0];
}

TEST_F(CheckpointCoordinatorTest, RollbackDropsLaterDurableStepsAndBudgetSplitsSlots) {
  for (int64_t s : {10, 20}) Persist(s);
  // An anomaly at step 16: step 20 holds its update.
  checkpoint::RestorePlan plan = coordinator_->Plan({"node0", "node1"}, 15, 16);
  EXPECT_EQ(plan.step, 10);
  EXPECT_EQ(checkpoint::CheckpointDir(Env::Default(), root_).ListSteps(),
            (std::vector<int64_t>{10}));
  EXPECT_EQ(coordinator_->Plan({"node0", "node1"}, 0, -1).Summary(), "fresh start");
  // 1000 bytes per node: three T0 slots and two T1 replicas per rank.
  EXPECT_EQ(coordinator_->SlotBytes(), 200u);
  coordinator_->OnMemory(600, 200);
  EXPECT_EQ(coordinator_->ReportJson()["peak_t0_bytes"], 600);
}

// The controller's shell in miniature, with scripted time: the job machine
// decides, the coordinator plans from what the tiers hold. An earlier run in
// the same state directory committed steps up to 20 (and a step 40 whose
// shard rotted); this run resumes from 20 and its loss turns NaN at step 25,
// before its own first checkpoint. The machine knew only the checkpoints this
// run reported, so it asked for a fresh start and the coordinator deleted
// every durable step (RemoveAfter(0)).
TEST(CheckpointRollback, AResumedJobRollsBackToTheEarlierRunsCheckpointAndKeepsIt) {
  char tmpl[] = "/tmp/endure-rollback-XXXXXX";
  const std::string root = mkdtemp(tmpl);
  CoordinatorOptions o;
  o.dir = root;
  o.keep = 3;
  {
    CheckpointCoordinator earlier(Env::Default(), o);
    for (int64_t step : {10, 15, 20, 40}) PersistWith(earlier, root, step);
  }
  checkpoint::CheckpointDir dir(Env::Default(), root);
  {
    std::fstream f(dir.ShardPath(40, 0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.put('\x7f');
  }
  ASSERT_EQ(dir.ListSteps(), (std::vector<int64_t>{15, 20, 40}));  // keep = 3

  CheckpointCoordinator coordinator(Env::Default(), o);
  EXPECT_EQ(coordinator.found_steps(), (std::vector<int64_t>{15, 20, 40}));
  core::JobMachineOptions mo;
  mo.nodes = 2;
  mo.recovery.backoff_initial = Duration(0);
  core::JobMachine machine(mo, {}, core::At(Duration(0)));
  double now = 0;
  auto step = [&](const core::JobEvent& e) {
    return machine.Step(
        e, core::At(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(now))));
  };
  auto start_of = [](const std::vector<core::JobAction>& actions) {
    for (const core::JobAction& a : actions) {
      if (const auto* s = std::get_if<core::StartGenerationAction>(&a)) return *s;
    }
    ADD_FAILURE() << "no StartGeneration";
    return core::StartGenerationAction{};
  };
  auto run = [&](int64_t from, int64_t to, double loss_at_to) {
    for (int64_t s = from; s <= to; ++s) {
      now += 0.1;
      const double loss = s == to ? loss_at_to : 2.0;
      for (int r = 0; r < 2; ++r) step(core::StepEnd{machine.generation(), r, s, loss, 0, -1});
    }
  };
  auto stop_both = [&] {
    now += 0.1;
    step(core::GenerationStoppedEvent{machine.generation(), core::NodeId{0}});
    return step(core::GenerationStoppedEvent{machine.generation(), core::NodeId{1}});
  };

  core::CheckpointsFound found;
  for (int64_t s : coordinator.found_steps()) found.steps.push_back(core::StepNumber{s});
  step(found);
  step(core::NodeUp{core::NodeId{0}, "node0", 1});
  core::StartGenerationAction start = start_of(step(core::NodeUp{core::NodeId{1}, "node1", 1}));
  checkpoint::RestorePlan plan =
      coordinator.Plan({"node0", "node1"}, start.restore_step.value, start.abandoned_from.value);
  EXPECT_EQ(plan.Summary(), "step 20 from T2 x2");  // 40 does not verify
  ASSERT_FALSE(plan.notes.empty());
  EXPECT_NE(plan.notes[0].find("refused step 40 shard 0 in T2"), std::string::npos)
      << plan.notes[0];
  for (int r = 0; r < 2; ++r) step(core::WorkerReady{0, r, 20, 0.1});

  run(21, 25, std::nan(""));
  start = start_of(stop_both());
  EXPECT_EQ(start.restore_step.value, 24);
  EXPECT_EQ(start.abandoned_from.value, 25);
  plan = coordinator.Plan({"node0", "node1"}, start.restore_step.value, start.abandoned_from.value);
  EXPECT_EQ(plan.Summary(), "step 20 from T2 x2");
  // Step 40 is at or after the anomaly, but another run wrote it: kept.
  EXPECT_EQ(dir.ListSteps(), (std::vector<int64_t>{15, 20, 40}));
  bool kept_note = false;
  for (const std::string& n : plan.notes) {
    kept_note |= n.find("kept durable step 40: committed by another run") != std::string::npos;
  }
  EXPECT_TRUE(kept_note) << testing::PrintToString(plan.notes);
  ASSERT_EQ(machine.incidents().size(), 1u);
  EXPECT_NE(machine.incidents()[0].reason.find("rolling back to the checkpoint of step 20"),
            std::string::npos)
      << machine.incidents()[0].reason;

  // The new timeline commits 25, 30 and 32 (persisted while step 33 ran); a
  // NaN at step 33 restores 32, the newest before it.
  for (int r = 0; r < 2; ++r) step(core::WorkerReady{machine.generation(), r, 20, 0.1});
  run(21, 30, 2.0);
  PersistWith(coordinator, root, 25);
  PersistWith(coordinator, root, 30);
  EXPECT_EQ(dir.ListSteps(), (std::vector<int64_t>{25, 30, 40}));  // keep = 3, trusted 30
  PersistWith(coordinator, root, 32);                              // persisted while step 33 ran
  run(31, 33, std::nan(""));
  start = start_of(stop_both());
  EXPECT_EQ(start.restore_step.value, 32);
  EXPECT_EQ(start.abandoned_from.value, 33);
  plan = coordinator.Plan({"node0", "node1"}, start.restore_step.value, start.abandoned_from.value);
  EXPECT_EQ(plan.Summary(), "step 32 from T2 x2");
  EXPECT_EQ(dir.ListSteps(), (std::vector<int64_t>{30, 32, 40}));

  // A checkpoint of the anomalous step itself holds its update: removed
  // (retention had already let 34 and 35 replace 32).
  for (int r = 0; r < 2; ++r) step(core::WorkerReady{machine.generation(), r, 32, 0.1});
  run(33, 34, 2.0);
  PersistWith(coordinator, root, 34);
  run(35, 35, std::nan(""));  // a NaN at 35 after 34 was saved; 35's own save too
  PersistWith(coordinator, root, 35);
  start = start_of(stop_both());
  plan = coordinator.Plan({"node0", "node1"}, start.restore_step.value, start.abandoned_from.value);
  EXPECT_EQ(plan.Summary(), "step 34 from T2 x2");
  EXPECT_EQ(dir.ListSteps(), (std::vector<int64_t>{34, 40}));
  std::filesystem::remove_all(root);
}

// An Env that counts reads of shard files: retention must not re-read and
// hash what the coordinator just committed (it runs on the event loop).
class CountingEnv final : public EnvWrapper {
 public:
  CountingEnv() : EnvWrapper(Env::Default()) {}
  Result<std::string> ReadFile(const std::string& p) override {
    if (p.find("shard-") != std::string::npos) ++shard_reads;
    return EnvWrapper::ReadFile(p);
  }
  int shard_reads = 0;
};

TEST_F(CheckpointCoordinatorTest, CommittingReadsNoShardBack) {
  CountingEnv env;
  CoordinatorOptions o;
  o.dir = root_;
  o.keep = 2;
  CheckpointCoordinator c(&env, o);
  for (int64_t step : {10, 20, 30}) PersistWith(c, root_, step, 2, 1 << 20);
  EXPECT_EQ(env.shard_reads, 0);  // was 2 per commit: Retain verified the newest step
  EXPECT_EQ(checkpoint::CheckpointDir(&env, root_).ListSteps(), (std::vector<int64_t>{20, 30}));
  // A plan still verifies what it would load.
  checkpoint::RestorePlan plan = c.Plan({"node0", "node1"}, -1, -1);
  EXPECT_EQ(plan.Summary(), "step 30 from T2 x2");
  EXPECT_EQ(env.shard_reads, 2);
}

}  // namespace
}  // namespace endure::controller
