#include "checkpoint/checkpoint_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>

namespace endure::checkpoint {
namespace {

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_ckpt_test.XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  void TearDown() override { (void)env_->RemoveAll(root_); }

  TrainingState State(int64_t step) {
    TrainingState s;
    s.step = step;
    s.meta = {{"lr", 0.001}};
    s.tensors = {{"w", "float32", {4}, std::string(16, static_cast<char>(step))}};
    return s;
  }

  void Corrupt(int64_t step, const std::string& file, size_t offset) {
    std::string path = JoinPath(dir_.StepDir(step), file);
    std::string bytes = *env_->ReadFile(path);
    bytes[offset] ^= 0x10;
    ASSERT_TRUE(WriteFileAtomically(env_, path, bytes).ok());
  }

  Env* env_ = Env::Default();
  std::string root_;
  CheckpointDir dir_{env_, ""};
};

TEST_F(CheckpointDirTest, CommitThenLoadNewest) {
  dir_ = CheckpointDir(env_, root_);
  ASSERT_TRUE(dir_.Commit(State(10)).ok());
  ASSERT_TRUE(dir_.Commit(State(20)).ok());
  std::vector<std::string> refused;
  Result<TrainingState> s = dir_.LoadNewest(&refused);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->step, 20);
  EXPECT_EQ(s->tensors, State(20).tensors);
  EXPECT_EQ(s->meta["lr"], 0.001);
  EXPECT_TRUE(refused.empty());
  // Only committed files remain: no temporaries.
  EXPECT_EQ(*env_->ListDir(dir_.StepDir(20)),
            (std::vector<std::string>{"MANIFEST.json", "shard-00000.bin"}));
}

TEST_F(CheckpointDirTest, FlippedByteIsRefusedAndOlderStepUsed) {
  dir_ = CheckpointDir(env_, root_);
  ASSERT_TRUE(dir_.Commit(State(10)).ok());
  ASSERT_TRUE(dir_.Commit(State(20)).ok());
  Corrupt(20, "shard-00000.bin", 30);
  std::vector<std::string> refused;
  Result<TrainingState> s = dir_.LoadNewest(&refused);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->step, 10);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("step-00000020/shard-00000.bin: checksum mismatch"), std::string::npos)
      << refused[0];
}

TEST_F(CheckpointDirTest, LoadNewestAtOrBeforeIgnoresNewerSteps) {
  dir_ = CheckpointDir(env_, root_);
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(dir_.Commit(State(step)).ok());
  std::vector<std::string> refused;
  EXPECT_EQ(dir_.LoadNewestAtOrBefore(20, &refused)->step, 20);
  EXPECT_EQ(dir_.LoadNewestAtOrBefore(29, &refused)->step, 20);
  EXPECT_EQ(dir_.LoadNewestAtOrBefore(1000, &refused)->step, 30);
  EXPECT_TRUE(refused.empty());  // newer steps are skipped, not refused
  // A damaged step at the bound falls back to an older one and says why.
  Corrupt(20, "shard-00000.bin", 30);
  Result<TrainingState> s = dir_.LoadNewestAtOrBefore(25, &refused);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->step, 10);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("step-00000020/shard-00000.bin"), std::string::npos) << refused[0];
  Result<TrainingState> none = dir_.LoadNewestAtOrBefore(9, nullptr);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("at or before step 9"), std::string::npos);
}

TEST_F(CheckpointDirTest, TruncatedFileIsRefused) {
  dir_ = CheckpointDir(env_, root_);
  ASSERT_TRUE(dir_.Commit(State(10)).ok());
  std::string path = dir_.ShardPath(10, 0);
  ASSERT_TRUE(truncate(path.c_str(), 3) == 0);
  Status st = dir_.Verify(10);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("shard-00000.bin: size 3 bytes"), std::string::npos) << st.message();
  EXPECT_EQ(dir_.LoadNewest(nullptr).status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointDirTest, MissingManifestMeansUncommitted) {
  dir_ = CheckpointDir(env_, root_);
  ASSERT_TRUE(dir_.Commit(State(10)).ok());
  ASSERT_TRUE(dir_.Commit(State(20)).ok());
  ASSERT_TRUE(env_->RemoveFile(JoinPath(dir_.StepDir(20), "MANIFEST.json")).ok());
  std::vector<std::string> refused;
  EXPECT_EQ(dir_.LoadNewest(&refused)->step, 10);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("step-00000020/MANIFEST.json: manifest missing"), std::string::npos);
}

// Found by fuzz/manifest_fuzz.cc: a manifest whose "step" was a string threw
// out of the reader (terminating the process); 1e300 was undefined behaviour.
TEST_F(CheckpointDirTest, ManifestWithAMistypedStepIsMalformed) {
  dir_ = CheckpointDir(env_, root_);
  ASSERT_TRUE(dir_.Commit(State(10)).ok());
  ASSERT_TRUE(dir_.Commit(State(20)).ok());
  const std::string path = JoinPath(dir_.StepDir(20), "MANIFEST.json");
  nlohmann::json manifest = nlohmann::json::parse(*env_->ReadFile(path));
  for (const nlohmann::json& step : {nlohmann::json("20"), nlohmann::json(1e300),
                                     nlohmann::json(20.0), nlohmann::json(nullptr)}) {
    manifest["step"] = step;
    ASSERT_TRUE(WriteFileAtomically(env_, path, manifest.dump()).ok());
    Result<std::vector<ShardEntry>> shards = dir_.CommittedShards(20);
    ASSERT_FALSE(shards.ok()) << step.dump();
    EXPECT_EQ(shards.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(shards.status().message().find("manifest is malformed"), std::string::npos);
    std::vector<std::string> refused;
    EXPECT_EQ(dir_.LoadNewest(&refused)->step, 10) << step.dump();
  }
}

TEST_F(CheckpointDirTest, RetainKeepsNewestAndDropsOldLeftovers) {
  dir_ = CheckpointDir(env_, root_);
  for (int64_t s : {10, 20, 30, 40}) ASSERT_TRUE(dir_.Commit(State(s)).ok());
  ASSERT_TRUE(env_->CreateDirs(dir_.StepDir(15)).ok());  // an interrupted save
  ASSERT_TRUE(env_->CreateDirs(dir_.StepDir(50)).ok());  // a save in progress
  ASSERT_TRUE(dir_.Retain(2).ok());
  EXPECT_EQ(dir_.ListSteps(), (std::vector<int64_t>{30, 40, 50}));
}

// Shards written by separate writers (one per node) commit together.
std::string ShardBytes(int64_t step, int shard) {
  TensorBlob t{"w" + std::to_string(shard), "float32", {2}, std::string(8, char('a' + shard))};
  const std::string meta = nlohmann::json{{"step", step}, {"shard", shard}}.dump();
  std::vector<TensorView> views = ShardViews(meta, {ViewOf(t)});
  std::string bytes(EncodedSize(views), '\0');
  EncodeTensorsInto(views, bytes.data());
  return bytes;
}

TEST_F(CheckpointDirTest, ShardedStepCommitsOnlyWithItsManifest) {
  dir_ = CheckpointDir(env_, root_);
  Result<ShardEntry> a = dir_.WriteShard(30, 0, ShardBytes(30, 0));
  Result<ShardEntry> b = dir_.WriteShard(30, 1, ShardBytes(30, 1));
  ASSERT_TRUE(a.ok() && b.ok());
  // Both shards are durable, but nothing commits the step yet.
  EXPECT_EQ(dir_.LoadNewest(nullptr).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(dir_.CommitStep(30, {*a, *b}).ok());
  Result<TrainingState> s = dir_.Load(30);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->tensors.size(), 2u);
  EXPECT_EQ(s->tensors[0].name, "w0");
  EXPECT_EQ(s->tensors[1].name, "w1");
  EXPECT_EQ(s->meta["shard"], 0);  // the metadata of shard 0
  EXPECT_EQ(dir_.CommittedShards(30)->at(1).xxh3, b->xxh3);
  EXPECT_EQ(*dir_.ReadShard(30, 1), ShardBytes(30, 1));
  // A manifest that lists a shard the directory lacks is refused.
  ASSERT_TRUE(env_->RemoveFile(dir_.ShardPath(30, 1)).ok());
  EXPECT_NE(dir_.Verify(30).message().find("shard-00001.bin"), std::string::npos);
}

TEST_F(CheckpointDirTest, RetainNeverDropsTheNewestStepThatVerifies) {
  dir_ = CheckpointDir(env_, root_);
  for (int64_t s : {10, 20, 30}) ASSERT_TRUE(dir_.Commit(State(s)).ok());
  Corrupt(30, "shard-00000.bin", 30);  // the newest has a readable manifest but is bad
  ASSERT_TRUE(dir_.Retain(1).ok());
  EXPECT_EQ(dir_.ListSteps(), (std::vector<int64_t>{20, 30}));
  EXPECT_EQ(dir_.LoadNewest(nullptr)->step, 20);
}

// Forwards to the default Env; counts shard reads and fails reads of the
// paths in `eio` with an I/O error.
class ProbeEnv final : public EnvWrapper {
 public:
  ProbeEnv() : EnvWrapper(Env::Default()) {}
  Result<std::string> ReadFile(const std::string& p) override {
    if (eio.count(p)) return IOError("read " + p + ": Input/output error");
    if (p.find("shard-") != std::string::npos) ++shard_reads;
    if (p.find("MANIFEST") != std::string::npos) ++manifest_reads;
    return EnvWrapper::ReadFile(p);
  }
  std::set<std::string> eio;
  int shard_reads = 0;
  int manifest_reads = 0;
};

// Verify and Load of a step of N shards read its manifest once: they used to
// re-read it for each shard (N parses of N entries).
TEST_F(CheckpointDirTest, VerifyAndLoadReadTheManifestOnce) {
  ProbeEnv probe;
  dir_ = CheckpointDir(&probe, root_);
  constexpr int kShards = 64;
  std::vector<ShardEntry> shards;
  for (int i = 0; i < kShards; ++i) {
    Result<ShardEntry> e = dir_.WriteShard(30, i, ShardBytes(30, i));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    shards.push_back(*e);
  }
  ASSERT_TRUE(dir_.CommitStep(30, shards).ok());
  probe.manifest_reads = probe.shard_reads = 0;
  ASSERT_TRUE(dir_.Verify(30).ok());
  EXPECT_EQ(probe.manifest_reads, 1);
  EXPECT_EQ(probe.shard_reads, kShards);
  probe.manifest_reads = 0;
  Result<TrainingState> s = dir_.Load(30);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->tensors.size(), static_cast<size_t>(kShards));
  EXPECT_EQ(probe.manifest_reads, 1);
}

TEST_F(CheckpointDirTest, RetainTrustsAVerifiedStepAndReadsNoShard) {
  ProbeEnv probe;
  dir_ = CheckpointDir(&probe, root_);
  for (int64_t s : {10, 20, 30}) ASSERT_TRUE(dir_.Commit(State(s)).ok());
  ASSERT_TRUE(dir_.Retain(1, 30).ok());
  EXPECT_EQ(probe.shard_reads, 0);
  EXPECT_EQ(dir_.ListSteps(), (std::vector<int64_t>{30}));
  // Without the hint the newest step is verified, shard by shard.
  ASSERT_TRUE(dir_.Commit(State(40)).ok());
  ASSERT_TRUE(dir_.Retain(1).ok());
  EXPECT_EQ(probe.shard_reads, 1);
  EXPECT_EQ(dir_.ListSteps(), (std::vector<int64_t>{40}));
}

// A manifest that cannot be read for a moment (EIO, not "missing") may be a
// good committed step: it used to be deleted as an uncommitted leftover.
TEST_F(CheckpointDirTest, RetainKeepsAStepWhoseManifestCannotBeRead) {
  ProbeEnv probe;
  dir_ = CheckpointDir(&probe, root_);
  for (int64_t s : {10, 20, 30}) ASSERT_TRUE(dir_.Commit(State(s)).ok());
  probe.eio.insert(JoinPath(dir_.StepDir(10), "MANIFEST.json"));
  ASSERT_TRUE(dir_.Retain(1, 30).ok());
  EXPECT_EQ(dir_.ListSteps(), (std::vector<int64_t>{10, 30}));
  probe.eio.clear();
  EXPECT_TRUE(dir_.Verify(10).ok());
  // A manifest that is missing or malformed is a leftover, as before.
  ASSERT_TRUE(env_->RemoveFile(JoinPath(dir_.StepDir(10), "MANIFEST.json")).ok());
  ASSERT_TRUE(dir_.Retain(1, 30).ok());
  EXPECT_EQ(dir_.ListSteps(), (std::vector<int64_t>{30}));
}

TEST_F(CheckpointDirTest, RemoveAfterAbandonsNewerSteps) {
  dir_ = CheckpointDir(env_, root_);
  for (int64_t s : {10, 20, 30}) ASSERT_TRUE(dir_.Commit(State(s)).ok());
  EXPECT_EQ(*dir_.RemoveAfter(15), (std::vector<int64_t>{20, 30}));
  EXPECT_EQ(dir_.ListSteps(), (std::vector<int64_t>{10}));
}

}  // namespace
}  // namespace endure::checkpoint
