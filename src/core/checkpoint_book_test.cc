#include "core/checkpoint_book.h"

#include <gtest/gtest.h>

#include <variant>

namespace endure::core {
namespace {

using checkpoint::ShardCopy;
using checkpoint::Tier;

StepNumber S(int64_t step) { return StepNumber{step}; }

// The book with a simulated durable directory beside it: what the shell
// does with the book's actions, minus the files.
class Book {
 public:
  explicit Book(CheckpointBookOptions o = {}) : book(o) {}

  // Every shard of `step` (of `shards`) durable, in generation `g`.
  void Persist(int64_t step, int shards = 2, Generation g = Generation{0}) {
    for (int s = 0; s < shards; ++s) {
      Carry(book.OnShardPersisted(
          ShardPersisted{g, NodeId{s}, S(step), s, shards, 100, 0xabc0u + s, 0, 0}));
    }
  }
  void Carry(const std::vector<BookAction>& actions) {
    for (const BookAction& a : actions) {
      if (const auto* w = std::get_if<WriteManifestAction>(&a)) {
        dir[w->step.value] = static_cast<int>(w->shards.size());
        leftovers.erase(w->step.value);  // its directory now has a manifest
        bool committed = false;
        Carry(book.OnManifestWritten(ManifestWritten{w->step, ""}, &committed));
        EXPECT_TRUE(committed);
      } else if (const auto* r = std::get_if<RemoveStepAction>(&a)) {
        removed.push_back({r->step.value, r->reason});
        if (fail_removals) {
          book.OnStepRemoved(StepRemoved{r->step, "Permission denied"});
        } else {
          dir.erase(r->step.value);
          leftovers.erase(r->step.value);
          book.OnStepRemoved(StepRemoved{r->step, ""});
        }
      }
    }
  }
  DurableListed Listing() const {
    DurableListed l;
    for (const auto& [step, shards] : dir) l.committed.push_back(ListedStep{S(step), shards});
    for (int64_t step : leftovers) l.leftovers.push_back(S(step));
    return l;
  }
  std::vector<int64_t> Steps() const {
    std::vector<int64_t> out;
    for (const auto& [step, shards] : dir) out.push_back(step);
    return out;
  }
  checkpoint::RestorePlan Plan(StepNumber limit = S(-1)) const {
    return book.Plan({{"node0", {0}}, {"node1", {1}}}, limit);
  }

  CheckpointBook book;
  std::map<int64_t, int> dir;  // committed step -> shards
  std::set<int64_t> leftovers;
  std::vector<std::pair<int64_t, RemoveReason>> removed;
  bool fail_removals = false;
};

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

TEST(CheckpointBookTest, CommitsCompleteStepsAndRetainsTheNewest) {
  Book b(CheckpointBookOptions{.keep = 2});
  b.leftovers = {3};
  b.book.OnListed(b.Listing());
  // One shard of two of step 5 arrives; the other never does.
  b.Carry(b.book.OnShardPersisted(ShardPersisted{Generation{0}, NodeId{0}, S(5), 0, 2, 1, 1}));
  EXPECT_TRUE(b.dir.empty());
  for (int64_t s : {10, 15, 20}) b.Persist(s);
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{15, 20}));
  EXPECT_TRUE(b.leftovers.empty());  // older than the newest committed step
  EXPECT_EQ(b.book.totals().durable_commits, 3);
  EXPECT_EQ(b.book.totals().newest_durable, S(20));
  // A late shard of a step older than the newest commit: nothing.
  b.Carry(b.book.OnShardPersisted(ShardPersisted{Generation{0}, NodeId{0}, S(5), 1, 2, 1, 1}));
  EXPECT_EQ(b.book.totals().durable_commits, 3);
  // A manifest that cannot be written is no commit, and counts as a failure.
  std::vector<BookAction> write =
      b.book.OnShardPersisted(ShardPersisted{Generation{0}, NodeId{0}, S(25), 0, 1, 1, 1});
  ASSERT_EQ(write.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<WriteManifestAction>(write[0]));
  bool committed = true;
  EXPECT_TRUE(
      b.book.OnManifestWritten(ManifestWritten{S(25), "No space left"}, &committed).empty());
  EXPECT_FALSE(committed);
  EXPECT_EQ(b.book.totals().persist_failures, 1);
  EXPECT_EQ(b.book.totals().newest_durable, S(20));
  // A result nobody asked for changes nothing.
  EXPECT_TRUE(b.book.OnManifestWritten(ManifestWritten{S(30), ""}, &committed).empty());
  EXPECT_FALSE(committed);
}

TEST(CheckpointBookTest, PlansFromMemoryFirstAndNeverFromARefusedCopy) {
  Book b;
  b.Persist(10);
  b.Persist(20);
  // node1 is gone; node0 holds its own shard 0 and a replica of shard 1.
  b.book.OnInventory(
      InventoryReported{NodeId{0},
                        {Memory(22, 0, Tier::kT0, "node0"), Memory(22, 1, Tier::kT1, "node0"),
                         Memory(21, 0, Tier::kT0, "node0")},
                        300,
                        300},
      "node0");
  b.book.OnInventory(InventoryReported{NodeId{1}, {Memory(22, 1, Tier::kT0, "node1")}, 300, 300},
                     "node1");
  b.book.OnNodeGone("node1");
  checkpoint::RestorePlan plan = b.book.Plan({{"node0", {0}}, {"node2", {1}}}, S(-1));
  EXPECT_EQ(plan.Summary(), "step 22 from T0 x1, T1 x1");
  EXPECT_EQ(plan.sources[1].loader_rank, 0);  // node0 reads the replica for rank 1

  // Without memory copies: the durable step, then an older one when a
  // shard of it was refused by the shell's verification.
  b.book.OnNodeGone("node0");
  EXPECT_EQ(b.Plan().Summary(), "step 20 from T2 x2");
  b.book.OnShardRefused(ShardRefused{S(20), 1, "checksum mismatch"});
  plan = b.Plan();
  EXPECT_EQ(plan.Summary(), "step 10 from T2 x2");
  ASSERT_FALSE(plan.notes.empty());
  EXPECT_NE(plan.notes[0].find("refused step 20 shard 1 in T2"), std::string::npos)
      << plan.notes[0];
  EXPECT_EQ(b.Plan(S(15)).Summary(), "step 10 from T2 x2");
  EXPECT_EQ(b.Plan(S(0)).Summary(), "fresh start");
  EXPECT_EQ(b.book.totals().peak_t0_bytes, 300u);
}

// An earlier run left 15, 20 and 40 (40 rotten); this run restores 20 and
// rolls back from a NaN at 25: step 40 is another run's, kept (retention
// alone may remove it) and never restored, not even by a later crash.
TEST(CheckpointBookTest, ARollbackRemovesOnlyThisTimelinesStepsAndNeverRestoresTheOthers) {
  Book b(CheckpointBookOptions{.keep = 3});
  b.dir = {{15, 2}, {20, 2}, {40, 2}};
  b.book.OnListed(b.Listing());
  b.book.OnShardRefused(ShardRefused{S(40), 0, "checksum mismatch"});
  checkpoint::RestorePlan plan = b.Plan();
  EXPECT_EQ(plan.Summary(), "step 20 from T2 x2");
  b.book.OnRestored(Generation{0}, S(plan.step), {{"T2", 2}});
  // The refusal is remembered, and 40 is another timeline now.
  EXPECT_EQ(b.book.Restorable(), (std::vector<StepNumber>{S(15), S(20)}));

  EXPECT_TRUE(b.book.OnCopyTaken(S(22)));
  EXPECT_FALSE(b.book.OnCopyTaken(S(22)));
  b.Persist(22);
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{20, 22, 40}));  // keep 3 counts 40 too
  EXPECT_EQ(b.removed,
            (std::vector<std::pair<int64_t, RemoveReason>>{{15, RemoveReason::kRetention}}));
  b.removed.clear();
  std::vector<std::string> notes;
  b.Carry(b.book.OnRollback(S(24), S(25), &notes));
  EXPECT_TRUE(b.removed.empty());          // nothing of this timeline is at or after 25
  EXPECT_TRUE(notes.empty()) << notes[0];  // 40 was already another timeline's
  // A shard of step 26, saved on the way out of the abandoned timeline.
  b.Persist(26, 2, Generation{0});
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{20, 22, 40}));
  plan = b.Plan(S(24));
  EXPECT_EQ(plan.Summary(), "step 22 from T2 x2");
  b.book.OnRestored(Generation{1}, S(22), {{"T2", 2}});
  // Late shards of generation 0 beyond the restore point: the old timeline.
  b.Persist(26, 2, Generation{0});
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{20, 22, 40}));

  // The new timeline commits 25 and 30; a NaN at 31 abandons from 31.
  b.Persist(25, 2, Generation{1});
  b.Persist(30, 2, Generation{1});
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{25, 30, 40}));
  b.Persist(32, 2, Generation{1});  // persisted while step 33 ran
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{30, 32, 40}));
  b.removed.clear();
  b.Carry(b.book.OnRollback(S(30), S(31), &notes));
  EXPECT_EQ(b.removed,
            (std::vector<std::pair<int64_t, RemoveReason>>{{32, RemoveReason::kAbandoned}}));
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{30, 40}));
  // A crash restart after the rollback takes the newest of this timeline,
  // never another run's 40.
  EXPECT_EQ(b.Plan().Summary(), "step 30 from T2 x2");
  EXPECT_EQ(b.book.Newest(), S(30));
}

TEST(CheckpointBookTest, AnotherRunsStepAfterTheRollbackTargetIsKeptWithANote) {
  Book b(CheckpointBookOptions{.keep = 3});
  b.dir = {{10, 2}, {40, 2}};
  b.book.OnListed(b.Listing());
  // Before any restore: the earlier run's newest counts for a rollback.
  EXPECT_EQ(b.book.Newest(), S(40));
  std::vector<std::string> notes;
  b.Carry(b.book.OnRollback(S(24), S(25), &notes));
  EXPECT_TRUE(b.removed.empty());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0], "kept durable step 40: committed by another run, not part of this timeline");
  EXPECT_EQ(b.Plan().Summary(), "step 10 from T2 x2");
}

TEST(CheckpointBookTest, AnAbandonedStepThatCannotBeRemovedIsNeverRestoredAndRetried) {
  Book b(CheckpointBookOptions{.keep = 5});
  b.Persist(10);
  b.Persist(20);
  b.fail_removals = true;
  std::vector<std::string> notes;
  b.Carry(b.book.OnRollback(S(15), S(16), &notes));
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{10, 20}));  // still there
  EXPECT_EQ(b.Plan().Summary(), "step 10 from T2 x2");
  b.book.OnRestored(Generation{1}, S(10), {});
  b.fail_removals = false;
  b.removed.clear();
  b.Persist(12, 2, Generation{1});
  EXPECT_EQ(b.removed,
            (std::vector<std::pair<int64_t, RemoveReason>>{{20, RemoveReason::kAbandoned}}));
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{10, 12}));
}

TEST(CheckpointBookTest, AListingForgetsWhatIsGoneAndNamesWhatIsBeyondTheRestorePoint) {
  Book b;
  b.Persist(10);
  b.Persist(20);
  b.book.OnRestored(Generation{1}, S(20), {});
  // Meanwhile (a controller outage): 10 was removed by hand, another
  // controller wrote 30.
  b.dir = {{20, 2}, {30, 2}};
  b.book.OnListed(b.Listing());
  EXPECT_EQ(b.book.Restorable(), (std::vector<StepNumber>{S(20)}));
  EXPECT_EQ(b.Plan().Summary(), "step 20 from T2 x2");
}

// An agent's report is hostile until checked: a shard of a world larger
// than the job's, or out of its own range, never becomes pending (a report
// of shards = 10^9 would otherwise let one step grow without bound).
TEST(CheckpointBookTest, ShardsOutOfTheJobsRangeAreRefused) {
  Book b(CheckpointBookOptions{.max_shards = 4});
  for (const ShardPersisted& p : {
           ShardPersisted{Generation{0}, NodeId{0}, S(10), 0, 1'000'000'000, 1, 1},
           ShardPersisted{Generation{0}, NodeId{0}, S(10), 5, 4, 1, 1},
           ShardPersisted{Generation{0}, NodeId{0}, S(10), -1, 4, 1, 1},
           ShardPersisted{Generation{0}, NodeId{0}, S(0), 0, 1, 1, 1},
       }) {
    EXPECT_TRUE(b.book.OnShardPersisted(p).empty());
  }
  EXPECT_EQ(b.book.pending_shards(), 0u);
  b.Carry(b.book.OnShardPersisted(ShardPersisted{Generation{0}, NodeId{0}, S(10), 0, 4, 1, 1}));
  EXPECT_EQ(b.book.pending_shards(), 1u);
  b.Persist(10, 4);
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{10}));
}

// A controller died between asking for a step's manifest and hearing it
// was written (its journal has the ask, not the answer): the listing of
// the carried-on controller settles it. Written: the step is this
// timeline's (a rollback removes it). Not written: its shards are a
// leftover, and the step may be saved again.
TEST(CheckpointBookTest, AListingSettlesAManifestAskedForAndNeverHeardOf) {
  Book b;
  b.Persist(10);
  for (int s = 0; s < 2; ++s) {
    b.book.OnShardPersisted(ShardPersisted{Generation{0}, NodeId{s}, S(20), s, 2, 1, 1});
  }
  b.dir[20] = 2;  // the manifest was written; the controller died
  b.book.OnListed(b.Listing());
  EXPECT_EQ(b.book.totals().newest_durable, S(20));
  std::vector<std::string> notes;
  b.Carry(b.book.OnRollback(S(15), S(16), &notes));
  EXPECT_TRUE(notes.empty());
  EXPECT_EQ(b.Steps(), (std::vector<int64_t>{10}));

  Book c;
  for (int s = 0; s < 2; ++s) {
    c.book.OnShardPersisted(ShardPersisted{Generation{0}, NodeId{s}, S(30), s, 2, 1, 1});
  }
  c.leftovers = {30};  // it died before writing it
  c.book.OnListed(c.Listing());
  c.Persist(30);  // saved again (after a restore, say): committed this time
  EXPECT_EQ(c.Steps(), (std::vector<int64_t>{30}));
  EXPECT_TRUE(c.leftovers.empty());
}

TEST(CheckpointBookTest, BudgetSplitsSlotsAndReplicasGoToTheNextNode) {
  EXPECT_EQ(CheckpointBook(CheckpointBookOptions{.memory_budget = 1000}).SlotBytes(), 200u);
  EXPECT_EQ(CheckpointBook(CheckpointBookOptions{.replicas = 0, .memory_budget = 900}).SlotBytes(),
            300u);
  EXPECT_EQ(CheckpointBook().SlotBytes(), 0u);
  const std::vector<NodeId> nodes = {NodeId{4}, NodeId{7}, NodeId{9}};
  EXPECT_EQ(ReplicaPeerOf(nodes, 0, 1), NodeId{7});
  EXPECT_EQ(ReplicaPeerOf(nodes, 2, 1), NodeId{4});
  EXPECT_EQ(ReplicaPeerOf(nodes, 0, 0), std::nullopt);
  EXPECT_EQ(ReplicaPeerOf({NodeId{4}}, 0, 1), std::nullopt);
  EXPECT_TRUE(DurableStepDue(30, 10));
  EXPECT_FALSE(DurableStepDue(35, 10));
  EXPECT_TRUE(DurableStepDue(35, 0));
  EXPECT_FALSE(CheckpointBookOptions{.keep = 0}.Validate().ok());
}

}  // namespace
}  // namespace endure::core
