#include "checkpoint/snapshot_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "common/hash.h"

namespace endure::checkpoint {
namespace {

class SnapshotFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure-snapshot-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A shard whose one tensor holds `fill`.
  std::vector<TensorView> Views(int64_t step, char fill, size_t n = 4096) {
    meta_ = "{\"step\":" + std::to_string(step) + "}";
    data_.assign(n, fill);
    return ShardViews(
        meta_, {TensorView{"w", "uint8", {static_cast<int64_t>(n)}, data_.data(), data_.size()}});
  }

  std::string dir_;
  std::string meta_, data_;
};

TEST_F(SnapshotFileTest, SavesRotateOverTheSlotsAndSurviveTheWriter) {
  Result<std::unique_ptr<SnapshotWriter>> w = SnapshotWriter::Open(dir_, 1, 2, 0);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<SnapshotWriter::Saved> saved;
  for (int64_t step = 1; step <= kT0Slots; ++step) {
    auto s = (*w)->Save(step, Views(step, static_cast<char>('a' + step)));
    ASSERT_TRUE(s.ok() && s->has_value());
    for (const SnapshotWriter::Saved& earlier : saved) EXPECT_NE(earlier.slot, (*s)->slot);
    saved.push_back(**s);
  }
  w->reset();  // the worker dies; the slots stay

  const SnapshotWriter::Saved& newest = saved.back();
  Result<std::string> p = ReadSnapshotPayload(newest.path, kT0Slots, newest.bytes, newest.xxh3);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<DecodedShard> shard = DecodeShard(*p, "t0");
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->meta["step"], kT0Slots);
  EXPECT_EQ(shard->tensors[0].data, std::string(4096, static_cast<char>('a' + kT0Slots)));

  // A new writer continues after the newest snapshot, into the oldest slot.
  w = SnapshotWriter::Open(dir_, 1, 2, 0);
  auto next = (*w)->Save(kT0Slots + 1, Views(kT0Slots + 1, 'z'));
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((*next)->slot, saved.front().slot);
  EXPECT_TRUE(ReadSnapshotPayload(newest.path, kT0Slots, newest.bytes, newest.xxh3).ok());
}

// The agent reads a snapshot in place for as long as its replica and its
// durable write take: the worker goes on saving into the other slots,
// never waiting, and the pinned snapshot stays intact.
TEST_F(SnapshotFileTest, APinnedSlotIsNeverOverwrittenAndTheWriterNeverWaitsForIt) {
  auto w = SnapshotWriter::Open(dir_, 0, 1, 0);
  auto s1 = (*w)->Save(1, Views(1, 'a'));
  auto f = SnapshotFile::Open((*s1)->path);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE((*f)->Pin(2));  // it holds step 1
  ASSERT_TRUE((*f)->Pin(1));
  for (int64_t step = 2; step <= 10; ++step) {
    // No wait allowed, and none needed.
    auto s = (*w)->Save(step, Views(step, 'b', step == 10 ? 3 << 20 : 4096));
    ASSERT_TRUE(s.ok() && s->has_value()) << "step " << step;
    EXPECT_NE((*s)->slot, (*s1)->slot);
    EXPECT_TRUE(ReadSnapshotPayload((*s)->path, step, (*s)->bytes, (*s)->xxh3).ok());
  }
  EXPECT_TRUE((*f)->Verify().ok());
  EXPECT_EQ((*f)->info().step, 1);
  (*f)->Unpin();
  // Let go, it is the oldest: the next save takes it, and grows it while the
  // agent still has it mapped.
  auto s11 = (*w)->Save(11, Views(11, 'c', 3 << 20));
  ASSERT_TRUE(s11.ok() && s11->has_value());
  EXPECT_EQ((*s11)->slot, (*s1)->slot);
  EXPECT_TRUE(ReadSnapshotPayload((*s11)->path, 11, (*s11)->bytes, (*s11)->xxh3).ok());
}

// The step before a suspect one is held back as the rollback target: saves
// rotate over the other slots and it survives any number of them; it yields
// only when nothing else is free (the other slot pinned), so a save never
// waits for a hold.
TEST_F(SnapshotFileTest, AHeldSnapshotSurvivesLaterSavesAndYieldsRatherThanWait) {
  auto w = SnapshotWriter::Open(dir_, 0, 1, 0);
  auto s1 = (*w)->Save(1, Views(1, 'a'));
  auto s2 = (*w)->Save(2, Views(2, 'b'));
  ASSERT_TRUE(s1.ok() && s1->has_value() && s2.ok() && s2->has_value());
  (*w)->Hold(1);
  for (int64_t step = 3; step <= 12; ++step) {
    auto s = (*w)->Save(step, Views(step, 'c'));
    ASSERT_TRUE(s.ok() && s->has_value()) << "step " << step;
    EXPECT_NE((*s)->slot, (*s1)->slot) << "step " << step;
  }
  EXPECT_TRUE(ReadSnapshotPayload((*s1)->path, 1, (*s1)->bytes, (*s1)->xxh3).ok());

  // The one slot that is neither held nor the newest gets pinned: the next
  // save takes the held slot rather than wait.
  auto s13 = (*w)->Save(13, Views(13, 'd'));
  ASSERT_TRUE(s13.ok() && s13->has_value());
  auto newest = SnapshotFile::Open((*s13)->path);
  ASSERT_TRUE(newest.ok());
  int other = -1;
  for (int i = 0; i < kT0Slots; ++i) {
    if (i != (*s1)->slot && i != (*s13)->slot) other = i;
  }
  auto pinned = SnapshotFile::Open(dir_ + "/rank-0.slot-" + std::to_string(other));
  ASSERT_TRUE(pinned.ok());
  ASSERT_TRUE((*pinned)->Pin((*pinned)->info().step));
  auto s14 = (*w)->Save(14, Views(14, 'e'));
  ASSERT_TRUE(s14.ok() && s14->has_value());
  EXPECT_EQ((*s14)->slot, (*s1)->slot);
  (*pinned)->Unpin();
}

// Only when every slot but the newest is pinned (a shutdown persisting
// several) does a save wait, up to its limit.
TEST_F(SnapshotFileTest, ASaveWaitsWhenEverySlotButTheNewestIsPinned) {
  auto w = SnapshotWriter::Open(dir_, 0, 1, 0);
  std::vector<std::unique_ptr<SnapshotFile>> pinned;
  for (int64_t step = 1; step < kT0Slots; ++step) {
    auto s = (*w)->Save(step, Views(step, 'a'));
    auto f = SnapshotFile::Open((*s)->path);
    ASSERT_TRUE(f.ok() && (*f)->Pin(step));
    pinned.push_back(std::move(f).value());
  }
  auto newest = (*w)->Save(kT0Slots, Views(kT0Slots, 'n'));
  ASSERT_TRUE(newest.ok() && newest->has_value());
  auto skipped = (*w)->Save(kT0Slots + 1, Views(kT0Slots + 1, 'x'));
  ASSERT_TRUE(skipped.ok());
  EXPECT_FALSE(skipped->has_value());  // no wait allowed: skipped
  std::thread agent([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // Until it lets go, the agent's snapshot is intact.
    EXPECT_TRUE(pinned.front()->Verify().ok());
    EXPECT_EQ(pinned.front()->info().step, 1);
    pinned.front()->Unpin();
  });
  auto later = (*w)->Save(kT0Slots + 1, Views(kT0Slots + 1, 'c'), std::chrono::seconds(30));
  agent.join();
  ASSERT_TRUE(later.ok() && later->has_value());
  EXPECT_EQ((*later)->slot, 0);  // step 1's slot, let go
  EXPECT_TRUE(
      ReadSnapshotPayload((*newest)->path, kT0Slots, (*newest)->bytes, (*newest)->xxh3).ok());
}

// A replica written as its bytes arrive is readable only once whole.
TEST_F(SnapshotFileTest, AStreamedSnapshotIsReadyOnlyWhenFinished) {
  const std::string payload(10000, 'r');
  SnapshotInfo info;
  info.step = 9;
  info.shard = 1;
  info.shards = 2;
  info.bytes = payload.size();
  info.xxh3 = Xxh3(payload);
  const std::string path = dir_ + "/replica";
  {
    auto w = SnapshotFileWriter::Begin(path, info);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE((*w)->Append(std::string_view(payload).substr(0, 4000)).ok());
    auto f = SnapshotFile::Open(path);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ((*f)->info().state, SlotState::kWriting);
    EXPECT_EQ((*w)->Finish().code(), StatusCode::kInvalidArgument);  // 6000 bytes missing
  }                                                                  // dropped unfinished
  auto f = SnapshotFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->info().state, SlotState::kEmpty);
  EXPECT_EQ(ReadSnapshotPayload(path, 9, payload.size(), info.xxh3).status().code(),
            StatusCode::kDataLoss);

  auto w = SnapshotFileWriter::Begin(path, info);
  ASSERT_TRUE(w.ok());
  for (size_t at = 0; at < payload.size(); at += 3000) {
    ASSERT_TRUE((*w)->Append(std::string_view(payload).substr(at, 3000)).ok());
  }
  EXPECT_EQ((*w)->Append("x").code(), StatusCode::kInvalidArgument);  // past its size
  ASSERT_TRUE((*w)->Finish().ok());
  Result<std::string> read = ReadSnapshotPayload(path, 9, payload.size(), info.xxh3);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, payload);
}

TEST_F(SnapshotFileTest, CorruptionAndStaleStepsAreRefused) {
  auto w = SnapshotWriter::Open(dir_, 0, 1, 0);
  auto s1 = (*w)->Save(7, Views(7, 'a'));
  auto f = SnapshotFile::Open((*s1)->path);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->Verify().ok());
  (*f)->InjectCorruption();
  EXPECT_NE((*f)->Verify().message().find("checksum mismatch"), std::string::npos);
  Result<std::string> p = ReadSnapshotPayload((*s1)->path, 7, (*s1)->bytes, (*s1)->xxh3);
  EXPECT_EQ(p.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(p.status().message().find("checksum mismatch"), std::string::npos);
  EXPECT_NE(ReadSnapshotPayload((*s1)->path, 8, (*s1)->bytes, (*s1)->xxh3)
                .status()
                .message()
                .find("no longer holds step 8"),
            std::string::npos);
  (*f)->Invalidate();
  EXPECT_EQ((*f)->info().state, SlotState::kEmpty);
  // A truncated file is refused too.
  ASSERT_EQ(truncate((*s1)->path.c_str(), 100), 0);
  EXPECT_EQ(ReadSnapshotPayload((*s1)->path, 7, (*s1)->bytes, (*s1)->xxh3).status().code(),
            StatusCode::kDataLoss);
}

TEST_F(SnapshotFileTest, BudgetAndReplicaFiles) {
  auto w = SnapshotWriter::Open(dir_, 0, 1, 1000);
  auto too_big = (*w)->Save(1, Views(1, 'a', 2000));
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("checkpoint.memory_budget"), std::string::npos);

  SnapshotInfo info;
  info.step = 5;
  info.shard = 3;
  info.shards = 4;
  std::string payload(100, 'x');
  info.xxh3 = 42;  // a wrong checksum is kept as given: the reader refuses it
  const std::string path = dir_ + "/replica";
  ASSERT_TRUE(WriteSnapshotFile(path, info, payload).ok());
  auto f = SnapshotFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->info().shard, 3);
  EXPECT_EQ((*f)->info().state, SlotState::kReady);
  EXPECT_FALSE((*f)->Verify().ok());
}

TEST_F(SnapshotFileTest, ASlotReplacedByASymlinkOrAFifoIsRefused) {
  // A worker owns its slot files and could put something else in their
  // place: the agent must not follow it elsewhere, nor block on it.
  Result<std::unique_ptr<SnapshotWriter>> w = SnapshotWriter::Open(dir_, 0, 1, 0);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto saved = (*w)->Save(1, Views(1, 'a'));
  ASSERT_TRUE(saved.ok() && saved->has_value());
  const std::string target = (*saved)->path;
  const std::string link = SlotPath(dir_, 5, 0);
  std::filesystem::create_symlink(target, link);
  Result<std::unique_ptr<SnapshotFile>> f = SnapshotFile::Open(link);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("a symlink"), std::string::npos) << f.status().message();
  EXPECT_FALSE(ReadSnapshotPayload(link, 1, (*saved)->bytes, (*saved)->xxh3).ok());
  const std::string fifo = SlotPath(dir_, 6, 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  f = SnapshotFile::Open(fifo);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos)
      << f.status().message();
  EXPECT_FALSE(ReadSnapshotPayload(fifo, 1, (*saved)->bytes, (*saved)->xxh3).ok());
  EXPECT_TRUE(SnapshotFile::Open(target).ok());
}

}  // namespace
}  // namespace endure::checkpoint
