#include "core/log_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace endure::core {
namespace {

using ::testing::StartsWith;

constexpr char kRules[] = R"(
[[rule]]
name = "xid"
priority = 100
pattern = 'Xid \d+: (?P<xid>\d+)'
cause = "xid_{xid}"
action = "evict_node"

[[rule]]
name = "oom"
priority = 50
pattern = 'CUDA out of memory'
cause = "cuda_oom"
action = "stop"
)";

std::string ParseError(std::string_view toml) {
  Result<std::vector<CorpusExcerpt>> c = ParseLogCorpus(toml, "c.toml");
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : c.status().message();
}

TEST(LogCorpus, ParsesExcerptsWithWhereTheyAre) {
  Result<std::vector<CorpusExcerpt>> c = ParseLogCorpus(
      "# header\n[[excerpt]]\nsource = \"https://x/1\"\ncause = \"xid_79\"\naction = "
      "\"evict_node\"\nwhy = \"bus\"\ntext = '''\nXid 1: 79\n'''\n",
      "c.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->size(), 1u);
  EXPECT_EQ((*c)[0].line, 2);
  EXPECT_EQ((*c)[0].action, LogAction::kEvictNode);
  EXPECT_EQ((*c)[0].text, "Xid 1: 79\n");
}

TEST(LogCorpus, MalformedFilesNameFileLineAndKey) {
  EXPECT_THAT(ParseError("[[excerpt]]\nsource = 'a\n"), StartsWith("c.toml:2: TOML syntax error"));
  EXPECT_EQ(ParseError("[[excerpt]]\nsource = \"s\"\ncause = \"c\"\naction = \"stop\"\ntext = "
                       "\"t\"\nsorce = \"x\"\n"),
            "c.toml:6: unknown key \"sorce\"; the keys of an excerpt are source, cause, action, "
            "why, text");
  EXPECT_EQ(ParseError("[[excerpt]]\ncause = \"c\"\naction = \"stop\"\ntext = \"t\"\n"),
            "c.toml:1: the excerpt needs a non-empty \"source\"");
  EXPECT_THAT(ParseError("[[excerpt]]\nsource = \"s\"\ncause = \"c\"\naction = \"reboot\"\ntext "
                         "= \"t\"\n"),
              StartsWith("c.toml:1: unknown action \"reboot\""));
  EXPECT_EQ(ParseError("[[excerpt]]\nsource = 1\n"), "c.toml:2: \"source\" must be a string");
  EXPECT_EQ(ParseError("excerpts = 1\n"),
            "c.toml:1: unknown top-level key \"excerpts\"; a corpus file holds [[excerpt]] "
            "tables only");
}

TEST(LogCorpus, ScoresActionsCausesAndHarm) {
  Result<LogClassifier> rules = LogClassifier::FromToml(kRules, "r.toml");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  auto excerpt = [](std::string cause, LogAction action, std::string text) {
    CorpusExcerpt e;
    e.source = "s";
    e.cause = std::move(cause);
    e.action = action;
    e.text = std::move(text);
    return e;
  };
  const std::vector<CorpusExcerpt> corpus = {
      excerpt("xid_79", LogAction::kEvictNode, "Xid 1: 79\n"),           // right
      excerpt("xid_13", LogAction::kRestart, "Xid 1: 13\n"),             // evicts: harmful
      excerpt("cuda_oom", LogAction::kStop, "a\nCUDA out of memory\n"),  // right
      excerpt("gpu_lost", LogAction::kEvictNode, "GPU is lost\n"),       // no rule: harmful
      excerpt("disk_full", LogAction::kInvestigate, "No space left\n"),  // no rule: wrong
  };
  const CorpusScore s = ScoreCorpus(*rules, corpus);
  EXPECT_EQ(s.excerpts, 5);
  EXPECT_EQ(s.multi_line, 1);
  EXPECT_EQ(s.action_right, 2);
  EXPECT_EQ(s.cause_right, 3);  // xid_13 is named right, its action is not
  EXPECT_EQ(s.harmful, 2);
  EXPECT_EQ(s.evicted_healthy, 1);
  EXPECT_EQ(s.restarted_on_broken, 1);
  EXPECT_DOUBLE_EQ(s.ActionAccuracy(), 0.4);
  ASSERT_EQ(s.by_cause.size(), 5u);
  EXPECT_EQ(s.by_cause[0].cause, "cuda_oom");
  EXPECT_FALSE(s.outcomes[3].match.has_value());
  EXPECT_EQ(s.outcomes[3].action, kUnmatchedAction);
  EXPECT_TRUE(IsHarmful(LogAction::kEvictNode, LogAction::kRestart));
  EXPECT_FALSE(IsHarmful(LogAction::kEvictNode, LogAction::kInvestigate));
  EXPECT_FALSE(IsHarmful(LogAction::kStop, LogAction::kRestart));
}

}  // namespace
}  // namespace endure::core
