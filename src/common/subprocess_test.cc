#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

namespace endure {
namespace {

TEST(Subprocess, ReportsExitCodeAndCapturesOutputWithEnv) {
  std::string out = "/tmp/endure_subprocess_test." + std::to_string(getpid());
  auto p = Subprocess::Start({.argv = {"/bin/sh", "-c", "echo $ENDURE_X; exit 7"},
                              .env = {{"ENDURE_X", "hello"}},
                              .output_path = out});
  ASSERT_TRUE(p.ok());
  ExitStatus s = p->Wait();
  EXPECT_TRUE(s.exited);
  EXPECT_EQ(s.code, 7);
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), "hello\n");
  std::remove(out.c_str());
}

TEST(Subprocess, ReportsSignalAndTimesOut) {
  auto p = Subprocess::Start({.argv = {"/bin/sleep", "30"}});
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->WaitFor(std::chrono::milliseconds(50)).has_value());
  p->Signal(SIGKILL);
  ExitStatus s = p->Wait();
  EXPECT_FALSE(s.exited);
  EXPECT_EQ(s.signal, SIGKILL);
  EXPECT_EQ(s.ToString().rfind("signal 9", 0), 0u);
}

// Whether `pid` runs (a zombie does not).
bool Alive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

TEST(ProcessTree, FindsAndKillsADescendantThatLeftTheSession) {
  const std::string dir = "/tmp/endure_tree_test." + std::to_string(getpid());
  const std::string pid_file = dir + ".pid";
  const std::string tag = std::to_string(getpid()) + "-tree";
  // `setsid` makes the sleep a session (and group) of its own: a signal to
  // the program's group, as before, never reached it.
  auto p = Subprocess::Start(
      {.argv = {"/bin/sh", "-c", "setsid sleep 1000 & echo $! > " + pid_file + "; wait"},
       .env = {{"ENDURE_TEST_TREE", tag}},
       .new_session = true});
  ASSERT_TRUE(p.ok());
  pid_t sleeper = 0;
  for (int i = 0; i < 500 && sleeper == 0; ++i) {
    std::ifstream(pid_file) >> sleeper;
    if (sleeper == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(sleeper, 0);
  std::remove(pid_file.c_str());
  // The program leads its own session and group.
  EXPECT_EQ(getsid(p->pid()), p->pid());
  EXPECT_EQ(getpgid(p->pid()), p->pid());
  for (int i = 0; i < 500 && getsid(sleeper) != sleeper; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // setsid(1) has not run yet
  }
  EXPECT_EQ(getsid(sleeper), sleeper);

  const ProcessTree tree{p->pid(), "ENDURE_TEST_TREE=" + tag};
  std::vector<pid_t> members = tree.Members();
  EXPECT_NE(std::find(members.begin(), members.end(), p->pid()), members.end());
  EXPECT_NE(std::find(members.begin(), members.end(), sleeper), members.end());
  // Without the marker only the session is found.
  members = ProcessTree{p->pid(), ""}.Members();
  EXPECT_EQ(std::find(members.begin(), members.end(), sleeper), members.end());

  EXPECT_GE(tree.Signal(SIGKILL), 2);
  ExitStatus s = p->Wait();
  EXPECT_EQ(s.signal, SIGKILL);
  for (int i = 0; i < 500 && Alive(sleeper); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(Alive(sleeper));
  EXPECT_TRUE(tree.Members().empty());
}

TEST(PickFreePort, ReturnsAnUnprivilegedPort) {
  Result<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  EXPECT_GT(*port, 1024);
}

}  // namespace
}  // namespace endure
