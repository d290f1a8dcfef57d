// Runs the built `endure` binary: exit codes and messages of `endure sim`
// and `endure certs`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/subprocess.h"
#include "common/tls.h"
#include "tests/support/test_support.h"

namespace endure {
namespace {

using testing::HasSubstr;

using Outcome = testing_support::CommandOutcome;

Outcome RunEndure(std::vector<std::string> args) {
  args.insert(args.begin(), ENDURE_BIN);
  return testing_support::RunCommand(args);
}

TEST(EndureSimCli, InvalidParametersExitTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"--restart=-5m"}, "--restart: invalid duration '-5m': durations cannot be negative"},
      {{"--nodes", "0"}, "--nodes: must be at least 1, got 0"},
      {{"--ckpt-interval", "5s", "--ckpt-write", "10s"},
       "--ckpt-interval: 5.0s is shorter than the checkpoint write cost (--ckpt-write 10.0s)"},
      {{"--cause-mix", "llama4"}, "--cause-mix: unknown cause mix 'llama4'"},
      {{"--cause-mix", "llama3", "--path", "gremlins=evict"}, "--path: unknown cause 'gremlins'"},
      {{"--duration", "90"}, "--duration: invalid duration '90'"},
      {{"--sweep", "colour=1:2:3"}, "--sweep: cannot sweep 'colour'"},
      {{"--scenario", "/nonexistent/job.toml"}, "--scenario: cannot read"},
      {{"--no-such-flag"}, "--no-such-flag"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"sim", "--runs", "1", "--duration", "1d"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Outcome o = RunEndure(args);
    EXPECT_EQ(o.code, 2) << c.message << "\n" << o.output;
    EXPECT_THAT(o.output, HasSubstr(c.message));
  }
}

TEST(EndureSimCli, TomlErrorsNameFileLineAndKey) {
  testing_support::ScratchDir dir("endure_cli_test");
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.Path("bad.toml");
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, "nodes = 10\nrestart = \"-1m\"\n").ok());
  Outcome o = RunEndure({"sim", "--scenario", path});
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.output, HasSubstr(path + ":2: restart: invalid duration '-1m'"));
}

TEST(EndureSimCli, JsonIsDeterministicAndPrintsTheSeed) {
  std::vector<std::string> args = {"sim",    "--nodes", "500",    "--duration", "10d",
                                   "--runs", "3",       "--seed", "7",          "--json"};
  Outcome a = RunEndure(args);
  Outcome b = RunEndure(args);
  ASSERT_EQ(a.code, 0) << a.output;
  for (const char* key : {"\"ettr\":", "\"ettr_ci95\":[", "\"failures\":", "\"wall_s\":",
                          "\"productive_s\":", "\"mttf_s\":", "\"seed\":7"}) {
    EXPECT_THAT(a.output, HasSubstr(key));
  }
  // Everything but the timing figures repeats exactly.
  auto strip = [](std::string s) { return s.substr(0, s.find("\"events_per_s\"")); };
  EXPECT_EQ(strip(a.output), strip(b.output));

  Outcome text = RunEndure({"sim", "--nodes", "100", "--duration", "1d", "--runs", "2"});
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("(random; pass --seed "));
}

TEST(EndureSimCli, AnalyticAndHelp) {
  Outcome o = RunEndure({"sim", "--analytic", "--nodes", "12500", "--failure-rate", "6.5"});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("job MTTF = 1/(nodes x rate)    17m43s"));
  EXPECT_THAT(o.output, HasSubstr("Daly interval (eq. 37)"));
  Outcome help = RunEndure({"sim", "--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.output, HasSubstr("--ckpt-interval"));
  EXPECT_EQ(RunEndure({}).code, 2);
}

TEST(EndureSimCli, SweepWritesCsvAndSvg) {
  testing_support::ScratchDir dir("endure_cli_test");
  ASSERT_FALSE(dir.path().empty());
  const std::string csv = dir.Path("sweep.csv");
  const std::string svg = dir.Path("sweep.svg");
  Outcome o = RunEndure({"sim", "--nodes", "1000", "--duration", "5d", "--runs", "3", "--seed", "1",
                         "--sweep", "ckpt-interval=10m:60m:3", "--csv", csv, "--svg", svg});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("wrote " + csv));
  Result<std::string> csv_text = Env::Default()->ReadFile(csv);
  ASSERT_TRUE(csv_text.ok());
  EXPECT_EQ(std::count(csv_text->begin(), csv_text->end(), '\n'), 4);
  Result<std::string> svg_text = Env::Default()->ReadFile(svg);
  ASSERT_TRUE(svg_text.ok());
  EXPECT_THAT(*svg_text, HasSubstr("<svg"));
}

// The sweep's plot: a well-formed SVG file (an XML parser reads it) with
// the exact curve drawn through far more points than were simulated, and
// its optimum marked on it.
TEST(EndureSimCli, SweepSvgDrawsTheAnalyticCurveDenselyAndMarksItsOptimum) {
  testing_support::ScratchDir dir("endure_cli_test");
  ASSERT_FALSE(dir.path().empty());
  const std::string svg = dir.Path("sweep.svg");
  Outcome o = RunEndure({"sim", "--nodes", "1000", "--duration", "5d", "--runs", "2", "--seed", "1",
                         "--sweep", "ckpt-interval=5m:120m:4", "--csv", dir.Path("sweep.csv"),
                         "--svg", svg});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("wrote " + dir.Path("sweep.csv") + " and " + svg));
  // The optimum the table prints, e.g. "exact-optimal interval 41m37s (ETTR 0.9470)".
  const size_t at = o.output.find("(ETTR ", o.output.find("exact-optimal interval"));
  ASSERT_NE(at, std::string::npos) << o.output;
  const std::string optimum_ettr = o.output.substr(at + 6, 6);

  // Debian's Python's XML parser (scripts/install-deps): the file is
  // well-formed, its root is an SVG element; it lists each polyline's point
  // count and the markers' text.
  Outcome parsed = testing_support::RunCommand({"/usr/bin/python3", "-c", R"(
import sys, xml.etree.ElementTree as ET
svg = '{http://www.w3.org/2000/svg}'
root = ET.parse(sys.argv[1]).getroot()
print('root', root.tag == svg + 'svg')
for e in root.iter(svg + 'polyline'):
    if e.get('class') == 'line':
        print('line', e.get('stroke'), len(e.get('points').split()))
for g in root.iter(svg + 'g'):
    if g.get('class') == 'marker':
        print('marker', ''.join(g.find(svg + 'text').itertext()))
print('points', sum(1 for c in root.iter(svg + 'circle') if c.get('class') == 'point'))
)",
                                                svg});
  ASSERT_EQ(parsed.code, 0) << parsed.output;
  EXPECT_THAT(parsed.output, HasSubstr("root True\n"));
  // The exact and first-order curves: 241 samples and the optimum itself.
  EXPECT_THAT(parsed.output, HasSubstr("line #1f77b4 242\n"));
  EXPECT_THAT(parsed.output, HasSubstr("line #2ca02c 242\n"));
  EXPECT_THAT(parsed.output, HasSubstr("points 4\n"));
  EXPECT_THAT(parsed.output, HasSubstr("marker exact optimum "));
  EXPECT_THAT(parsed.output, HasSubstr(" min, ETTR " + optimum_ettr + "\n"));
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(EndureCertsCli, WritesTheJobsCertificatesWithPrivateKeys) {
  testing_support::ScratchDir scratch("endure_cli_test");
  ASSERT_FALSE(scratch.path().empty());
  const std::string dir = scratch.Path("certs");
  Outcome o = RunEndure({"certs", "--dir", dir, "--nodes", "node0,node1", "--host", "10.0.0.7",
                         "--host", "trainer.example.com", "--valid", "30d"});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("wrote the CA " + dir + "/ca.pem"));
  EXPECT_THAT(o.output, HasSubstr("wrote " + dir + "/node1.pem and " + dir + "/node1.key"));
  EXPECT_THAT(o.output, HasSubstr("valid for 30d"));
  EXPECT_EQ(ModeOf(dir), 0700u);
  for (const char* name : {"ca", "controller", "node0", "node1"}) {
    EXPECT_EQ(ModeOf(dir + "/" + name + ".key"), 0600u) << name;
    EXPECT_EQ(ModeOf(dir + "/" + name + ".pem"), 0644u) << name;
  }
  for (const char* name : {"controller", "node0", "node1"}) {
    Result<tls::Identity> id = tls::LoadIdentity(dir, name);
    EXPECT_TRUE(id.ok()) << name << ": " << id.status().ToString();
  }

  // Again on the same directory: the CA stays, node2 joins it.
  const std::string ca = testing_support::ReadAll(dir + "/ca.pem");
  o = RunEndure({"certs", "--dir", dir, "--nodes-count", "3"});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("kept the CA " + dir + "/ca.pem"));
  EXPECT_EQ(testing_support::ReadAll(dir + "/ca.pem"), ca);
  EXPECT_TRUE(tls::LoadIdentity(dir, "node2").ok());
  EXPECT_TRUE(tls::LoadIdentity(dir, "node0").ok());

  Outcome help = RunEndure({"certs", "--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.output, HasSubstr("--nodes-count"));
}

TEST(EndureCertsCli, BadInputExitsTwoNamingTheFlagOrFile) {
  testing_support::ScratchDir scratch("endure_cli_test");
  ASSERT_FALSE(scratch.path().empty());
  const std::string dir = scratch.Path("certs");
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), scratch.Path("file"), "x").ok());
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--dir", dir, "--nodes", "node0,../etc"}, "--nodes: '../etc' is not a valid node name"},
      {{"--dir", dir, "--nodes", "controller"}, "--nodes: 'controller' is reserved"},
      {{"--dir", dir, "--nodes", "node0", "--valid", "90"}, "--valid: invalid duration '90'"},
      {{"--dir", dir, "--nodes", "node0", "--valid", "0s"}, "--valid: must be positive"},
      {{"--dir", dir, "--nodes", "node0", "--host", "a b"}, "--host: 'a b'"},
      {{"--dir", dir, "--nodes-count", "0"}, "--nodes-count: must be between 1 and"},
      {{"--dir", dir}, "no nodes: give --nodes"},
      {{"--dir", scratch.Path("file") + "/certs", "--nodes", "node0"}, scratch.Path("file")},
      {{"--nodes", "node0"}, "--dir"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"certs"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Outcome o = RunEndure(args);
    EXPECT_EQ(o.code, 2) << c.message << "\n" << o.output;
    EXPECT_THAT(o.output, HasSubstr(c.message));
  }
  EXPECT_FALSE(Env::Default()->Exists(dir));  // refused before anything was written

  // A CA key that is not the CA certificate's.
  ASSERT_EQ(RunEndure({"certs", "--dir", dir, "--nodes", "node0"}).code, 0);
  ASSERT_EQ(RunEndure({"certs", "--dir", scratch.Path("other"), "--nodes", "node0"}).code, 0);
  ASSERT_EQ(::rename(scratch.Path("other/ca.key").c_str(), (dir + "/ca.key").c_str()), 0);
  Outcome o = RunEndure({"certs", "--dir", dir, "--nodes", "node1"});
  EXPECT_EQ(o.code, 2) << o.output;
  EXPECT_THAT(o.output, HasSubstr(dir + "/ca.key is not the key of " + dir + "/ca.pem"));
}

TEST(EndureIncidentsCli, BadInputExitsTwoSayingWhatToFix) {
  testing_support::ScratchDir scratch("endure_cli_test");
  ASSERT_FALSE(scratch.path().empty());
  const std::string empty = scratch.Path("empty");
  ASSERT_TRUE(Env::Default()->CreateDirs(empty).ok());
  // An empty database file is a knowledge base with no incidents.
  const std::string kb = scratch.Path("kb");
  ASSERT_TRUE(Env::Default()->CreateDirs(kb).ok());
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), kb + "/incidents.db", "").ok());
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"incidents", scratch.Path("none")}, "no such directory"},
      {{"incidents", empty}, "no incident knowledge base"},
      {{"incidents"}, "pass a state directory"},
      {{"incidents", "--similar", "0", kb}, "--similar"},
      {{"incidents", "--similar", "9", kb}, "no incident 9"},
      {{"incidents", "resolve", "9", "--action", "evict_node", "--state-dir", kb}, "no incident 9"},
      {{"incidents", "resolve", "9", "--action", "reboot", "--state-dir", kb},
       "--action: unknown action \"reboot\""},
      {{"incidents", "resolve", "9", "--action", "stop", "--cause", "a b", "--state-dir", kb},
       "--cause 'a b'"},
      {{"incidents", "resolve", "9", "--state-dir", kb}, "--action"},
      {{"classify", "--suggest", empty}, "no incident knowledge base"},
  };
  for (const Case& c : cases) {
    Outcome o = RunEndure(c.args);
    EXPECT_EQ(o.code, 2) << c.args.back() << ": " << o.output;
    EXPECT_THAT(o.output, HasSubstr(c.message)) << c.args.back();
  }
  Outcome list = RunEndure({"incidents", kb});
  EXPECT_EQ(list.code, 0) << list.output;
  EXPECT_THAT(list.output, HasSubstr("0 incidents"));
}

}  // namespace
}  // namespace endure
