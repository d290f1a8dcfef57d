#include "agent/kernel_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace endure::agent {
namespace {

using ::testing::HasSubstr;

class KernelLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "kernel_log_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/kmsg";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Append(const std::string& text) { std::ofstream(path_, std::ios::app) << text; }

  std::string dir_, path_;
};

TEST_F(KernelLogTest, OnlyHardwareRecordsAfterTheMarkCount) {
  Append("3,100,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n");
  Result<std::unique_ptr<KernelLog>> log = KernelLog::Open(path_);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  // What was there before it opened is before any mark.
  EXPECT_EQ((*log)->After((*log)->Mark()), "");
  Append(
      "6,101,6000000,-;enb27328: port 3(v273282) entered forwarding state\n"
      "3,102,6000001,-;Out of memory: Killed process 77 (other_job)\n");
  const uint64_t mark = (*log)->Mark();
  Append(
      "4,103,7000000,-;NVRM: Xid (PCI:0000:b7:00): 48, pid=9, DBE (double bit error)\n"
      " SUBSYSTEM=pci\n"
      " DEVICE=+pci:0000:b7:00.0\n"
      "6,104,7000002,-;mlx5_core 0000:0c:00.0: mlx5_cmd_out_err:838: firmware assert");
  // The last record is not complete yet (no newline): not read.
  EXPECT_EQ((*log)->After(mark),
            "kernel: NVRM: Xid (PCI:0000:b7:00): 48, pid=9, DBE (double bit error)\n");
  Append("\n");
  const std::string after = (*log)->After(mark);
  EXPECT_THAT(after, HasSubstr("kernel: mlx5_core"));
  EXPECT_EQ((*log)->After(mark, 1),
            "kernel: mlx5_core 0000:0c:00.0: mlx5_cmd_out_err:838: "
            "firmware assert\n");
  // Another job's OOM kill and network chatter are not this node's hardware.
  EXPECT_FALSE(KernelLog::IsHardwareRecord("Out of memory: Killed process 77 (other_job)"));
  EXPECT_TRUE(KernelLog::IsHardwareRecord("pcieport 0000:00:01.0: AER: Uncorrected error"));
  EXPECT_EQ((*log)->After((*log)->Mark()), "");
}

TEST_F(KernelLogTest, AnUnreadableLogIsAnErrorNamingIt) {
  Result<std::unique_ptr<KernelLog>> log = KernelLog::Open(dir_ + "/none");
  ASSERT_FALSE(log.ok());
  EXPECT_THAT(log.status().message(), HasSubstr(dir_ + "/none"));
}

}  // namespace
}  // namespace endure::agent
