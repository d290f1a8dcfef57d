#include "core/incident_match.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace endure::core {
namespace {

using ::testing::HasSubstr;

TEST(NormalizeExcerpt, TwoOccurrencesOfOneFaultCompareEqual) {
  const std::string a =
      "[1234567.890123] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen "
      "off the bus.\n2024-03-01T12:00:01.123Z rank 3 at 10.0.0.7:29500 freed 0x7f33aa10\n"
      "  File \"/home/alice/run/train.py\", line 1234, in step\n";
  const std::string b =
      "[99.5] NVRM: Xid (PCI:0000:b7:00): 79, pid=77123, name=python, GPU has fallen "
      "off the bus.\n2025-11-30T01:02:03Z rank 3 at 10.1.2.3:29400 freed 0x5500\n"
      "  File \"/opt/bob/train.py\", line 98, in step\n";
  EXPECT_EQ(NormalizeExcerpt(a), NormalizeExcerpt(b));
  // What tells faults apart stays: the Xid, short numbers, file names.
  EXPECT_THAT(NormalizeExcerpt(a), HasSubstr("): 79, pid=<n>"));
  EXPECT_THAT(NormalizeExcerpt(a), HasSubstr("<dir>/train.py"));
  EXPECT_NE(NormalizeExcerpt("NVRM: Xid (PCI:0000:3b:00): 13, pid=1"),
            NormalizeExcerpt("NVRM: Xid (PCI:0000:3b:00): 79, pid=1"));
}

TEST(FindSimilar, ARecurrenceScoresHighAndADifferentFaultLow) {
  auto text = [](int64_t id, const std::string& cause, const std::string& excerpt) {
    return IncidentText{id, cause, NormalizeExcerpt(excerpt), ""};
  };
  const std::vector<IncidentText> past = {
      text(1, "worker_exit code 1",
           "step 10 loss 2.31\nfabricd[4242]: mlx5_3: firmware assert 0x1f2a (syndrome 0x8b)\n"),
      text(2, "nccl_timeout",
           "step 10 loss 2.31\n[Rank 0] Watchdog caught collective operation timeout: "
           "WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 600000 milliseconds\n"),
      text(3, "oom", "step 10 loss 2.31\nOut of memory: Killed process 1234 (python)\n"),
  };
  const IncidentText again =
      text(0, "worker_exit code 1",
           "step 977 loss 1.02\nfabricd[9913]: mlx5_3: firmware assert 0x77 (syndrome 0x8b)\n");
  std::vector<Similar> s = FindSimilar(again, past, 3, 0);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].id, 1);
  EXPECT_GE(s[0].score, kRecurrenceScore);
  EXPECT_LT(s[1].score, kRecurrenceScore);
  EXPECT_EQ(FindSimilar(again, past, 3, kRecurrenceScore).size(), 1u);
  // Itself is never its own recurrence; an empty text matches by cause.
  EXPECT_TRUE(FindSimilar(past[0], {past[0]}, 3, 0).empty());
  std::vector<Similar> kill =
      FindSimilar({9, "signal 9 SIGKILL", "", ""}, {{4, "signal 9 SIGKILL", "", ""}}, 1, 0);
  ASSERT_EQ(kill.size(), 1u);
  EXPECT_DOUBLE_EQ(kill[0].score, 1.0);
}

TEST(BoundedExcerpt, KeepsTheLastWholeLines) {
  EXPECT_EQ(BoundedExcerpt("a\nb\nc\n", 2, 100), "b\nc\n");
  EXPECT_EQ(BoundedExcerpt("a\nb\nc", 5, 100), "a\nb\nc\n");
  EXPECT_EQ(BoundedExcerpt("aaaa\nbb\ncc\n", 5, 6), "bb\ncc\n");
  EXPECT_EQ(BoundedExcerpt("0123456789\n", 5, 4), "6789\n");  // one long line: its end
  EXPECT_EQ(BoundedExcerpt("", 5, 4), "");
  EXPECT_EQ(BoundedExcerpt("\n\n", 5, 4), "");
}

TEST(SuggestRules, ResolvedRecurrencesBecomeARuleThatClassifiesThem) {
  const std::vector<ResolvedIncident> resolved = {
      {1, "step 3\nfabricd[4242]: mlx5_3: firmware assert 0x1f2a (syndrome 0x8b)\n", "hca_firmware",
       LogAction::kEvictNode, "HCA replaced"},
      {2, "step 99\nfabricd[913]: mlx5_1: firmware assert 0x2 (syndrome 0x8b)\n", "hca_firmware",
       LogAction::kEvictNode, "again"},
      {3, "loading\nmy_loader: shard index corrupt at block 17\n", "bad_shard", LogAction::kStop,
       "regenerated the shard"},
  };
  std::vector<RuleCandidate> c = SuggestRules(resolved);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].incidents, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c[0].rule.action, LogAction::kEvictNode);
  EXPECT_EQ(c[0].rule.cause, "hca_firmware");
  EXPECT_EQ(c[0].rule.examples.size(), 2u);
  EXPECT_TRUE(c[0].conflicts.empty());
  EXPECT_EQ(c[1].rule.action, LogAction::kStop);

  // The TOML reads back as rules that classify what they came from, and
  // nothing else.
  Result<LogClassifier> rules = LogClassifier::FromToml(RuleCandidatesToToml(c), "s.toml");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString() << "\n" << RuleCandidatesToToml(c);
  EXPECT_TRUE(rules->CheckExamples().ok()) << rules->CheckExamples().message();
  std::optional<LogMatch> m =
      rules->Classify("fabricd[1]: mlx5_0: firmware assert 0xdead (syndrome 0x8b)\n");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->action, LogAction::kEvictNode);
  EXPECT_FALSE(rules->Classify("step 3\nall good\n").has_value());

  // A worker's control characters (found by fuzz_incidents) do not break the
  // file: TOML allows none in comments, and they are escaped in strings.
  std::vector<ResolvedIncident> odd = {
      {7, "boot\nfabricd: \x01mlx5 firmware\x1b assert 0x1f (syndrome)\n", "hca",
       LogAction::kEvictNode, ""},
  };
  const std::string toml = RuleCandidatesToToml(SuggestRules(odd));
  Result<LogClassifier> odd_rules = LogClassifier::FromToml(toml, "odd.toml");
  EXPECT_TRUE(odd_rules.ok()) << odd_rules.status().ToString() << "\n" << toml;

  // Two resolutions that disagree give investigate.
  std::vector<ResolvedIncident> split = resolved;
  split[1].action = LogAction::kRestart;
  EXPECT_EQ(SuggestRules(split)[0].rule.action, LogAction::kInvestigate);
}

}  // namespace
}  // namespace endure::core
