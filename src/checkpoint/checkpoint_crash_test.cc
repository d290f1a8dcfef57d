// Crash consistency of CheckpointDir: a power loss at every write boundary of
// a commit, and ENOSPC or EIO while committing, never lose a committed step
// and never let a half-written one be taken for committed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "checkpoint/checkpoint_dir.h"
#include "common/fault_injection_env.h"

namespace endure::checkpoint {
namespace {

TrainingState State(int64_t step) {
  TrainingState s;
  s.step = step;
  s.meta = {{"lr", 0.001}, {"step_seen", step}};
  s.tensors = {{"w", "float32", {64}, std::string(256, static_cast<char>(step))},
               {"b", "float32", {4}, std::string(16, static_cast<char>(step + 1))}};
  return s;
}

class CheckpointCrashTest : public ::testing::Test {
 protected:
  // One directory with steps 10 and 20 committed; each case works on a copy.
  void SetUp() override {
    // The durability model needs no disk: work in memory where there is a
    // tmpfs, hundreds of directories are made and removed.
    std::string tmpl = std::string(Env::Default()->Exists("/dev/shm") ? "/dev/shm" : "/tmp") +
                       "/endure_ckpt_crash_test.XXXXXX";
    base_ = mkdtemp(tmpl.data());
    golden_ = JoinPath(base_, "golden");
    ASSERT_TRUE(Env::Default()->CreateDirs(golden_).ok());
    // Through a FaultInjectionEnv only to skip real fsyncs, which are slow.
    FaultInjectionEnv env(Env::Default(), golden_);
    CheckpointDir dir(&env, golden_);
    ASSERT_TRUE(dir.Commit(State(10)).ok());
    ASSERT_TRUE(dir.Commit(State(20)).ok());
  }
  void TearDown() override { (void)Env::Default()->RemoveAll(base_); }

  // A fresh copy of the golden directory, named after `label`.
  std::string FreshCopy(const std::string& label) {
    const std::string root = JoinPath(base_, label);
    std::filesystem::copy(golden_, root, std::filesystem::copy_options::recursive);
    return root;
  }

  // What a restarted process finds in `root`, through the real Env.
  void ExpectRecovers(const std::string& root, bool step30_committed, const std::string& label) {
    SCOPED_TRACE(label);
    CheckpointDir dir(Env::Default(), root);
    std::vector<std::string> refused;
    Result<TrainingState> s = dir.LoadNewest(&refused);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    // Nothing committed is lost, and nothing else counts as committed: a
    // commit that did not return ok stopped before its last boundary, the
    // fsync of the directory that makes the manifest's rename durable, so
    // the crash undid the rename and step 20 is the newest.
    EXPECT_EQ(s->step, step30_committed ? 30 : 20);
    EXPECT_EQ(s->tensors, State(s->step).tensors);
    EXPECT_EQ(s->meta["step_seen"], s->step);
    EXPECT_TRUE(dir.Verify(20).ok());
    EXPECT_TRUE(dir.Verify(10).ok());
    // Retention after the restart keeps what was recovered.
    ASSERT_TRUE(dir.Retain(1).ok());
    EXPECT_EQ(dir.LoadNewest(nullptr)->step, s->step);
    // Training goes on: the next commit works.
    FaultInjectionEnv env(Env::Default(), root);
    ASSERT_TRUE(CheckpointDir(&env, root).Commit(State(40)).ok());
    EXPECT_EQ(dir.LoadNewest(nullptr)->step, 40);
  }

  std::string base_;
  std::string golden_;
};

// How many write boundaries committing step 30 takes, with no fault.
int64_t BoundariesOfCommit(const std::string& root) {
  FaultInjectionEnv env(Env::Default(), root);
  CheckpointDir dir(&env, root);
  EXPECT_TRUE(dir.Commit(State(30)).ok());
  return env.boundary_ops();
}

TEST_F(CheckpointCrashTest, CrashAtEveryWriteBoundaryOfACommit) {
  const int64_t total = BoundariesOfCommit(FreshCopy("count"));
  ASSERT_GE(total, 12);  // mkdir, fsync(root), 2 x (append, fsync, close, rename, fsync(dir))
  int committed = 0;
  for (int64_t n = 0; n <= total; ++n) {
    const std::string label = "crash-after-" + std::to_string(n);
    const std::string root = FreshCopy(label);
    FaultInjectionEnv env(Env::Default(), root);
    CheckpointDir dir(&env, root);
    env.CrashAfter(n);
    Result<CommitStats> commit = dir.Commit(State(30));
    EXPECT_EQ(commit.ok(), n == total) << label;
    if (!commit.ok()) {
      EXPECT_NE(commit.status().message().find("injected crash"), std::string::npos)
          << commit.status().message();
    }
    committed += commit.ok();
    ASSERT_TRUE(env.SimulateCrash().ok());
    ExpectRecovers(root, commit.ok(), label);
  }
  EXPECT_EQ(committed, 1);
}

TEST_F(CheckpointCrashTest, CrashWhileRetryingAnInterruptedCommit) {
  // The first attempt dies after its data files are durable but before the
  // manifest; the retry, which starts by removing those leftovers, dies too.
  const int64_t total = BoundariesOfCommit(FreshCopy("count"));
  // The retry has one boundary more: the removal of the leftovers.
  for (int64_t n = 0; n <= total + 1; ++n) {
    const std::string label = "retry-crash-after-" + std::to_string(n);
    const std::string root = FreshCopy(label);
    FaultInjectionEnv env(Env::Default(), root);
    CheckpointDir dir(&env, root);
    env.CrashAfter(total - 5);
    ASSERT_FALSE(dir.Commit(State(30)).ok());
    ASSERT_TRUE(env.SimulateCrash().ok());
    ASSERT_EQ(dir.ListSteps(), (std::vector<int64_t>{10, 20, 30}));  // leftovers of 30
    env.CrashAfter(n);
    Result<CommitStats> commit = dir.Commit(State(30));
    EXPECT_EQ(commit.ok(), n == total + 1) << label;
    ASSERT_TRUE(env.SimulateCrash().ok());
    ExpectRecovers(root, commit.ok(), label);
  }
}

struct ErrorCase {
  std::string label;
  InjectedError error;
  std::string message;
};

std::vector<ErrorCase> ErrorCases() {
  return {{"enospc", InjectedError::kNoSpace, "No space left on device"},
          {"eio", InjectedError::kIO, "Input/output error"}};
}

// After a failed commit of step 30: step 20 is what loads, in this process
// and after a crash, and Retain keeps it.
void ExpectFailedCommitLeavesStep20(FaultInjectionEnv* env, const std::string& root,
                                    const Status& commit, const std::string& message) {
  EXPECT_EQ(commit.code(), StatusCode::kIOError);
  EXPECT_NE(commit.message().find(message), std::string::npos) << commit.message();
  env->ClearFaults();
  CheckpointDir dir(env, root);
  Result<TrainingState> s = dir.LoadNewest(nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->step, 20);
  ASSERT_TRUE(dir.Retain(1).ok());
  ASSERT_TRUE(env->SimulateCrash().ok());
  CheckpointDir after(Env::Default(), root);
  s = after.LoadNewest(nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->step, 20);
  EXPECT_EQ(s->tensors, State(20).tensors);
}

TEST_F(CheckpointCrashTest, NoSpaceOrIOErrorOnEveryAppendAndFsync) {
  for (const ErrorCase& c : ErrorCases()) {
    for (bool on_sync : {false, true}) {
      // Fail the 1st, 2nd, ... append (or fsync) until the commit no longer
      // reaches the one that fails.
      int64_t failing = 0;
      for (int64_t nth = 1;; ++nth) {
        const std::string label =
            c.label + (on_sync ? "-fsync-" : "-append-") + std::to_string(nth);
        SCOPED_TRACE(label);
        const std::string root = FreshCopy(label);
        FaultInjectionEnv env(Env::Default(), root);
        if (on_sync) {
          env.FailNthSync(nth, c.error);
        } else {
          env.FailNthAppend(nth, c.error);
        }
        CheckpointDir dir(&env, root);
        Result<CommitStats> commit = dir.Commit(State(30));
        if (commit.ok()) break;
        ++failing;
        ExpectFailedCommitLeavesStep20(&env, root, commit.status(), c.message);
      }
      // Two files (the shard, the manifest): 2 appends; 5 fsyncs: the root
      // after mkdir, then each file and its directory.
      EXPECT_EQ(failing, on_sync ? 5 : 2) << c.label;
    }
  }
}

TEST_F(CheckpointCrashTest, NoSpaceOrIOErrorOnEveryWriteUnderTheStep) {
  for (const ErrorCase& c : ErrorCases()) {
    SCOPED_TRACE(c.label);
    const std::string root = FreshCopy(c.label);
    FaultInjectionEnv env(Env::Default(), root);
    CheckpointDir dir(&env, root);
    env.FailWritesUnder(dir.StepDir(30), c.error);
    Result<CommitStats> commit = dir.Commit(State(30));
    ASSERT_FALSE(commit.ok());
    ExpectFailedCommitLeavesStep20(&env, root, commit.status(), c.message);
  }
}

TEST_F(CheckpointCrashTest, RetainKeepsTheLastCommitWhenTheManifestFsyncFailed) {
  // The manifest of step 30 is renamed into place, but the fsync of its
  // directory fails (EIO): a crash may still drop it. Retain(1) must not
  // delete step 20 for it, even once the next commit syncs the root.
  const std::string root = FreshCopy("manifest-fsync");
  FaultInjectionEnv env(Env::Default(), root);
  CheckpointDir dir(&env, root);
  env.FailNthSync(5, InjectedError::kIO);  // the last fsync of the commit
  Result<CommitStats> commit = dir.Commit(State(30));
  ASSERT_FALSE(commit.ok());
  EXPECT_NE(commit.status().message().find("fsync directory"), std::string::npos)
      << commit.status().message();
  ASSERT_TRUE(dir.Retain(1).ok());
  env.CrashAfter(2);  // step 40: mkdir and fsync(root), then power loss
  ASSERT_FALSE(dir.Commit(State(40)).ok());
  ASSERT_TRUE(env.SimulateCrash().ok());
  Result<TrainingState> s = CheckpointDir(Env::Default(), root).LoadNewest(nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->step, 20);
}

}  // namespace
}  // namespace endure::checkpoint
