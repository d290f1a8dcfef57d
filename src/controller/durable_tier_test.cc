// The checkpoint book's I/O on a real durable directory, driven by the job
// machine the way the controller's shell drives it (DurableTier carries out
// the book's actions; VerifiedPlan and RestoreChosenFor are the shell's own).
#include "controller/durable_tier.h"

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

using checkpoint::ShardEntry;

// A job machine and the durable directory beside it: each input's book
// actions are carried out at once and their results stepped in, as the
// shell does; the other actions are returned.
class MiniController {
 public:
  MiniController(Env* env, const std::string& root, core::JobMachineOptions o)
      : machine_(o, {}, core::At(Duration(0))), tier_(env, root), root_(root) {
    Carry({core::ListDurableAction{}});
  }

  std::vector<core::JobAction> Step(const core::JobEvent& e) {
    return Carry(machine_.Step(
        e, core::At(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(now_)))));
  }
  std::vector<core::JobAction> Carry(const std::vector<core::JobAction>& actions) {
    std::vector<core::JobAction> rest;
    for (const core::JobAction& a : actions) {
      if (std::optional<core::JobEvent> result = tier_.CarryOut(a)) {
        for (core::JobAction& r : Step(*result)) rest.push_back(std::move(r));
      } else {
        rest.push_back(a);
      }
    }
    return rest;
  }

  // Every shard of `step` written into the directory as the agents would,
  // and reported.
  void Persist(int64_t step, int shards = 2, size_t payload = 0) {
    checkpoint::CheckpointDir dir(Env::Default(), root_);
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
      Step(core::ShardPersisted{machine_.generation(), core::NodeId{s}, core::StepNumber{step}, s,
                                shards, e->bytes, e->xxh3, 0, 0});
    }
  }

  // The restore point of `start`, as the shell chooses and records it.
  checkpoint::RestorePlan Plan(const core::StartGenerationAction& start) {
    checkpoint::RestorePlan plan = VerifiedPlan(
        machine_, tier_, start, [this](const core::JobEvent& refused) { Step(refused); });
    EXPECT_TRUE(Step(RestoreChosenFor(start.generation, plan)).empty());
    return plan;
  }

  // `to - from + 1` steps of both ranks; the last one's loss is `loss_at_to`.
  std::vector<core::JobAction> Run(int64_t from, int64_t to, double loss_at_to) {
    std::vector<core::JobAction> out;
    for (int64_t s = from; s <= to; ++s) {
      now_ += 0.1;
      const double loss = s == to ? loss_at_to : 2.0;
      for (int r = 0; r < 2; ++r) {
        for (core::JobAction& a : Step(core::StepEnd{machine_.generation(), r, s, loss, 0, -1})) {
          out.push_back(std::move(a));
        }
      }
    }
    return out;
  }
  std::vector<core::JobAction> StopBoth() {
    now_ += 0.1;
    Step(core::GenerationStoppedEvent{machine_.generation(), core::NodeId{0}});
    return Step(core::GenerationStoppedEvent{machine_.generation(), core::NodeId{1}});
  }
  void Ready(int64_t step) {
    for (int r = 0; r < 2; ++r) Step(core::WorkerReady{machine_.generation(), r, step, 0.1});
  }

  const core::JobMachine& machine() const { return machine_; }

 private:
  core::JobMachine machine_;
  DurableTier tier_;
  std::string root_;
  double now_ = 0;
};

core::StartGenerationAction StartOf(const std::vector<core::JobAction>& actions) {
  for (const core::JobAction& a : actions) {
    if (const auto* s = std::get_if<core::StartGenerationAction>(&a)) return *s;
  }
  ADD_FAILURE() << "no StartGeneration";
  return core::StartGenerationAction{};
}

core::JobMachineOptions Options(int keep) {
  core::JobMachineOptions mo;
  mo.nodes = 2;
  mo.recovery.backoff_initial = Duration(0);
  mo.in_process = false;  // every restart restores from the tiers
  mo.checkpoint.keep = keep;
  return mo;
}

void FlipAByte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(12);
  f.put('\x7f');
}

class DurableTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure-durable-XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::vector<int64_t> Steps() const {
    return checkpoint::CheckpointDir(Env::Default(), root_).ListSteps();
  }
  std::string root_;
};

TEST_F(DurableTierTest, CommitsOnlyCompleteStepsAndKeepsTheNewest) {
  MiniController c(Env::Default(), root_, Options(2));
  c.Persist(5, 1);  // a one-rank save of step 5: committed
  checkpoint::CheckpointDir dir(Env::Default(), root_);
  EXPECT_TRUE(dir.Verify(5).ok());
  for (int64_t s : {10, 15, 20}) c.Persist(s);
  EXPECT_TRUE(dir.Verify(20).ok());
  EXPECT_EQ(Steps(), (std::vector<int64_t>{15, 20}));  // keep = 2
  EXPECT_EQ(c.machine().checkpoints().totals().durable_commits, 4);
  EXPECT_EQ(c.machine().checkpoints().totals().newest_durable, core::StepNumber{20});
}

// An earlier run in the same state directory committed steps up to 20 (and
// a step 40 whose shard rotted); this run resumes from 20 and its loss
// turns NaN at step 25, before its own first checkpoint: it rolls back to
// the earlier run's 20 and keeps it, and never deletes or restores 40.
TEST_F(DurableTierTest, AResumedJobRollsBackToTheEarlierRunsCheckpointAndKeepsIt) {
  {
    MiniController earlier(Env::Default(), root_, Options(3));
    for (int64_t step : {10, 15, 20, 40}) earlier.Persist(step);
  }
  checkpoint::CheckpointDir dir(Env::Default(), root_);
  FlipAByte(dir.ShardPath(40, 0));
  ASSERT_EQ(Steps(), (std::vector<int64_t>{15, 20, 40}));  // keep = 3

  MiniController c(Env::Default(), root_, Options(3));
  c.Step(core::NodeUp{core::NodeId{0}, "node0", 1});
  core::StartGenerationAction start = StartOf(c.Step(core::NodeUp{core::NodeId{1}, "node1", 1}));
  checkpoint::RestorePlan plan = c.Plan(start);
  EXPECT_EQ(plan.Summary(), "step 20 from T2 x2");  // 40 does not verify
  ASSERT_FALSE(plan.notes.empty());
  EXPECT_NE(plan.notes[0].find("refused step 40 shard 0 in T2"), std::string::npos)
      << plan.notes[0];
  EXPECT_NE(plan.notes[0].find("checksum mismatch"), std::string::npos) << plan.notes[0];
  c.Ready(20);

  c.Run(21, 25, std::nan(""));
  start = StartOf(c.StopBoth());
  EXPECT_EQ(start.restore_step.value, 24);
  EXPECT_EQ(start.abandoned_from.value, 25);
  plan = c.Plan(start);
  EXPECT_EQ(plan.Summary(), "step 20 from T2 x2");
  EXPECT_EQ(Steps(), (std::vector<int64_t>{15, 20, 40}));  // 40: another run's, kept
  ASSERT_EQ(c.machine().incidents().size(), 1u);
  EXPECT_NE(c.machine().incidents()[0].reason.find("rolling back to the checkpoint of step 20"),
            std::string::npos)
      << c.machine().incidents()[0].reason;

  // The new timeline commits 25, 30 and 32 (persisted while step 33 ran); a
  // NaN at step 33 restores 32, the newest before it.
  c.Ready(20);
  c.Run(21, 30, 2.0);
  c.Persist(25);
  c.Persist(30);
  EXPECT_EQ(Steps(), (std::vector<int64_t>{25, 30, 40}));  // keep = 3, trusted 30
  c.Persist(32);
  c.Run(31, 33, std::nan(""));
  start = StartOf(c.StopBoth());
  EXPECT_EQ(start.restore_step.value, 32);
  EXPECT_EQ(start.abandoned_from.value, 33);
  plan = c.Plan(start);
  EXPECT_EQ(plan.Summary(), "step 32 from T2 x2");
  EXPECT_EQ(Steps(), (std::vector<int64_t>{30, 32, 40}));

  // A checkpoint of the anomalous step itself holds its update: never
  // committed, and removed once the new timeline commits past it.
  c.Ready(32);
  c.Run(33, 34, 2.0);
  c.Persist(34);
  c.Run(35, 35, std::nan(""));  // a NaN at 35 after 34 was saved; 35's own save too
  start = StartOf(c.StopBoth());
  c.Persist(35);                                               // on the way out
  EXPECT_EQ(Steps(), (std::vector<int64_t>{32, 34, 35, 40}));  // 35: no manifest
  EXPECT_FALSE(checkpoint::CheckpointDir(Env::Default(), root_).CommittedShards(35).ok());
  plan = c.Plan(start);
  EXPECT_EQ(plan.Summary(), "step 34 from T2 x2");
  c.Ready(34);
  c.Run(35, 36, 2.0);
  c.Persist(36);
  EXPECT_EQ(Steps(), (std::vector<int64_t>{34, 36, 40}));
  // A crash restart now takes this timeline's newest, never the other 40.
  c.Step(core::WorkerExitEvent{c.machine().generation(), core::Rank{1}, core::NodeId{1}, 1,
                               std::nullopt});
  start = StartOf(c.StopBoth());
  EXPECT_EQ(start.restore_step.value, -1);  // the newest
  EXPECT_EQ(c.Plan(start).Summary(), "step 36 from T2 x2");
}

// An Env that counts reads of shard files: a commit must not read back and
// hash what the agents just wrote (it runs on the event loop).
class CountingEnv final : public EnvWrapper {
 public:
  CountingEnv() : EnvWrapper(Env::Default()) {}
  Result<std::string> ReadFile(const std::string& p) override {
    if (p.find("shard-") != std::string::npos) ++shard_reads;
    return EnvWrapper::ReadFile(p);
  }
  int shard_reads = 0;
};

TEST_F(DurableTierTest, CommittingReadsNoShardBackAndAPlanVerifiesWhatItLoads) {
  CountingEnv env;
  MiniController c(&env, root_, Options(2));
  for (int64_t step : {10, 20, 30}) c.Persist(step, 2, 1 << 20);
  EXPECT_EQ(env.shard_reads, 0);
  EXPECT_EQ(Steps(), (std::vector<int64_t>{20, 30}));
  c.Step(core::NodeUp{core::NodeId{0}, "node0", 1});
  core::StartGenerationAction start = StartOf(c.Step(core::NodeUp{core::NodeId{1}, "node1", 1}));
  checkpoint::RestorePlan plan = c.Plan(start);
  EXPECT_EQ(plan.Summary(), "step 30 from T2 x2");
  EXPECT_EQ(env.shard_reads, 2);
  // The plan names the files and their checksums, from the manifest.
  checkpoint::CheckpointDir dir(Env::Default(), root_);
  EXPECT_EQ(plan.sources[1].copy.path, dir.ShardPath(30, 1));
  EXPECT_EQ(plan.sources[1].copy.xxh3, dir.CommittedShards(30)->at(1).xxh3);
}

}  // namespace
}  // namespace endure::controller
