// WorkerSet with real (shell) workers: an exit is reported even when a
// descendant keeps the output pipe open, a stop ends everything the worker
// started within its grace, and the last words kept are bounded.
#include "agent/worker_set.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/subprocess.h"
#include "contract/worker_contract.h"

namespace endure::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// Collects the exits a WorkerSet reports.
class Exits {
 public:
  std::function<void(const WorkerEnd&)> Observer() {
    return [this](const WorkerEnd& end) {
      std::lock_guard<std::mutex> lock(mu_);
      ends_.push_back(end);
      cv_.notify_all();
    };
  }
  // Waits up to `timeout` for `n` exits.
  bool WaitFor(size_t n, Clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return ends_.size() >= n; });
  }
  WorkerEnd At(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return ends_.at(i);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<WorkerEnd> ends_;
};

// The pids of live processes whose environment holds `entry`.
std::vector<pid_t> Holding(const std::string& entry) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] == 'Z') continue;
    std::ifstream env(e.path() / "environ");
    std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    const std::string nul(1, '\0');
    if ((nul + all).find(nul + entry + nul) != std::string::npos) {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

class WorkerSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_worker_set_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
    marker_ = "ENDURE_TEST_MARK=" + dir_.filename().string();
  }
  void TearDown() override {
    // Whatever a failed test left behind.
    for (pid_t pid : Holding(marker_)) ::kill(pid, SIGKILL);
    fs::remove_all(dir_);
  }

  WorkerSpec Spec(int rank, const std::string& script) {
    WorkerSpec spec;
    spec.rank = rank;
    spec.argv = {"/bin/sh", "-c", script};
    spec.env = {{"ENDURE_TEST_MARK", dir_.filename().string()}};
    spec.log_path = (dir_ / ("rank" + std::to_string(rank) + ".log")).string();
    return spec;
  }

  // Waits up to 5 s for every process marked by this test to be gone.
  bool AllGone() {
    for (int i = 0; i < 500; ++i) {
      if (Holding(marker_).empty()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  fs::path dir_;
  std::string marker_;
};

TEST_F(WorkerSetTest, AnExitIsReportedWhileADescendantKeepsTheOutputOpen) {
  // The sleep leaves the worker's session and group (setsid) and holds the
  // pipe; before, the watcher read to the end of the output first and never
  // reported the exit.
  Exits exits;
  WorkerSet set(exits.Observer());
  ASSERT_TRUE(
      set.Start(Spec(0, "setsid sleep 1000 & echo 'last words'; sleep 0.2; kill -9 $$")).ok());
  const auto start = Clock::now();
  ASSERT_TRUE(exits.WaitFor(1, 10s)) << "the exit was never reported";
  EXPECT_LT(Clock::now() - start, 0.2s + kDrainAfterExit + 2s);
  const WorkerEnd end = exits.At(0);
  EXPECT_FALSE(end.status.exited);
  EXPECT_EQ(end.status.signal, SIGKILL);
  EXPECT_NE(end.tail.find("last words"), std::string::npos) << end.tail;
  EXPECT_FALSE(end.stopped) << "it died on its own";
  // Its descendant went with it.
  EXPECT_TRUE(AllGone());
  set.StopAll(0ms);
}

TEST_F(WorkerSetTest, AStopEndsTheWholeTreeWithinTheGrace) {
  // Both the worker and a setsid descendant ignore SIGTERM: SIGKILL after
  // the grace ends both; the stop returns within grace + drain.
  Exits exits;
  WorkerSet set(exits.Observer());
  ASSERT_TRUE(set.Start(Spec(1,
                             "trap '' TERM; setsid sh -c \"trap '' TERM; sleep 1000\" & "
                             "echo started; while :; do sleep 0.05; done"))
                  .ok());
  for (int i = 0; i < 500 && Holding(marker_).size() < 3; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_GE(Holding(marker_).size(), 3u);  // the worker, the setsid shell, the sleep
  const auto start = Clock::now();
  set.StopAll(300ms);
  EXPECT_LT(Clock::now() - start, 300ms + kDrainAfterExit + 2s);
  ASSERT_TRUE(exits.WaitFor(1, 0s));
  EXPECT_EQ(exits.At(0).status.signal, SIGKILL);
  EXPECT_TRUE(exits.At(0).stopped) << "the set's own stop";
  EXPECT_TRUE(AllGone());
}

TEST_F(WorkerSetTest, AGracefulWorkerEndsOnSigtermAlone) {
  Exits exits;
  WorkerSet set(exits.Observer());
  ASSERT_TRUE(
      set.Start(Spec(0, "trap 'echo bye; exit 0' TERM; while :; do sleep 0.05; done")).ok());
  std::this_thread::sleep_for(200ms);
  const auto start = Clock::now();
  set.StopAll(5s);
  EXPECT_LT(Clock::now() - start, 3s);
  ASSERT_TRUE(exits.WaitFor(1, 0s));
  EXPECT_TRUE(exits.At(0).status.Success()) << exits.At(0).status.ToString();
  EXPECT_NE(exits.At(0).tail.find("bye"), std::string::npos);
}

// A stopped worker (SIGSTOP: a wedged process, an injected hang) is
// continued after its SIGTERM and ends on it, instead of sitting out the
// whole grace until the SIGKILL.
TEST_F(WorkerSetTest, AStoppedWorkerEndsOnSigtermWithoutWaitingForTheGrace) {
  Exits exits;
  WorkerSet set(exits.Observer());
  ASSERT_TRUE(set.Start(Spec(0, "echo started; kill -STOP $$; while :; do sleep 0.05; done")).ok());
  for (int i = 0; i < 500 && set.Pids().empty(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(set.Pids().size(), 1u);
  const pid_t pid = set.Pids().begin()->second;
  for (int i = 0; i < 500; ++i) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (stat.find(") T ") != std::string::npos) break;
    std::this_thread::sleep_for(10ms);
  }
  const auto start = Clock::now();
  set.StopAll(60s);
  EXPECT_LT(Clock::now() - start, 30s);  // the grace is 60 s
  ASSERT_TRUE(exits.WaitFor(1, 0s));
  EXPECT_EQ(exits.At(0).status.signal, SIGTERM) << exits.At(0).status.ToString();
  EXPECT_TRUE(AllGone());
}

TEST_F(WorkerSetTest, TheLastWordsKeptAreBounded) {
  // 200 lines of 8 KiB and one endless line: the tail keeps the newest
  // lines within kTailLines and kTailBytes.
  Exits exits;
  WorkerSet set(exits.Observer());
  ASSERT_TRUE(set.Start(Spec(0,
                             "i=0; while [ $i -lt 200 ]; do head -c 8192 /dev/zero | tr '\\0' x; "
                             "echo; i=$((i+1)); done; head -c 300000 /dev/zero | tr '\\0' y; "
                             "exit 3"))
                  .ok());
  ASSERT_TRUE(exits.WaitFor(1, 30s));
  const WorkerEnd end = exits.At(0);
  EXPECT_EQ(end.status.code, 3);
  EXPECT_LE(end.tail.size(), kTailBytes + kTailLines + 64 * 1024);
  EXPECT_EQ(end.tail.back(), '\n');
  EXPECT_NE(end.tail.find("yyyy"), std::string::npos);  // the unterminated line, cut
}

// The regression behind a SIGKILL classified as a Gloo failure: a worker
// that rejoined a later generation still had its earlier "collective failed
// (Connection closed by peer)" lines in its last words. A rejoin forgets
// them, and the worker's exit goes up under its new rank.
TEST_F(WorkerSetTest, ARejoinedWorkersLastWordsAreOnlyItsNewGenerations) {
  Exits exits;
  std::atomic<int> lines{0};
  WorkerSet set(exits.Observer(), [&](int, std::string_view) { ++lines; });
  const fs::path go = dir_ / "go";
  ASSERT_TRUE(set.Start(Spec(1,
                             "echo 'collective failed: Connection closed by peer'; "
                             "while [ ! -e " +
                                 go.string() +
                                 " ]; do sleep 0.01; done; "
                                 "echo 'generation 2 line'; exit 4"))
                  .ok());
  for (int i = 0; i < 3000 && lines == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(lines, 1);  // its first line is in its last words
  EXPECT_TRUE(set.Rejoin(1, 0));
  EXPECT_FALSE(set.Rejoin(1, 0));  // no worker of rank 1 now
  EXPECT_EQ(set.Pids().count(0), 1u);
  std::ofstream(go.string()) << "";
  ASSERT_TRUE(exits.WaitFor(1, 30s));
  const WorkerEnd end = exits.At(0);
  EXPECT_EQ(end.rank, 0);
  EXPECT_EQ(end.status.code, 4);
  EXPECT_EQ(end.tail, "generation 2 line\n");
}

TEST_F(WorkerSetTest, AWorkerDoesNotSeeTheVariablesItMustNot) {
  ::setenv("ENDURE_TEST_SECRET", "the-job-token", 1);
  Exits exits;
  WorkerSet set(exits.Observer());
  WorkerSpec spec = Spec(0, "tr '\\0' '\\n' < /proc/$$/environ | grep -e ENDURE_ -e token");
  spec.env.emplace_back("ENDURE_TOKEN", "generation-credential");
  spec.unset_env = {"ENDURE_TEST_SECRET", "ENDURE_TOKEN"};
  ASSERT_TRUE(set.Start(spec).ok());
  ASSERT_TRUE(exits.WaitFor(1, 10s));
  ::unsetenv("ENDURE_TEST_SECRET");
  const std::string env = exits.At(0).tail;
  EXPECT_EQ(env.find("the-job-token"), std::string::npos) << env;
  EXPECT_NE(env.find("ENDURE_TOKEN=generation-credential"), std::string::npos) << env;
  EXPECT_NE(env.find(std::string(worker_env::kWorkerTag) + "="), std::string::npos) << env;
}

}  // namespace
}  // namespace endure::agent
