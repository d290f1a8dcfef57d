// Stack capture with real processes and stand-in tools (shell scripts in
// gdb's and py-spy's places): every rank is read at once under one deadline,
// what misses it is said, a stopped interpreter is read from outside, and a
// tool that fails hands over to the next. With a real py-spy (the torch
// virtualenv's, or $ENDURE_PY_SPY) a stopped Python program's frames are read.
#include "agent/stack_capture.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/subprocess.h"

namespace endure::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

class StackCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_stack_capture_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (Subprocess& p : procs_) {
      p.Signal(SIGKILL);
      p.Wait();
    }
    fs::remove_all(dir_);
  }

  // A shell script standing in for a tool.
  std::string Tool(const std::string& name, const std::string& body) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
    fs::permissions(p, fs::perms::owner_all);
    return p.string();
  }

  // A process to capture, already SIGSTOPped when `stopped`.
  pid_t Start(const std::vector<std::string>& argv, bool stopped = false) {
    Result<Subprocess> p = Subprocess::Start({.argv = argv});
    EXPECT_TRUE(p.ok()) << p.status().message();
    const pid_t pid = p->pid();
    procs_.push_back(std::move(*p));
    if (stopped) {
      ::kill(pid, SIGSTOP);
      WaitForState(pid, 'T');
    }
    return pid;
  }

  // A Python interpreter inside `stuck_here` (the marker file says it got there).
  pid_t StartPython(bool stopped) {
    const fs::path marker = dir_ / ("in-" + std::to_string(procs_.size()));
    const std::string program =
        "import time\n"
        "def stuck_here():\n"
        "    open('" +
        marker.string() +
        "', 'w').close()\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
        "stuck_here()\n";
    const pid_t pid = Start({"/usr/bin/python3", "-c", program});
    while (!fs::exists(marker)) std::this_thread::sleep_for(10ms);
    if (stopped) {
      ::kill(pid, SIGSTOP);
      WaitForState(pid, 'T');
    }
    return pid;
  }

  static void WaitForState(pid_t pid, char want) {
    for (;;) {
      std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
      std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const size_t paren = stat.rfind(')');
      if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == want) return;
      std::this_thread::sleep_for(5ms);
    }
  }

  fs::path dir_;
  std::vector<Subprocess> procs_;
};

// Eight ranks whose tool never answers: all of them are given up together
// at the one deadline (read one after another, they would take 8 x 2 s),
// each saying what it missed, and no tool is left running.
TEST_F(StackCaptureTest, EveryRankIsReadAtOnceAndWhatMissesTheDeadlineIsSaid) {
  const fs::path started = dir_ / "tools-started";
  StackTools tools;
  tools.gdb = Tool("gdb", "echo $$ >> " + started.string() + "; exec sleep 1000");
  std::vector<StackTarget> targets;
  for (int rank = 0; rank < 8; ++rank) {
    targets.push_back({rank, Start({"/bin/sleep", "1000"}, /*stopped=*/rank % 2 == 1)});
  }
  const Clock::time_point t0 = Clock::now();
  const std::map<int, std::string> stacks = CaptureStacks(targets, 2000ms, tools);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(took, 10.0);  // one deadline; sequential reads take 16 s at least
  ASSERT_EQ(stacks.size(), 8u);
  for (const auto& [rank, text] : stacks) {
    EXPECT_NE(text.find("not captured: gdb gave no stacks within the 2000 ms stack deadline"),
              std::string::npos)
        << rank << ": " << text;
  }
  std::ifstream pids(started);
  int tool_pid = 0, count = 0;
  while (pids >> tool_pid) {
    ++count;
    EXPECT_NE(::kill(tool_pid, 0), 0) << "tool " << tool_pid << " still runs";
  }
  EXPECT_EQ(count, 8);
}

// gdb's frames without its chatter, the main thread (Thread 1) first.
TEST_F(StackCaptureTest, GdbsFramesAreTheStacksMainThreadFirst) {
  StackTools tools;
  tools.gdb = Tool("gdb",
                   "echo 'Reading symbols from /usr/bin/sleep...'\n"
                   "echo 'Thread 2 (LWP 12):'\necho '#0  poll () at poll.c:1'\n"
                   "echo 'Thread 1 (LWP 11):'\necho '#0  nanosleep () at sleep.c:1'\n"
                   "echo '#1  main ()'");
  const pid_t pid = Start({"/bin/sleep", "1000"});
  const std::map<int, std::string> stacks = CaptureStacks({{3, pid}}, 5000ms, tools);
  EXPECT_EQ(stacks.at(3),
            "Thread 1 (LWP 11):\n#0  nanosleep () at sleep.c:1\n#1  main ()\n"
            "Thread 2 (LWP 12):\n#0  poll () at poll.c:1\n");
}

// A stopped interpreter cannot answer its signal: it is read from outside
// at once, by py-spy where there is one, and the text says why. A py-spy
// that fails hands over to gdb, saying so.
TEST_F(StackCaptureTest, AStoppedInterpreterIsReadFromOutsideAndAFailedToolHandsOver) {
  const pid_t pid = StartPython(/*stopped=*/true);
  const fs::path self = dir_ / "rank0.stacks";
  std::ofstream(self).close();
  StackTools tools;
  tools.gdb = Tool("gdb", "echo 'Thread 1 (LWP 1):'; echo '#0  select ()'");
  tools.py_spy =
      Tool("py-spy", "echo 'Thread 1 (idle): \"MainThread\"'; echo '    stuck_here (<string>:5)'");
  std::map<int, std::string> stacks =
      CaptureStacks({{0, pid, self.string(), SIGUSR2}}, 5000ms, tools);
  EXPECT_EQ(stacks.at(0),
            "The process is stopped (SIGSTOP) and cannot dump its own stacks; read from outside.\n"
            "Python stacks (py-spy, read from outside):\n"
            "Thread 1 (idle): \"MainThread\"\n    stuck_here (<string>:5)\n");

  tools.py_spy = Tool("py-spy-broken", "echo 'Permission Denied' >&2; exit 1");
  stacks = CaptureStacks({{0, pid}}, 5000ms, tools);
  EXPECT_EQ(stacks.at(0),
            "Python frames unavailable: the program does not use the endure Python client "
            "(endure.Session.from_env() registers a stack dump on a signal); read from outside.\n"
            "py-spy failed (exit code 1): Permission Denied\n"
            "Thread 1 (LWP 1):\n#0  select ()\n");
}

// The real py-spy reads a stopped interpreter's Python frames without
// continuing it. Skipped where py-spy is not installed.
TEST_F(StackCaptureTest, RealPySpyReadsAStoppedInterpretersFrames) {
  std::string py_spy;
  if (const char* env = std::getenv("ENDURE_PY_SPY")) py_spy = env;
  if (py_spy.empty() && std::getenv("HOME") != nullptr) {
    py_spy = std::string(std::getenv("HOME")) + "/.cache/endure/torch-venv/bin/py-spy";
  }
  if (!fs::exists(py_spy)) GTEST_SKIP() << "no py-spy (scripts/torch-venv installs one)";
  const pid_t pid = StartPython(/*stopped=*/true);
  StackTools tools;
  tools.py_spy = py_spy;
  const std::map<int, std::string> stacks = CaptureStacks({{0, pid}}, 10000ms, tools);
  const std::string& text = stacks.at(0);
  EXPECT_NE(text.find("Python stacks (py-spy, read from outside):"), std::string::npos) << text;
  EXPECT_NE(text.find("stuck_here"), std::string::npos) << text;
  WaitForState(pid, 'T');  // still stopped
}

}  // namespace
}  // namespace endure::agent
