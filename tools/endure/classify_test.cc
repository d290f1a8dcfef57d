// Runs the built `endure classify` on real-world log excerpts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/env.h"

namespace endure {
namespace {

using ::testing::HasSubstr;

struct Outcome {
  int code = -1;
  std::string output;  // stdout and stderr
};

// A fresh directory of its own (mkdtemp), removed at the end of the scope:
// ctest runs these tests in parallel, and no two may share an input file.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = testing::TempDir() + "endure_classify_test.XXXXXX";
    path_ = mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
    EXPECT_FALSE(path_.empty()) << "mkdtemp " << tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  // `name` in the directory, holding `text`.
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = path_ + "/" + name;
    EXPECT_TRUE(WriteFileAtomically(Env::Default(), path, text).ok()) << path;
    return path;
  }

 private:
  std::string path_;
};

// Runs `endure ARGS < input` through the shell.
Outcome Classify(const std::string& args, const std::string& input) {
  ScratchDir dir;
  const std::string in_path = dir.Write("input.txt", input);
  const std::string cmd =
      std::string("'") + ENDURE_BIN + "' classify " + args + " < '" + in_path + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (p == nullptr) return {};
  Outcome o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) o.output.append(buf, n);
  const int status = pclose(p);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

// The JSON objects of `endure classify --json` output, one per line.
std::vector<nlohmann::json> JsonLines(const std::string& output) {
  std::vector<nlohmann::json> objects;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    objects.push_back(nlohmann::json::parse(line, nullptr, false));
    EXPECT_FALSE(objects.back().is_discarded()) << line;
  }
  return objects;
}

const char kExcerpts[] =
    "[ 3342.918213] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    "\n"
    "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=4262, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600000 milliseconds before timing out.\n"
    "[rank0]:[E ProcessGroupNCCL.cpp:577] [Rank 0] Some NCCL operations have failed or timed out.\n"
    "\n"
    "Out of memory: Killed process 1234 (python) total-vm:104857600kB, anon-rss:98765432kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:200000kB oom_score_adj:0\n"
    "\n"
    "Traceback (most recent call last):\n"
    "  File \"/workspace/train.py\", line 212, in <module>\n"
    "    main()\n"
    "  File \"/workspace/data.py\", line 57, in __next__\n"
    "    raise ValueError(\"shard is empty\")\n"
    "ValueError: shard /data/shard_00017.bin is empty\n"
    "\n"
    "step 1200 | loss 2.4312 | lr 2.9e-04 | tokens/s 152,311\n";

TEST(EndureClassifyCli, HumanOutputNamesCauseActionRuleAndLine) {
  Outcome o = Classify("", kExcerpts);
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output,
              HasSubstr("[1] line 1: cause=xid_79 action=evict_node rule=xid_restart_bm\n"
                        "    line 1: [ 3342.918213] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, "
                        "GPU has fallen off the bus.\n"));
  EXPECT_THAT(o.output, HasSubstr("[2] lines 3-4: cause=nccl_timeout action=restart "
                                  "rule=nccl_watchdog_timeout\n"));
  EXPECT_THAT(o.output, HasSubstr("    also matched: nccl_async_abort\n"));
  EXPECT_THAT(o.output, HasSubstr("[3] line 6: cause=oom action=restart rule=oom_killer\n"));
  EXPECT_THAT(o.output,
              HasSubstr("[4] lines 8-13: cause=user_error action=stop rule=python_program_error\n"
                        "    line 13: ValueError: shard /data/shard_00017.bin is empty\n"));
  EXPECT_THAT(o.output, HasSubstr("[5] line 15: no rule matched\n"));
}

TEST(EndureClassifyCli, JsonIsOneObjectPerExcerpt) {
  Outcome o = Classify("--json", kExcerpts);
  ASSERT_EQ(o.code, 0) << o.output;
  std::vector<nlohmann::json> objects;
  std::istringstream lines(o.output);
  for (std::string line; std::getline(lines, line);) {
    objects.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(objects.size(), 5u);
  EXPECT_EQ(objects[0]["cause"], "xid_79");
  EXPECT_EQ(objects[0]["action"], "evict_node");
  EXPECT_EQ(objects[0]["captures"]["xid"], "79");
  EXPECT_EQ(objects[1]["cause"], "nccl_timeout");
  EXPECT_EQ(objects[1]["captures"]["op"], "ALLREDUCE");
  EXPECT_EQ(objects[2]["cause"], "oom");
  EXPECT_EQ(objects[2]["captures"]["process"], "python");
  EXPECT_EQ(objects[3]["cause"], "user_error");
  EXPECT_EQ(objects[3]["action"], "stop");
  EXPECT_EQ(objects[3]["line_number"], 13);
  EXPECT_EQ(objects[3]["rule"], "python_program_error");
  EXPECT_EQ(objects[3]["captures"]["exception"], "ValueError");
  EXPECT_TRUE(objects[4]["cause"].is_null());
  EXPECT_EQ(objects[4]["input"], 5);
}

TEST(EndureClassifyCli, LinesModeClassifiesEachLine) {
  Outcome o = Classify("--lines --json", kExcerpts);
  ASSERT_EQ(o.code, 0) << o.output;
  // Every non-blank input line on its own, by its own line number: alone,
  // the traceback's header is the generic Python rule, and its frames match
  // nothing.
  using Row = std::tuple<int, nlohmann::json, nlohmann::json>;  // line, cause, rule
  const std::vector<Row> expected = {
      {1, "xid_79", "xid_restart_bm"},
      {3, "nccl_timeout", "nccl_watchdog_timeout"},
      {4, "nccl_error", "nccl_async_abort"},
      {6, "oom", "oom_killer"},
      {8, "user_exception", "python_traceback"},
      {9, nullptr, nullptr},
      {10, nullptr, nullptr},
      {11, nullptr, nullptr},
      {12, nullptr, nullptr},
      {13, "user_error", "python_program_error"},
      {15, nullptr, nullptr},
  };
  std::vector<Row> got;
  for (const nlohmann::json& j : JsonLines(o.output)) {
    EXPECT_EQ(j["first_line"], j["last_line"]) << j.dump();
    got.emplace_back(j.value("first_line", -1), j["cause"], j["rule"]);
  }
  EXPECT_EQ(got, expected) << o.output;
}

TEST(EndureClassifyCli, EachInputGetsTheCauseOfTheRuleItMatches) {
  // The same command, different lines: different rules, causes and actions.
  struct Case {
    std::string line;
    nlohmann::json cause, action, rule;
  };
  const std::vector<Case> cases = {
      {"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.", "xid_79", "evict_node",
       "xid_restart_bm"},
      {"NVRM: Xid (PCI:0000:3b:00): 48, pid=1, An uncorrectable double bit error", "xid_48",
       "evict_node", "xid_workflow_48"},
      {"NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception", "xid_13", "restart",
       "xid_restart_app"},
      {"RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_error",
       "stop_if_repeated", "cuda_illegal_memory_access"},
      {"RuntimeError: CUDA error: device-side assert triggered", "cuda_device_assert", "stop",
       "cuda_device_assert"},
      {"Out of memory: Killed process 99 (python) total-vm:1kB", "oom", "restart", "oom_killer"},
      {"step 1200 | loss 2.4312", nullptr, nullptr, nullptr},
  };
  for (const Case& c : cases) {
    Outcome o = Classify("--json", c.line + "\n");
    ASSERT_EQ(o.code, 0) << o.output;
    std::vector<nlohmann::json> objects = JsonLines(o.output);
    ASSERT_EQ(objects.size(), 1u) << o.output;
    EXPECT_EQ(objects[0]["cause"], c.cause) << c.line;
    EXPECT_EQ(objects[0]["action"], c.action) << c.line;
    EXPECT_EQ(objects[0]["rule"], c.rule) << c.line;
    if (!c.cause.is_null()) EXPECT_EQ(objects[0]["line"], c.line);
  }
}

TEST(EndureClassifyCli, RulesFromAnotherFileReplaceTheShippedOnes) {
  ScratchDir dir;
  const std::string rules =
      dir.Write("rules.toml",
                "[[rule]]\nname = \"fire\"\npattern = 'disk (?P<disk>\\w+) "
                "is on fire'\ncause = \"disk_fire\"\naction = \"evict_node\"\n");
  const std::string line = "disk sda is on fire";
  std::vector<nlohmann::json> own =
      JsonLines(Classify("--json --rules '" + rules + "'", line).output);
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(own[0]["cause"], "disk_fire");
  EXPECT_EQ(own[0]["rule"], "fire");
  EXPECT_EQ(own[0]["captures"]["disk"], "sda");
  // The shipped rules know nothing of it...
  std::vector<nlohmann::json> shipped = JsonLines(Classify("--json", line).output);
  ASSERT_EQ(shipped.size(), 1u);
  EXPECT_TRUE(shipped[0]["cause"].is_null()) << shipped[0].dump();
  // ...and the file's rules are all there is: an Xid line matches none.
  std::vector<nlohmann::json> xid = JsonLines(
      Classify("--json --rules '" + rules + "'", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, x\n")
          .output);
  ASSERT_EQ(xid.size(), 1u);
  EXPECT_TRUE(xid[0]["cause"].is_null()) << xid[0].dump();
}

TEST(EndureClassifyCli, ShippedRulesPassTheirOwnCheck) {
  Outcome o = Classify("--check", "");
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("examples are classified by their own rule"));
  // It lists the rules it checked, from the shipped file.
  EXPECT_THAT(o.output, HasSubstr("config/log_rules: "));
  EXPECT_THAT(o.output, HasSubstr("xid_restart_bm"));
  EXPECT_THAT(o.output, HasSubstr("oom_killer"));
}

TEST(EndureClassifyCli, BrokenRulesFileExitsTwoWithFileAndLine) {
  ScratchDir dir;
  const std::string rules = dir.Write("bad_rules.toml",
                                      "[[rule]]\nname = \"x\"\npattern = 'Xid (\\d+'\n"
                                      "cause = \"c\"\naction = \"restart\"\n");
  Outcome o = Classify("--rules '" + rules + "'", "anything\n");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.output, HasSubstr(rules + ":3: rule \"x\": the pattern does not compile"));

  o = Classify("--rules /nonexistent/rules.toml", "anything\n");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.output, HasSubstr("/nonexistent/rules.toml"));
}

TEST(EndureClassifyCli, ARulesDirectoryIsOneListAndABadFileInItIsNamed) {
  ScratchDir dir;
  const std::string good =
      "[[rule]]\nname = \"disk\"\npattern = 'No space left'\n"
      "cause = \"disk_full\"\naction = \"investigate\"\n";
  const std::string first = dir.Write("10_a.toml", good);
  dir.Write("README.md", "not rules: ignored\n");
  const std::string site = dir.Write("90_site.toml",
                                     "[[rule]]\nname = \"hca\"\npattern = 'firmware assert'\n"
                                     "cause = \"hca_firmware\"\naction = \"evict_node\"\n");
  const std::string rules = std::filesystem::path(site).parent_path().string();
  Outcome o = Classify("--json --rules '" + rules + "'", "mlx5_3: firmware assert 0x1f\n");
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("\"action\":\"evict_node\""));
  // A wrong key in one file: that file, its line and the key.
  dir.Write("90_site.toml",
            "[[rule]]\nname = \"hca\"\npattern = 'firmware assert'\n"
            "cause = \"hca_firmware\"\nacton = \"evict_node\"\n");
  o = Classify("--rules '" + rules + "'", "x\n");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.output, HasSubstr(site + ":5: rule \"hca\": unknown key \"acton\""));
  // The same name in two files names both.
  dir.Write("90_site.toml", good);
  o = Classify("--rules '" + rules + "'", "x\n");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.output, HasSubstr("another rule has the same name (" + first + ":1)"));
}

TEST(EndureClassifyCli, TheCorpusIsScoredAndAMalformedOneExitsTwo) {
  ScratchDir dir;
  const std::string corpus =
      dir.Write("c.toml",
                "[[excerpt]]\nsource = \"https://example.org/1\"\ncause = \"xid_79\"\n"
                "action = \"evict_node\"\n"
                "text = \"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\"\n"
                "[[excerpt]]\nsource = \"https://example.org/2\"\ncause = \"gpu_lost\"\n"
                "action = \"evict_node\"\ntext = \"a line no rule knows\"\n");
  Outcome o = Classify("--corpus '" + corpus + "'", "");
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("1/2 (50.0%)"));
  EXPECT_THAT(o.output, HasSubstr("harmful actions: 1/2 (50.0%)"));
  EXPECT_THAT(o.output,
              HasSubstr("c.toml:6: expected evict_node (gpu_lost), got no rule (restart) HARMFUL"));
  o = Classify("--corpus '" + corpus + "' --min-accuracy 0.9", "");
  EXPECT_EQ(o.code, 1) << o.output;
  EXPECT_THAT(o.output, HasSubstr("50.0% of actions right (at least 90.0% wanted)"));

  const std::string bad = dir.Write(
      "bad.toml", "[[excerpt]]\nsource = \"s\"\ncause = \"c\"\naction = \"evict\"\ntext = \"t\"\n");
  o = Classify("--corpus '" + bad + "'", "");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.output, HasSubstr(bad + ":1: unknown action \"evict\""));
}

}  // namespace
}  // namespace endure
