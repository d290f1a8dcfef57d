#include "core/crash_detector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <set>
#include <string>
#include <vector>

#include "core/cause.h"

namespace endure::core {
namespace {

using ::testing::HasSubstr;

WorkerExit Exit(int code) {
  WorkerExit e;
  e.node = NodeId{1};
  e.rank = 3;
  e.exit_code = code;
  return e;
}

WorkerExit Signaled(int sig) {
  WorkerExit e;
  e.node = NodeId{1};
  e.rank = 3;
  e.signal = sig;
  return e;
}

TEST(ClassifyWorkerExit, ExitCode) {
  auto r = ClassifyWorkerExit(Exit(1));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, CrashKind::kWorkerExit);
  EXPECT_EQ(r->cause, "worker_exit code 1");
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->node, NodeId{1});
  EXPECT_EQ(r->reason, "rank 3 on node 1 exited with code 1");
}

TEST(ClassifyWorkerExit, Signal) {
  auto r = ClassifyWorkerExit(Signaled(SIGKILL));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, CrashKind::kSignal);
  EXPECT_EQ(r->cause, "signal 9 SIGKILL");
  EXPECT_EQ(r->reason,
            "rank 3 on node 1 was killed by signal 9 SIGKILL, which the agent did not send; the "
            "kernel's OOM killer and `kill -9` send it");
}

TEST(ClassifyWorkerExit, SegfaultWithCore) {
  WorkerExit e = Signaled(SIGSEGV);
  e.core_dumped = true;
  auto r = ClassifyWorkerExit(e);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->cause, "signal 11 SIGSEGV");
  EXPECT_THAT(r->reason, HasSubstr("(core dumped)"));
  EXPECT_THAT(r->reason, HasSubstr("segmentation fault"));
}

TEST(ClassifyWorkerExit, ShellStyleSignalCodeIsExplained) {
  auto r = ClassifyWorkerExit(Exit(137));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->cause, "worker_exit code 137");
  EXPECT_THAT(r->reason, HasSubstr("how a wrapper reports signal 9 SIGKILL"));
}

TEST(ClassifyWorkerExit, ExpectedEndsAreNotFailures) {
  WorkerExit done = Exit(0);
  done.training_finished = true;
  EXPECT_FALSE(ClassifyWorkerExit(done).has_value());

  WorkerExit stopped = Signaled(SIGTERM);
  stopped.stop_requested = true;
  EXPECT_FALSE(ClassifyWorkerExit(stopped).has_value());
  WorkerExit killed_in_teardown = Signaled(SIGKILL);
  killed_in_teardown.stop_requested = true;
  EXPECT_FALSE(ClassifyWorkerExit(killed_in_teardown).has_value());
}

TEST(ClassifyWorkerExit, EarlyCleanExitIsAFailure) {
  auto r = ClassifyWorkerExit(Exit(0));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->cause, "worker_exit code 0");
  EXPECT_THAT(r->reason, HasSubstr("before training finished"));
}

TEST(ClassifyWorkerExit, UnsolicitedSigtermNamesTheScheduler) {
  auto r = ClassifyWorkerExit(Signaled(SIGTERM));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->cause, "signal 15 SIGTERM");
  EXPECT_THAT(r->reason, HasSubstr("preempting"));
}

TEST(SignalName, KnownAndUnknown) {
  EXPECT_EQ(SignalName(SIGABRT), "SIGABRT");
  EXPECT_EQ(SignalName(SIGBUS), "SIGBUS");
  EXPECT_EQ(SignalName(200), "SIG?");
}

// Every cause a worker's end gives has a metric label known in advance (the
// counter starts it at zero), and the families fold into few labels.
TEST(CauseLabel, EveryCrashCauseHasALabelKnownInAdvance) {
  const std::vector<std::string> labels = CauseLabels();
  std::set<std::string> seen;
  for (int code = 1; code < 256; ++code) {
    WorkerExit e{NodeId{0}, "node0", 1, code, std::nullopt};
    const std::optional<CrashReport> r = ClassifyWorkerExit(e);
    ASSERT_TRUE(r.has_value());
    seen.insert(CauseLabel(r->cause));
  }
  for (int signal = 1; signal < 65; ++signal) {
    WorkerExit e{NodeId{0}, "node0", 1, std::nullopt, signal};
    const std::optional<CrashReport> r = ClassifyWorkerExit(e);
    ASSERT_TRUE(r.has_value());
    seen.insert(CauseLabel(r->cause));
  }
  for (const std::string& label : seen) {
    EXPECT_NE(std::find(labels.begin(), labels.end(), label), labels.end()) << label;
  }
  EXPECT_TRUE(seen.contains("worker_exit"));
  EXPECT_TRUE(seen.contains("signal_sigkill"));
  EXPECT_TRUE(seen.contains("signal_other"));  // a real-time signal
  EXPECT_LT(seen.size(), 40u);
  EXPECT_EQ(CauseLabel("xid_79"), "xid_79");
  EXPECT_EQ(CauseLabel("xid_13"), "xid_other");
  EXPECT_EQ(CauseLabel("node_lost"), "node_lost");
  EXPECT_EQ(CauseLabel("health_check_failed: gpu burn"), "health_check_failed");
  EXPECT_EQ(CauseLabel("something nobody named"), "other");
  EXPECT_EQ(std::set<std::string>(labels.begin(), labels.end()).size(), labels.size());
}

}  // namespace
}  // namespace endure::core
