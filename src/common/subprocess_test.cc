#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <sstream>

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

TEST(PickFreePort, ReturnsAnUnprivilegedPort) {
  Result<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  EXPECT_GT(*port, 1024);
}

}  // namespace
}  // namespace endure
