// Runs the built `endure classify` on real-world log excerpts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/env.h"

namespace endure {
namespace {

using ::testing::HasSubstr;

struct Outcome {
  int code = -1;
  std::string output;  // stdout and stderr
};

// Runs `endure ARGS < input` through the shell.
Outcome Classify(const std::string& args, const std::string& input) {
  const std::string in_path = testing::TempDir() + "endure_classify_test.in";
  EXPECT_TRUE(WriteFileAtomically(Env::Default(), in_path, input).ok());
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
              HasSubstr("[1] line 1: cause=xid_79 action=evict_node rule=xid_hardware\n"
                        "    line 1: [ 3342.918213] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, "
                        "GPU has fallen off the bus.\n"));
  EXPECT_THAT(o.output, HasSubstr("[2] lines 3-4: cause=nccl_timeout action=restart "
                                  "rule=nccl_watchdog_timeout\n"));
  EXPECT_THAT(o.output, HasSubstr("    also matched: nccl_async_abort\n"));
  EXPECT_THAT(o.output, HasSubstr("[3] line 6: cause=oom action=restart rule=oom_killer\n"));
  EXPECT_THAT(o.output,
              HasSubstr("[4] lines 8-13: cause=user_exception action=restart rule=user_exception\n"
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
  EXPECT_EQ(objects[3]["cause"], "user_exception");
  EXPECT_EQ(objects[3]["line_number"], 13);
  EXPECT_EQ(objects[3]["rule"], "user_exception");
  EXPECT_TRUE(objects[4]["cause"].is_null());
  EXPECT_EQ(objects[4]["input"], 5);
}

TEST(EndureClassifyCli, LinesModeClassifiesEachLine) {
  Outcome o = Classify("--lines --json", kExcerpts);
  ASSERT_EQ(o.code, 0) << o.output;
  std::istringstream lines(o.output);
  int count = 0;
  for (std::string line; std::getline(lines, line);) ++count;
  EXPECT_EQ(count, 11);  // every non-blank input line
}

TEST(EndureClassifyCli, ShippedRulesPassTheirOwnCheck) {
  Outcome o = Classify("--check", "");
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("examples are classified by their own rule"));
}

TEST(EndureClassifyCli, BrokenRulesFileExitsTwoWithFileAndLine) {
  const std::string rules = testing::TempDir() + "endure_classify_bad_rules.toml";
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), rules,
                                  "[[rule]]\nname = \"x\"\npattern = 'Xid (\\d+'\n"
                                  "cause = \"c\"\naction = \"restart\"\n")
                  .ok());
  Outcome o = Classify("--rules '" + rules + "'", "anything\n");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.output, HasSubstr(rules + ":3: rule \"x\": the pattern does not compile"));

  o = Classify("--rules /nonexistent/rules.toml", "anything\n");
  EXPECT_EQ(o.code, 2);
  EXPECT_THAT(o.output, HasSubstr("/nonexistent/rules.toml"));
}

}  // namespace
}  // namespace endure
