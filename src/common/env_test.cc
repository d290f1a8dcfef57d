#include "common/env.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace endure {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/endure_env_test.XXXXXX";
  return mkdtemp(tmpl);
}

TEST(WriteFileAtomically, ReplacesWholeFileAndLeavesNoTemporary) {
  Env* env = Env::Default();
  std::string dir = TempDir();
  std::string path = JoinPath(dir, "f.json");
  ASSERT_TRUE(WriteFileAtomically(env, path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(env, path, "second").ok());
  EXPECT_EQ(*env->ReadFile(path), "second");
  EXPECT_EQ(*env->ListDir(dir), std::vector<std::string>{"f.json"});
  ASSERT_TRUE(env->RemoveAll(dir).ok());
}

TEST(WriteFileAtomically, FailsCleanlyWhenTheDirectoryIsMissing) {
  Status st = WriteFileAtomically(Env::Default(), "/nonexistent-dir/x/f", "data");
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_NE(st.message().find("/nonexistent-dir/x/f.tmp"), std::string::npos);
}

TEST(Env, ReadMissingFileIsNotFound) {
  EXPECT_EQ(Env::Default()->ReadFile("/nonexistent-file").status().code(), StatusCode::kNotFound);
}

TEST(DirName, SplitsPaths) {
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("c"), ".");
  EXPECT_EQ(DirName("/c"), "/");
}

}  // namespace
}  // namespace endure
