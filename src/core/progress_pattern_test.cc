// Progress from worker output: line splitting ('\r' of progress bars, the
// length bound), the pattern, the step counter, the reports an agent sends,
// and every pattern docs/progress_pattern.md documents, against the sample
// lines it shows.
#include "core/progress_pattern.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace endure::core {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;

std::vector<std::string> Split(const std::vector<std::string>& chunks, size_t max = kMaxLineBytes,
                               bool finish = true) {
  LineSplitter splitter(max);
  std::vector<std::string> lines;
  auto on_line = [&](std::string_view l) { lines.emplace_back(l); };
  for (const std::string& c : chunks) splitter.Feed(c, on_line);
  if (finish) splitter.Finish(on_line);
  return lines;
}

TEST(LineSplitter, NewlineCarriageReturnAndBothEndALine) {
  EXPECT_THAT(Split({"a\nb\rc\r\nd\n"}), ElementsAre("a", "b", "c", "d"));
  // "\r\n" split across two reads is still one line end.
  EXPECT_THAT(Split({"a\r", "\nb\n"}), ElementsAre("a", "b"));
  // Empty lines ended by '\n' are kept; tqdm's leading '\r' makes none.
  EXPECT_THAT(Split({"a\n\nb\n\rc\r\rd\n"}), ElementsAre("a", "", "b", "c", "d"));
}

TEST(LineSplitter, ProgressBarRedrawsAreLines) {
  // tqdm into a pipe: each redraw starts with '\r', the bar ends with '\n'.
  const std::string tqdm =
      "\r  0%|          | 0/500 [00:00<?, ?it/s]"
      "\r 10%|\xe2\x96\x88         | 50/500 [00:10<01:30,  5.00it/s]"
      "\r 20%|\xe2\x96\x88\xe2\x96\x88        | 100/500 [00:20<01:20,  5.00it/s]\n";
  std::vector<std::string> lines = Split({tqdm.substr(0, 30), tqdm.substr(30)});
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[1], HasSubstr("50/500 ["));
  EXPECT_THAT(lines[2], HasSubstr("100/500 ["));
}

TEST(LineSplitter, AnUnterminatedLineIsPassedOnAtTheEnd) {
  EXPECT_THAT(Split({"a\npartial"}), ElementsAre("a", "partial"));
  EXPECT_THAT(Split({"a\npartial"}, kMaxLineBytes, false), ElementsAre("a"));
}

TEST(LineSplitter, ALongLineIsCutAtTheLimitAndTheRestSkipped) {
  // 10 bytes at most: the first 10 are a line, the rest up to '\n' is dropped.
  EXPECT_THAT(Split({"0123456789abc", "def\nnext\n"}, 10), ElementsAre("0123456789", "next"));
  // Output without any line end never holds more than the limit.
  LineSplitter splitter(16);
  int lines = 0;
  for (int i = 0; i < 1000; ++i) splitter.Feed(std::string(100, 'x'), [&](auto) { ++lines; });
  EXPECT_EQ(lines, 1);
  EXPECT_EQ(kMaxLineBytes, 64u * 1024);
}

ProgressPattern Compile(const std::string& pattern) {
  Result<ProgressPattern> p = ProgressPattern::Compile(pattern);
  EXPECT_TRUE(p.ok()) << pattern << ": " << p.status().ToString();
  return std::move(p).value();
}

TEST(ProgressPattern, RefusesPatternsItCannotUse) {
  Result<ProgressPattern> bad = ProgressPattern::Compile("step (?P<step>\\d+");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("does not compile: missing )"));
  Result<ProgressPattern> unnamed = ProgressPattern::Compile("step (\\d+)");
  ASSERT_FALSE(unnamed.ok());
  EXPECT_THAT(unnamed.status().message(), HasSubstr("needs a named group 'step'"));
  Result<ProgressPattern> other = ProgressPattern::Compile("(?P<step>\\d+) (?P<lr>\\S+)");
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(), HasSubstr("unknown named group 'lr'"));
}

TEST(ProgressPattern, MatchesStepAndLoss) {
  ProgressPattern p = Compile(R"(step (?P<step>\d+)(?: loss (?P<loss>\S+))?)");
  std::optional<ProgressMatch> m = p.Match("[rank0] step 12 loss 3.1 lr 1e-4");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->step, 12);
  ASSERT_TRUE(m->loss.has_value());
  EXPECT_DOUBLE_EQ(*m->loss, 3.1);
  m = p.Match("step 13");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->step, 13);
  EXPECT_FALSE(m->loss.has_value());
  m = p.Match("step 14 loss nan");
  ASSERT_TRUE(m.has_value());
  ASSERT_TRUE(m->loss.has_value());
  EXPECT_TRUE(std::isnan(*m->loss));
  // A loss that is not a number is no loss.
  m = p.Match("step 15 loss ???");
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->loss.has_value());
  EXPECT_FALSE(p.Match("epoch 3 done").has_value());
}

TEST(ProgressPattern, AStepThatIsNotANumberIsNoMatch) {
  ProgressPattern p = Compile(R"(step (?P<step>\S+))");
  EXPECT_FALSE(p.Match("step twelve").has_value());
  EXPECT_FALSE(p.Match("step -3").has_value());
  EXPECT_FALSE(p.Match("step 1234567890123456789").has_value());  // 19 digits
  EXPECT_EQ(p.Match("step 123456789012345678")->step, 123456789012345678);
}

TEST(OutputProgress, CountsWhenTheNumberChanges) {
  OutputProgress p;
  EXPECT_FALSE(p.seen());
  EXPECT_EQ(p.Observe(0), std::nullopt);  // tqdm's "0/500": nothing done yet
  EXPECT_TRUE(p.seen());
  EXPECT_EQ(p.Observe(1), 1);
  EXPECT_EQ(p.Observe(1), std::nullopt);  // the same bar redrawn
  EXPECT_EQ(p.Observe(11), 11);           // printed every 10th step
  // A new epoch's bar starts again: 11 + 0, then + 1, + 2.
  EXPECT_EQ(p.Observe(0), std::nullopt);
  EXPECT_EQ(p.Observe(1), 12);
  EXPECT_EQ(p.Observe(2), 13);
  EXPECT_EQ(p.completed(), 13);
}

TEST(OutputProgress, TheFirstNumberIsTakenAsIs) {
  OutputProgress p;
  EXPECT_EQ(p.Observe(41), 41);  // resumed from the program's own checkpoint
  EXPECT_EQ(p.Observe(42), 42);
}

using Kind = OutputReport::Kind;
OutputReport Ready(int rank) { return {Kind::kReady, rank, 0, std::nullopt}; }
OutputReport Step(int rank, int64_t step, std::optional<double> loss = std::nullopt) {
  return {Kind::kStep, rank, step, loss};
}

TEST(OutputReports, RankZerosProgressStandsForEveryRank) {
  OutputReports r(Compile(R"(step (?P<step>\d+) loss (?P<loss>\S+))"), 3);
  EXPECT_TRUE(r.OnLine(0, "loading data").empty());
  EXPECT_THAT(r.OnLine(0, "step 1 loss 2.5"),
              ElementsAre(Ready(0), Ready(1), Ready(2), Step(0, 1, 2.5), Step(1, 1), Step(2, 1)));
  EXPECT_TRUE(r.OnLine(0, "step 1 loss 2.5").empty());  // no change, no progress
  EXPECT_THAT(r.OnLine(0, "step 2 loss 2.4"), ElementsAre(Step(0, 2, 2.4), Step(1, 2), Step(2, 2)));
}

TEST(OutputReports, OtherRanksReportOnlyThemselves) {
  OutputReports r(Compile(R"(step (?P<step>\d+))"), 2);
  EXPECT_THAT(r.OnLine(1, "step 1"), ElementsAre(Ready(1), Step(1, 1)));
  // Rank 0 then stands for rank 1 as well, whose ready already went up.
  EXPECT_THAT(r.OnLine(0, "step 1"), ElementsAre(Ready(0), Step(0, 1), Step(1, 1)));
}

TEST(OutputReports, DatagramsWin) {
  OutputReports r(Compile(R"(step (?P<step>\d+))"), 2);
  // Rank 1 uses the client library: its own lines are not read, and rank
  // 0's progress is not reported for it.
  r.OnDatagram(1, "ready");
  r.OnDatagram(1, "step");
  EXPECT_TRUE(r.OnLine(1, "step 1").empty());
  EXPECT_THAT(r.OnLine(0, "step 1"), ElementsAre(Ready(0), Step(0, 1)));
  r.OnDatagram(0, "step");
  EXPECT_TRUE(r.OnLine(0, "step 2").empty());
}

// The lines read for progress before the pattern first matched: what the
// agent warns of when there are many (NodeMachine::WarnIfUnmatched).
TEST(OutputReports, CountsTheLinesReadBeforeThePatternFirstMatched) {
  OutputReports r(Compile(R"(step (?P<step>\d+))"), 2);
  r.OnDatagram(1, "step");
  EXPECT_TRUE(r.OnLine(1, "rank 1 reports by datagram: not read").empty());
  EXPECT_EQ(r.unmatched_lines(), 0);
  r.OnLine(0, "Epoch 0:  12%|#2   | 12/100 [00:01<00:10]");
  r.OnLine(0, std::string(300, 'x'));
  EXPECT_FALSE(r.matched());
  EXPECT_EQ(r.unmatched_lines(), 2);
  EXPECT_EQ(r.last_unmatched(), std::string(OutputReports::kLastLineBytes, 'x'));
  r.OnLine(0, "step 1");
  r.OnLine(0, "validation banner");
  EXPECT_TRUE(r.matched());
  EXPECT_EQ(r.unmatched_lines(), 2) << "not counted once the pattern matched";
}

TEST(OutputReports, ARankThatSaidReadyStandsOnlyForItself) {
  // It uses the client library for something (ready, stacks) but reports
  // its steps through its output.
  OutputReports r(Compile(R"(step (?P<step>\d+))"), 2);
  r.OnDatagram(0, "ready");
  EXPECT_THAT(r.OnLine(0, "step 1"), ElementsAre(Step(0, 1)));
}

// ---- The patterns docs/progress_pattern.md documents, on its sample lines ----

struct DocumentedCase {
  std::string pattern, line;
  int64_t step;
  std::optional<double> loss;
};

TEST(DocumentedPatterns, MatchTheirSampleLines) {
  const std::vector<DocumentedCase> cases = {
      // A plain per-step print.
      {R"(step (?P<step>\d+) loss (?P<loss>\S+))", "step 12 loss 3.1", 12, 3.1},
      {R"(step (?P<step>\d+))", "step 12 loss 3.1", 12, std::nullopt},
      // Hugging Face Trainer (tqdm).
      {R"((?P<step>\d+)/\d+ \[)", " 10%|\xe2\x96\x88         | 50/500 [00:10<01:30,  5.00it/s]", 50,
       std::nullopt},
      {R"((?P<step>\d+)/500 \[)", " 10%|\xe2\x96\x88         | 50/500 [00:10<01:30,  5.00it/s]", 50,
       std::nullopt},
      // PyTorch Lightning (tqdm, per-epoch counter).
      {R"(Epoch \d+: .*?(?P<step>\d+)/\d+ \[)",
       "Epoch 0:  50%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88     | 50/100 "
       "[00:05<00:05, 10.00it/s, v_num=0, loss=2.3]",
       50, std::nullopt},
      {R"(Epoch \d+: .*?(?P<step>\d+)/\d+ \[.*loss=(?P<loss>[^,\]]+))",
       "Epoch 0:  50%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88     | 50/100 "
       "[00:05<00:05, 10.00it/s, v_num=0, loss=2.3]",
       50, 2.3},
  };
  for (const DocumentedCase& c : cases) {
    SCOPED_TRACE(c.pattern);
    std::optional<ProgressMatch> m = Compile(c.pattern).Match(c.line);
    ASSERT_TRUE(m.has_value()) << c.line;
    EXPECT_EQ(m->step, c.step);
    EXPECT_EQ(m->loss.has_value(), c.loss.has_value());
    if (m->loss && c.loss) EXPECT_DOUBLE_EQ(*m->loss, *c.loss);
  }
}

TEST(DocumentedPatterns, IgnoreTheLinesTheyShouldIgnore) {
  // An evaluation bar is no training step once the pattern names the total,
  // nor is Lightning's validation bar with a pattern anchored on "Epoch N:".
  EXPECT_FALSE(Compile(R"((?P<step>\d+)/500 \[)")
                   .Match(" 40%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88      | 10/25 "
                          "[00:01<00:01, 9.50it/s]")
                   .has_value());
  EXPECT_FALSE(Compile(R"(Epoch \d+: .*?(?P<step>\d+)/\d+ \[)")
                   .Match("Validation DataLoader 0:  40%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2"
                          "\x96\x88      | 10/25 [00:01<00:01, 9.50it/s]")
                   .has_value());
  // A Lightning epoch's bar restarts: steps go on counting up.
  ProgressPattern lightning = Compile(R"(Epoch \d+: .*?(?P<step>\d+)/\d+ \[)");
  OutputProgress p;
  for (const char* line :
       {"Epoch 0: 100%|##########| 100/100 [00:10<00:00, 10.00it/s, v_num=0, loss=2.1]",
        "Epoch 1:   0%|          | 0/100 [00:00<?, ?it/s, v_num=0, loss=2.1]",
        "Epoch 1:   1%|          | 1/100 [00:00<00:10, 10.00it/s, v_num=0, loss=2.1]"}) {
    (void)p.Observe(lightning.Match(line)->step);
  }
  EXPECT_EQ(p.completed(), 101);
}

}  // namespace

// What each preset counts in the real output of its framework, captured from
// PyPI's releases with the scripts beside it (tests/testdata/progress/:
// torch 2.15, CPU, stdout and stderr into one pipe, as the agent reads them).
struct Counted {
  int64_t steps = 0;   // the count after the last line
  int reports = 0;     // step reports sent
  int with_loss = 0;   // of them, with a loss
  int64_t first = -1;  // the first count reported
};

Counted CountFile(const std::string& preset, const std::string& file) {
  const std::string text = testing_support::ReadAll(std::string(ENDURE_PROGRESS_DIR) + "/" + file);
  EXPECT_FALSE(text.empty()) << file;
  OutputReports reports(Compile(ExpandProgressPattern(preset)), 1);
  LineSplitter splitter;
  Counted c;
  splitter.Feed(text, [&](std::string_view line) {
    for (const OutputReport& r : reports.OnLine(0, line)) {
      if (r.kind != OutputReport::Kind::kStep) continue;
      if (c.first < 0) c.first = r.step;
      c.steps = r.step;
      ++c.reports;
      if (r.loss) ++c.with_loss;
    }
  });
  return c;
}

// A Hugging Face Trainer 5.25 run of 60 steps that evaluates every 25 (a bar
// of 8 batches each time) and saves every 20 (a bar of its own): 60 steps,
// where the pattern the docs gave before counted the other bars as counter
// restarts.
TEST(ProgressPresets, HuggingFaceCountsTheTrainersStepsAndNotItsOtherBars) {
  const Counted c = CountFile("huggingface", "huggingface_trainer_5.25.txt");
  EXPECT_EQ(c.steps, 60);
  EXPECT_EQ(c.first, 3);  // the first redraw after step 0
  const Counted before = CountFile(R"((?P<step>\d+)/\d+ \[)", "huggingface_trainer_5.25.txt");
  EXPECT_GT(before.steps, 60);
}

// Lightning 2.6 with its tqdm bar: 50 steps over epochs of 20 batches (the
// last cut to 10 by max_steps), validation every 10; the loss the program
// logs with prog_bar=True comes with the steps.
TEST(ProgressPresets, LightningCountsEveryEpochsBatchesAndTheirLoss) {
  const Counted c = CountFile("lightning", "lightning_2.6_tqdm.txt");
  EXPECT_EQ(c.steps, 50);
  EXPECT_EQ(c.first, 1);
  EXPECT_EQ(c.with_loss, c.reports - 1);  // the first redraw of step 1 shows no loss yet
}

// Lightning's default bar with `rich` installed draws nothing into a pipe
// until the run ends: no pattern can count its steps, and the preset
// matches none of its lines (the warning for a pattern that matches
// nothing fires; docs/progress_pattern.md says what to do).
TEST(ProgressPresets, LightningsRichBarShowsNoStepInAPipe) {
  const Counted c = CountFile("lightning", "lightning_2.6_rich.txt");
  EXPECT_EQ(c.reports, 0);
}

TEST(ProgressPresets, ANameThatIsNoPresetIsAPattern) {
  EXPECT_EQ(ExpandProgressPattern("step (?P<step>\\d+)"), "step (?P<step>\\d+)");
  EXPECT_EQ(ExpandProgressPattern("Lightning"), "Lightning");  // names are exact
  for (const ProgressPreset& p : ProgressPresets()) {
    EXPECT_TRUE(ProgressPattern::Compile(p.pattern).ok()) << p.name;
  }
}

}  // namespace endure::core
