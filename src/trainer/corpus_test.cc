#include "trainer/corpus.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace endure::trainer {
namespace {

namespace fs = std::filesystem;

class CorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_corpus_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& bytes) {
    fs::create_directories(fs::path(dir_ / name).parent_path());
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  fs::path dir_;
};

TEST_F(CorpusTest, WalksDirectoriesSkipsBinaryAndDuplicateLinks) {
  Write("a.txt", std::string(300 * 1024, 'a'));
  Write("sub/b.txt", std::string(100 * 1024, 'b'));
  Write("a.dat", std::string("\0\1\2", 3) + std::string(5000, 'x'));
  fs::create_symlink(dir_ / "a.txt", dir_ / "a.u8");
  Result<Corpus> c = LoadCorpus({dir_.string()}, 0.05);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->files, 2);
  EXPECT_EQ(c->train.size() + c->val.size(), 400u * 1024);
  EXPECT_EQ(c->val.size(), 5u * 4096);  // every 20th of 100 blocks
  EXPECT_EQ(c->val.find('x'), std::string::npos);
}

TEST_F(CorpusTest, MissingOrTooSmallDataNamesThePath) {
  Result<Corpus> missing = LoadCorpus({(dir_ / "nope").string()}, 0.05);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  Write("tiny.txt", "hello");
  Result<Corpus> tiny = LoadCorpus({dir_.string()}, 0.05);
  EXPECT_EQ(tiny.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tiny.status().message().find("found 5 bytes"), std::string::npos);
}

TEST(SequenceOffsets, GlobalBatchIsIndependentOfTheSplit) {
  std::vector<int64_t> whole = SequenceOffsets(7, 42, 0, 32, 128, 100000);
  std::vector<int64_t> rank0 = SequenceOffsets(7, 42, 0, 16, 128, 100000);
  std::vector<int64_t> rank1 = SequenceOffsets(7, 42, 16, 16, 128, 100000);
  rank0.insert(rank0.end(), rank1.begin(), rank1.end());
  EXPECT_EQ(whole, rank0);
  for (int64_t o : whole) EXPECT_LE(o + 129, 100000);
  EXPECT_NE(whole, SequenceOffsets(7, 43, 0, 32, 128, 100000));
  EXPECT_NE(whole, SequenceOffsets(8, 42, 0, 32, 128, 100000));
}

}  // namespace
}  // namespace endure::trainer
