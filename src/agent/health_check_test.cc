// The node health check: every probe passes on a sound machine, each
// injected fault fails its probe only and says so, a wrong product, a
// missing or non-directory disk dir each fail with what and where, and
// ENDURE_HEALTH_FAULT is parsed strictly.
#include "agent/health_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/test_support.h"

namespace endure::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing_support::ScratchDir;

constexpr HealthProbe kProbes[] = {HealthProbe::kMatmul, HealthProbe::kMemory, HealthProbe::kDisk,
                                   HealthProbe::kLoopback};

TEST(HealthCheck, AllProbesPassOnThisMachine) {
  ScratchDir dir("health");
  HealthCheckOptions options;
  options.disk_dir = dir.path();
  const HealthReport report = RunHealthCheck(options);
  EXPECT_TRUE(report.ok) << report.summary;
  ASSERT_EQ(report.probes.size(), 4u);
  double total = 0;
  for (size_t i = 0; i < report.probes.size(); ++i) {
    EXPECT_EQ(report.probes[i].probe, kProbes[i]);
    EXPECT_TRUE(report.probes[i].ok) << report.probes[i].detail;
    EXPECT_EQ(report.probes[i].detail, "");
    EXPECT_GT(report.probes[i].seconds, 0);
    total += report.probes[i].seconds;
  }
  EXPECT_THAT(report.summary, StartsWith("matmul ok "));
  EXPECT_THAT(report.summary, HasSubstr(", memory ok "));
  EXPECT_THAT(report.summary, HasSubstr(", disk ok "));
  EXPECT_THAT(report.summary, HasSubstr(", loopback ok "));
  // Under a second on an idle machine; the bound leaves room for a loaded one.
  EXPECT_LT(total, 3.0) << report.summary;
  std::printf("health check: %s (%.0f ms)\n", report.summary.c_str(), total * 1e3);
  // The disk probe cleans up after itself.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(HealthCheck, EachInjectedFaultFailsOnlyItsProbe) {
  ScratchDir dir("health");
  for (HealthProbe injected : kProbes) {
    SCOPED_TRACE(std::string(HealthProbeName(injected)));
    HealthCheckOptions options;
    options.disk_dir = dir.path();
    options.memory_bytes = 8 << 20;
    options.fail = {injected};
    const HealthReport report = RunHealthCheck(options);
    EXPECT_FALSE(report.ok);
    ASSERT_EQ(report.probes.size(), 4u);
    for (const ProbeResult& p : report.probes) {
      if (p.probe == injected) {
        EXPECT_FALSE(p.ok);
        EXPECT_THAT(p.detail, StartsWith("injected: "));
      } else {
        EXPECT_TRUE(p.ok) << p.detail;
      }
    }
    EXPECT_THAT(report.summary,
                HasSubstr(std::string(HealthProbeName(injected)) + " FAILED: injected: "));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(HealthCheck, InjectedFaultsAreCaughtByTheProbesOwnChecks) {
  ScratchDir dir("health");
  const ProbeResult matmul = RunMatmulProbe(ReferenceMatmul, /*inject=*/true);
  EXPECT_FALSE(matmul.ok);
  EXPECT_THAT(matmul.detail, HasSubstr("1 row and 1 column checksums"));
  EXPECT_THAT(matmul.detail, HasSubstr("C[37][91] = "));

  const ProbeResult memory = RunMemoryProbe(1 << 20, /*inject=*/true);
  EXPECT_FALSE(memory.ok);
  EXPECT_THAT(memory.detail, HasSubstr("1 of 131072 words fail the address pattern"));
  EXPECT_THAT(memory.detail, HasSubstr("byte offset 524288"));

  const ProbeResult disk = RunDiskProbe(dir.path(), /*inject=*/true);
  EXPECT_FALSE(disk.ok);
  EXPECT_THAT(disk.detail, HasSubstr("read back of " + dir.path() + "/.endure-health-"));
  EXPECT_THAT(disk.detail, HasSubstr("differs: byte 12345"));

  const ProbeResult loopback = RunLoopbackProbe(/*inject=*/true);
  EXPECT_FALSE(loopback.ok);
  EXPECT_THAT(loopback.detail, HasSubstr("injected comm-fail"));
}

TEST(HealthCheck, MatmulCatchesAWrongProduct) {
  // One element off by a half: the smallest error these inputs can make.
  const ProbeResult off_by_half =
      RunMatmulProbe([](const float* a, const float* b, float* c, int n) {
        ReferenceMatmul(a, b, c, n);
        c[5 * n + 7] += 0.5f;
      });
  EXPECT_FALSE(off_by_half.ok);
  EXPECT_THAT(off_by_half.detail, HasSubstr("C[5][7] = "));
  EXPECT_THAT(off_by_half.detail, HasSubstr("the CPU's arithmetic is wrong"));

  const ProbeResult zeros = RunMatmulProbe(
      [](const float*, const float*, float* c, int n) { std::fill(c, c + n * n, 0.0f); });
  EXPECT_FALSE(zeros.ok);

  // B x A instead of A x B.
  const ProbeResult swapped = RunMatmulProbe(
      [](const float* a, const float* b, float* c, int n) { ReferenceMatmul(b, a, c, n); });
  EXPECT_FALSE(swapped.ok);

  EXPECT_TRUE(RunMatmulProbe().ok);
}

TEST(HealthCheck, MemoryProbeSizes) {
  EXPECT_TRUE(RunMemoryProbe(1 << 20).ok);
  // A size that is not a whole number of words tests the whole words.
  EXPECT_TRUE(RunMemoryProbe((1 << 20) + 3).ok);
  const ProbeResult skipped = RunMemoryProbe(0);
  EXPECT_TRUE(skipped.ok);
  EXPECT_THAT(skipped.detail, HasSubstr("skipped"));
}

TEST(HealthCheck, DiskDirThatDoesNotExistFailsNamingIt) {
  ScratchDir dir("health");
  const std::string missing = dir.Path("no-such-dir");
  HealthCheckOptions options;
  options.disk_dir = missing;
  options.memory_bytes = 1 << 20;
  const HealthReport report = RunHealthCheck(options);
  EXPECT_FALSE(report.ok);
  ASSERT_EQ(report.probes.size(), 4u);
  const ProbeResult& disk = report.probes[2];
  EXPECT_EQ(disk.probe, HealthProbe::kDisk);
  EXPECT_FALSE(disk.ok);
  EXPECT_EQ(disk.detail, "stat " + missing + ": No such file or directory");
  EXPECT_THAT(report.summary,
              HasSubstr("disk FAILED: stat " + missing + ": No such file or directory"));
  EXPECT_TRUE(report.probes[0].ok && report.probes[1].ok && report.probes[3].ok);
}

TEST(HealthCheck, DiskDirThatIsARegularFileFailsNamingIt) {
  ScratchDir dir("health");
  const std::string file = dir.Path("plain-file");
  std::ofstream(file) << "not a directory\n";
  const ProbeResult disk = RunDiskProbe(file);
  EXPECT_FALSE(disk.ok);
  EXPECT_EQ(disk.detail, file + " is not a directory");

  const ProbeResult under_file = RunDiskProbe(file + "/sub");
  EXPECT_FALSE(under_file.ok);
  EXPECT_EQ(under_file.detail, "stat " + file + "/sub: Not a directory");

  const ProbeResult none = RunDiskProbe("");
  EXPECT_FALSE(none.ok);
  EXPECT_THAT(none.detail, HasSubstr("no directory"));
}

TEST(HealthCheck, ProbeNamesRoundTrip) {
  for (HealthProbe p : kProbes) {
    Result<HealthProbe> parsed = ParseHealthProbe(HealthProbeName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
}

TEST(HealthCheck, HealthFaultForPicksTheNodesEntry) {
  EXPECT_EQ(HealthFaultFor("matmul,disk", "node1"), "matmul,disk");
  EXPECT_EQ(HealthFaultFor("node1=matmul;node2=disk,memory", "node2"), "disk,memory");
  EXPECT_EQ(HealthFaultFor("node1=matmul;node2=disk", "node1"), "matmul");
  EXPECT_EQ(HealthFaultFor("node1=matmul", "node10"), "");
  EXPECT_EQ(HealthFaultFor("node1=matmul;", "node3"), "");
}

TEST(HealthCheck, ParseHealthFault) {
  Result<std::set<HealthProbe>> none = ParseHealthFault("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_TRUE(ParseHealthFault("  ")->empty());

  Result<std::set<HealthProbe>> two = ParseHealthFault("matmul, disk");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(*two, (std::set<HealthProbe>{HealthProbe::kMatmul, HealthProbe::kDisk}));
  EXPECT_EQ(*ParseHealthFault("loopback,loopback"), std::set<HealthProbe>{HealthProbe::kLoopback});

  Result<std::set<HealthProbe>> bad = ParseHealthFault("matmul,gpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("ENDURE_HEALTH_FAULT"));
  EXPECT_THAT(bad.status().message(), HasSubstr("'gpu'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("matmul, memory, disk, loopback"));

  for (const char* text : {"matmul,", ",disk", "Matmul", "disk;memory", "matmul,,disk"}) {
    SCOPED_TRACE(text);
    Result<std::set<HealthProbe>> r = ParseHealthFault(text);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("matmul, memory, disk, loopback"));
  }
}

}  // namespace
}  // namespace endure::agent
