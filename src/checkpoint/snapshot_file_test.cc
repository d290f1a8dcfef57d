#include "checkpoint/snapshot_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

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

TEST_F(SnapshotFileTest, DoubleBufferedSavesSurviveTheWriter) {
  Result<std::unique_ptr<SnapshotWriter>> w = SnapshotWriter::Open(dir_, 1, 2, 0);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto s1 = (*w)->Save(1, Views(1, 'a'));
  auto s2 = (*w)->Save(2, Views(2, 'b'));
  ASSERT_TRUE(s1.ok() && s2.ok() && s1->has_value() && s2->has_value());
  EXPECT_NE((*s1)->slot, (*s2)->slot);
  w->reset();  // the worker dies; the slots stay

  Result<std::string> p = ReadSnapshotPayload((*s2)->path, 2, (*s2)->bytes, (*s2)->xxh3);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  Result<DecodedShard> shard = DecodeShard(*p, "t0");
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->meta["step"], 2);
  EXPECT_EQ(shard->tensors[0].data, std::string(4096, 'b'));

  // A new writer continues after the newest snapshot: step 3 replaces step 1.
  w = SnapshotWriter::Open(dir_, 1, 2, 0);
  auto s3 = (*w)->Save(3, Views(3, 'c'));
  ASSERT_TRUE(s3.ok() && s3->has_value());
  EXPECT_EQ((*s3)->slot, (*s1)->slot);
  EXPECT_TRUE(ReadSnapshotPayload((*s2)->path, 2, (*s2)->bytes, (*s2)->xxh3).ok());
}

TEST_F(SnapshotFileTest, PinnedSlotIsNeverOverwritten) {
  auto w = SnapshotWriter::Open(dir_, 0, 1, 0);
  auto s1 = (*w)->Save(1, Views(1, 'a'));
  auto s2 = (*w)->Save(2, Views(2, 'b'));
  auto f = SnapshotFile::Open((*s1)->path);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE((*f)->Pin(2));  // it holds step 1
  ASSERT_TRUE((*f)->Pin(1));
  auto s3 = (*w)->Save(3, Views(3, 'c'));
  ASSERT_TRUE(s3.ok());
  EXPECT_FALSE(s3->has_value());  // no wait allowed: skipped
  EXPECT_TRUE((*f)->Verify().ok());
  EXPECT_EQ((*f)->info().step, 1);
  (*f)->Unpin();
  s3 = (*w)->Save(3, Views(3, 'c', 3 << 20));  // grows the slot while the agent has it mapped
  ASSERT_TRUE(s3.ok() && s3->has_value());
  EXPECT_EQ((*s3)->slot, (*s1)->slot);
  EXPECT_TRUE(ReadSnapshotPayload((*s3)->path, 3, (*s3)->bytes, (*s3)->xxh3).ok());
}

TEST_F(SnapshotFileTest, ASaveWaitsForTheAgentToLetGo) {
  auto w = SnapshotWriter::Open(dir_, 0, 1, 0);
  auto s1 = (*w)->Save(1, Views(1, 'a'));
  (*w)->Save(2, Views(2, 'b'));
  auto f = SnapshotFile::Open((*s1)->path);
  ASSERT_TRUE((*f)->Pin(1));
  std::thread agent([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // Until it lets go, the agent's snapshot is intact.
    EXPECT_TRUE((*f)->Verify().ok());
    EXPECT_EQ((*f)->info().step, 1);
    (*f)->Unpin();
  });
  auto s3 = (*w)->Save(3, Views(3, 'c'), std::chrono::seconds(30));
  agent.join();
  ASSERT_TRUE(s3.ok() && s3->has_value());
  EXPECT_EQ((*s3)->slot, (*s1)->slot);
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
