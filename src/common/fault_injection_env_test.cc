#include "common/fault_injection_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace endure {
namespace {

class FaultInjectionEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_fault_env_test.XXXXXX";
    root_ = mkdtemp(tmpl);
    ASSERT_TRUE(Env::Default()->CreateDirs(Path("sub")).ok());
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), Path("old"), "old contents").ok());
    env_ = std::make_unique<FaultInjectionEnv>(Env::Default(), root_);
  }
  void TearDown() override { (void)Env::Default()->RemoveAll(root_); }

  std::string Path(const std::string& name) { return JoinPath(root_, name); }

  // Creates `name` with `data`, Sync()ed when `sync`, and closes it.
  void Write(const std::string& name, const std::string& data, bool sync) {
    auto file = env_->NewWritableFile(Path(name));
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    ASSERT_TRUE((*file)->Append(data).ok());
    if (sync) ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }

  std::string Read(const std::string& name) {
    Result<std::string> data = Env::Default()->ReadFile(Path(name));
    return data.ok() ? *data : "<" + data.status().ToString() + ">";
  }

  std::string root_;
  std::unique_ptr<FaultInjectionEnv> env_;
};

TEST_F(FaultInjectionEnvTest, UnsyncedDataIsDroppedOnCrash) {
  auto file = env_->NewWritableFile(Path("log"));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("durable ").ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Append("lost").ok());
  ASSERT_TRUE(env_->SyncDir(root_).ok());
  EXPECT_EQ(Read("log"), "durable lost");
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(Read("log"), "durable ");
  // A file opened before the crash is dead.
  EXPECT_FALSE((*file)->Append("x").ok());
}

TEST_F(FaultInjectionEnvTest, FileWhoseEntryWasNeverSyncedDisappears) {
  Write("synced-data-only", "data", /*sync=*/true);
  Write("sub/entry-only", "data", /*sync=*/false);
  ASSERT_TRUE(env_->SyncDir(Path("sub")).ok());
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_FALSE(Env::Default()->Exists(Path("synced-data-only")));
  EXPECT_EQ(Read("sub/entry-only"), "");  // the name survived, its data did not
}

TEST_F(FaultInjectionEnvTest, RenameNotFollowedBySyncDirIsUndone) {
  Write("old.tmp", "new contents", /*sync=*/true);
  ASSERT_TRUE(env_->RenameFile(Path("old.tmp"), Path("old")).ok());
  EXPECT_EQ(Read("old"), "new contents");
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(Read("old"), "old contents");
  EXPECT_FALSE(Env::Default()->Exists(Path("old.tmp")));  // it was never made durable either
}

TEST_F(FaultInjectionEnvTest, SyncedAndDirSyncedDataSurvives) {
  ASSERT_TRUE(WriteFileAtomically(env_.get(), Path("old"), "new contents").ok());
  ASSERT_TRUE(env_->CreateDirs(Path("dir")).ok());
  ASSERT_TRUE(env_->SyncDir(root_).ok());
  ASSERT_TRUE(WriteFileAtomically(env_.get(), Path("dir/f"), "f contents").ok());
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(Read("old"), "new contents");
  EXPECT_EQ(Read("dir/f"), "f contents");
  EXPECT_EQ(*Env::Default()->ListDir(root_), (std::vector<std::string>{"dir", "old", "sub"}));
}

TEST_F(FaultInjectionEnvTest, RemovalNotFollowedBySyncDirIsUndone) {
  ASSERT_TRUE(env_->RemoveFile(Path("old")).ok());
  ASSERT_TRUE(env_->RemoveAll(Path("sub")).ok());
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(Read("old"), "old contents");
  EXPECT_TRUE(Env::Default()->Exists(Path("sub")));
  ASSERT_TRUE(env_->RemoveFile(Path("old")).ok());
  ASSERT_TRUE(env_->SyncDir(root_).ok());
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_FALSE(Env::Default()->Exists(Path("old")));
}

TEST_F(FaultInjectionEnvTest, CrashAfterNthBoundaryFailsEverythingAfter) {
  ASSERT_TRUE(WriteFileAtomically(env_.get(), Path("a"), "a").ok());
  const int64_t ops = env_->boundary_ops();
  EXPECT_EQ(ops, 5);  // Append, Sync, Close, RenameFile, SyncDir
  env_->CrashAfter(2);
  auto file = env_->NewWritableFile(Path("b"));
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->Append("b").ok());
  EXPECT_TRUE((*file)->Sync().ok());
  Status st = (*file)->Close();
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_NE(st.message().find("injected crash"), std::string::npos) << st.message();
  EXPECT_FALSE(env_->SyncDir(root_).ok());
  EXPECT_FALSE(env_->ReadFile(Path("a")).ok());
  EXPECT_FALSE(env_->NewWritableFile(Path("c")).ok());
  EXPECT_EQ(env_->boundary_ops(), ops + 2);
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(Read("a"), "a");
  EXPECT_FALSE(Env::Default()->Exists(Path("b")));
  // After the "reboot" the Env works again.
  EXPECT_EQ(env_->boundary_ops(), 0);
  ASSERT_TRUE(WriteFileAtomically(env_.get(), Path("b"), "b").ok());
}

TEST_F(FaultInjectionEnvTest, InjectedNoSpaceAndIOErrors) {
  env_->FailNthAppend(2, InjectedError::kNoSpace);
  ASSERT_TRUE(WriteFileAtomically(env_.get(), Path("a"), "a").ok());
  Status st = WriteFileAtomically(env_.get(), Path("b"), "bbbb");
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.message();
  EXPECT_FALSE(Env::Default()->Exists(Path("b.tmp")));  // cleaned up

  env_->FailNthSync(1, InjectedError::kIO);
  st = WriteFileAtomically(env_.get(), Path("c"), "c");
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.message();
  EXPECT_TRUE(WriteFileAtomically(env_.get(), Path("c"), "c").ok());  // only the first

  env_->FailWritesUnder(Path("sub"), InjectedError::kIO);
  st = WriteFileAtomically(env_.get(), Path("sub/x"), "x");
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.message();
  EXPECT_FALSE(env_->CreateDirs(Path("sub/y")).ok());
  EXPECT_TRUE(WriteFileAtomically(env_.get(), Path("d"), "d").ok());  // outside the prefix
  env_->ClearFaults();
  EXPECT_TRUE(WriteFileAtomically(env_.get(), Path("sub/x"), "x").ok());
}

TEST_F(FaultInjectionEnvTest, PathsOutsideTheRootPassThrough) {
  char tmpl[] = "/tmp/endure_fault_env_other.XXXXXX";
  const std::string other = mkdtemp(tmpl);
  ASSERT_TRUE(WriteFileAtomically(env_.get(), JoinPath(other, "f"), "f").ok());
  EXPECT_EQ(env_->boundary_ops(), 0);
  ASSERT_TRUE(env_->SimulateCrash().ok());
  EXPECT_EQ(*Env::Default()->ReadFile(JoinPath(other, "f")), "f");
  ASSERT_TRUE(Env::Default()->RemoveAll(other).ok());
}

}  // namespace
}  // namespace endure
