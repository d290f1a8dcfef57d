#include "core/log_classifier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/config_files.h"

namespace endure::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// --- Loading and validation --------------------------------------------------

LogClassifier MustLoad(std::string_view toml) {
  Result<LogClassifier> c = LogClassifier::FromToml(toml, "rules.toml");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

std::string LoadError(std::string_view toml) {
  Result<LogClassifier> c = LogClassifier::FromToml(toml, "rules.toml");
  EXPECT_FALSE(c.ok());
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  return c.status().message();
}

TEST(LogClassifierLoad, SyntaxErrorNamesFileAndLine) {
  EXPECT_THAT(LoadError("[[rule]]\nname = \"a\"\npattern = 'x\n"),
              StartsWith("rules.toml:3: TOML syntax error: "));
}

TEST(LogClassifierLoad, UnknownKeyNamesLineRuleAndTheValidKeys) {
  EXPECT_EQ(LoadError("[[rule]]\nname = \"a\"\npattern = 'x'\ncause = \"c\"\nacton = \"stop\"\n"),
            "rules.toml:5: rule \"a\": unknown key \"acton\"; the keys of a rule are name, "
            "pattern, cause, action, priority, description, examples, context");
  EXPECT_EQ(LoadError("rules = 1\n"),
            "rules.toml:1: unknown top-level key \"rules\"; the file holds [[rule]] tables only");
}

TEST(LogClassifierLoad, WrongTypesAndMissingKeys) {
  EXPECT_EQ(LoadError("[[rule]]\nname = \"a\"\npattern = 'x'\ncause = \"c\"\naction = "
                      "\"stop\"\npriority = \"high\"\n"),
            "rules.toml:6: rule \"a\": \"priority\" must be an integer (higher wins)");
  EXPECT_EQ(LoadError("[[rule]]\nname = \"a\"\npattern = 7\n"),
            "rules.toml:3: rule \"a\": \"pattern\" must be a string");
  EXPECT_EQ(LoadError("[[rule]]\nname = \"a\"\npattern = 'x'\ncause = \"c\"\n"),
            "rules.toml:1: rule \"a\": the key \"action\" is missing");
  EXPECT_EQ(
      LoadError("\n[[rule]]\nname = \"a\"\npattern = 'x'\ncause = \"c\"\naction = \"reboot\"\n"),
      "rules.toml:6: rule \"a\": unknown action \"reboot\"; expected one of restart, "
      "evict_node, stop, investigate, stop_if_repeated");
  EXPECT_EQ(LoadError("rule = 3\n"),
            "rules.toml:1: \"rule\" must be an array of tables: write each rule as [[rule]]");
  EXPECT_EQ(LoadError("# nothing\n"), "rules.toml: no rules: add [[rule]] tables");
}

TEST(LogClassifierLoad, BadPatternNamesTheRuleAndRe2) {
  const std::string e = LoadError(
      "[[rule]]\nname = \"a\"\ncause = \"c\"\naction = \"stop\"\n\n"
      "[[rule]]\nname = \"b\"\npattern = 'Xid (\\d+'\ncause = \"c\"\naction = \"stop\"\n");
  EXPECT_THAT(e, StartsWith("rules.toml:1: rule \"a\": the key \"pattern\" is missing"));
  const std::string e2 = LoadError(
      "[[rule]]\nname = \"b\"\npattern = 'Xid (\\d+'\ncause = \"c\"\naction = \"stop\"\n");
  EXPECT_THAT(e2, StartsWith("rules.toml:3: rule \"b\": the pattern does not compile: missing "));
  EXPECT_THAT(e2, HasSubstr("RE2 syntax"));
}

TEST(LogClassifierLoad, CausePlaceholdersMustNameGroups) {
  EXPECT_THAT(LoadError("[[rule]]\nname = \"x\"\npattern = 'Xid (\\d+)'\ncause = \"xid_{xid}\"\n"
                        "action = \"stop\"\n"),
              StartsWith("rules.toml:4: rule \"x\": the cause \"xid_{xid}\" uses {xid}, but the "
                         "pattern has no group named that; name a group with (?P<xid>...)"));
  EXPECT_THAT(LoadError("[[rule]]\nname = \"x\"\npattern = 'a'\ncause = \"c_{\"\naction = "
                        "\"stop\"\n"),
              HasSubstr("has a '{' without a '}'"));
}

TEST(LogClassifierLoad, DuplicateNames) {
  EXPECT_THAT(
      LoadError("[[rule]]\nname = \"a\"\npattern = 'x'\ncause = \"c\"\naction = \"stop\"\n"
                "[[rule]]\nname = \"a\"\npattern = 'y'\ncause = \"c\"\naction = \"stop\"\n"),
      "rules.toml:6: rule \"a\": another rule has the same name (rules.toml:1); give each "
      "rule its own");
}

TEST(LogClassifierLoad, SeveralFilesAreOneListAndErrorsNameTheFile) {
  const std::string rule_a =
      "[[rule]]\nname = \"a\"\npattern = 'x'\ncause = \"a\"\naction = \"stop\"\n";
  const std::string rule_b =
      "# site rules\n[[rule]]\nname = \"b\"\npattern = 'x'\ncause = \"b\"\naction = \"restart\"\n";
  Result<LogClassifier> c =
      LogClassifier::FromTomlFiles({{"d/10_a.toml", rule_a}, {"d/20_b.toml", rule_b}}, "d");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->source(), "d");
  EXPECT_EQ(c->Classify("x")->rule, "a");  // equal priority: the earlier file first
  ASSERT_EQ(c->rules().size(), 2u);
  EXPECT_EQ(c->rules()[1]->file, "d/20_b.toml");

  Result<LogClassifier> dup =
      LogClassifier::FromTomlFiles({{"d/10_a.toml", rule_a}, {"d/20_a.toml", rule_a}}, "d");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().message(),
            "d/20_a.toml:1: rule \"a\": another rule has the same name (d/10_a.toml:1); give "
            "each rule its own");
  Result<LogClassifier> bad = LogClassifier::FromTomlFiles(
      {{"d/10_a.toml", rule_a}, {"d/20_b.toml", rule_b + "acton = 1\n"}}, "d");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              StartsWith("d/20_b.toml:7: rule \"b\": unknown key \"acton\""));
}

// --- Matching semantics ------------------------------------------------------

constexpr std::string_view kSmallRules = R"(
[[rule]]
name = "low"
pattern = 'error'
cause = "generic"
action = "investigate"

[[rule]]
name = "high"
priority = 10
pattern = 'Xid (?P<xid>\d+)'
cause = "xid_{xid}"
action = "evict_node"

[[rule]]
name = "low_second"
pattern = 'error'
cause = "never"
action = "restart"
)";

TEST(LogClassifier, HighestPriorityWinsThenFileOrder) {
  LogClassifier c = MustLoad(kSmallRules);
  auto m = c.Classify("an error here\nthen Xid 79 there\n");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rule, "high");
  EXPECT_EQ(m->cause, "xid_79");
  EXPECT_EQ(m->action, LogAction::kEvictNode);
  EXPECT_EQ(m->line, "then Xid 79 there");
  EXPECT_EQ(m->line_number, 2);
  EXPECT_THAT(m->captures, ElementsAre(std::pair<const std::string, std::string>("xid", "79")));

  m = c.Classify("some error");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rule, "low");  // equal priority: listed first

  std::vector<LogMatch> all = c.ClassifyAll("error and Xid 5");
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].rule, "high");
  EXPECT_EQ(all[1].rule, "low");
  EXPECT_EQ(all[2].rule, "low_second");

  EXPECT_FALSE(c.Classify("all fine").has_value());
  EXPECT_FALSE(c.Classify("").has_value());
}

TEST(LogClassifier, FirstMatchingLineIsRecordedAndCarriageReturnsAndColoursAreStripped) {
  LogClassifier c = MustLoad(kSmallRules);
  auto m = c.Classify("ok\r\n\x1b[31mXid\x1b[0m 13 first\r\nXid 14 second\r\n");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->cause, "xid_13");
  EXPECT_EQ(m->line, "Xid 13 first");
  EXPECT_EQ(m->line_number, 2);
}

TEST(LogClassifier, ContextMustMatchSomeLineOfTheExcerpt) {
  LogClassifier c = MustLoad(R"(
[[rule]]
name = "slurm_oom"
priority = 10
pattern = 'task \d+: Killed'
context = 'oom-kill event'
cause = "slurm_oom"
action = "restart"

[[rule]]
name = "killed"
pattern = 'task \d+: Killed'
cause = "killed"
action = "investigate"
)");
  EXPECT_EQ(c.Classify("srun: error: n1: task 3: Killed\n")->rule, "killed");
  auto m = c.Classify(
      "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=42.0.\n"
      "srun: error: n1: task 3: Killed\n");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rule, "slurm_oom");
  EXPECT_EQ(m->line_number, 2);  // the pattern's line is recorded, not the context's
  EXPECT_THAT(LoadError("[[rule]]\nname = \"a\"\npattern = 'x'\ncontext = '(y'\ncause = "
                        "\"c\"\naction = \"stop\"\n"),
              StartsWith("rules.toml:4: rule \"a\": the context does not compile: "));
}

TEST(LogClassifier, AChainedTracebackIsClassifiedByItsFirstExceptionUnlessHardwareFollows) {
  LogClassifier c = MustLoad(R"(
[[rule]]
name = "gpu"
priority = 100
pattern = 'uncorrectable ECC'
cause = "ecc"
action = "evict_node"

[[rule]]
name = "peer"
priority = 50
pattern = 'remote process exited'
cause = "nccl_error"
action = "restart"

[[rule]]
name = "key"
priority = 20
pattern = '^KeyError'
cause = "user_error"
action = "stop"

[[rule]]
name = "traceback"
priority = 5
pattern = '^Traceback'
cause = "user_exception"
action = "investigate"
)");
  const std::string first =
      "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n"
      "KeyError: 'lr'\n\nDuring handling of the above exception, another exception occurred:\n\n";
  const std::string second =
      "Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\n"
      "RuntimeError: NCCL error: remote process exited or there was a network error\n";
  // A peer error of higher priority follows, but the KeyError is the root.
  auto m = c.Classify(first + second);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rule, "key");
  EXPECT_EQ(m->line_number, 3);
  std::vector<LogMatch> all = c.ClassifyAll(first + second);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1].rule, "traceback");
  EXPECT_EQ(all[2].rule, "peer");  // after the chain: listed last
  // Without the chain the same lines are weighed by priority alone.
  EXPECT_EQ(c.Classify("KeyError: 'lr'\nRuntimeError: remote process exited\n")->rule, "peer");
  // Broken hardware counts wherever it is.
  EXPECT_EQ(
      c.Classify(first + "RuntimeError: CUDA error: uncorrectable ECC error encountered\n")->rule,
      "gpu");
  // The other phrasing of a chain.
  EXPECT_EQ(c.Classify("KeyError: 'lr'\n\nThe above exception was the direct cause of the "
                       "following exception:\n\nRuntimeError: remote process exited\n")
                ->rule,
            "key");
}

TEST(LogClassifier, CheckExamplesReportsMisclassifiedExamples) {
  LogClassifier c = MustLoad(R"(
[[rule]]
name = "a"
pattern = 'foo'
cause = "a"
action = "stop"
examples = ["foo", "bar", "Xid 3 foo"]

[[rule]]
name = "x"
priority = 5
pattern = 'Xid'
cause = "x"
action = "stop"
)");
  Status s = c.CheckExamples();
  EXPECT_EQ(s.message(),
            "2 rule examples not classified by their own rule:\n"
            "  rules.toml:2: rule \"a\": example \"bar\" is matched by no rule\n"
            "  rules.toml:2: rule \"a\": example \"Xid 3 foo\" is classified by rule \"x\" (cause "
            "x, priority wins)");
}

TEST(LogClassifier, CreateFromCode) {
  std::vector<LogRule> rules(1);
  rules[0].name = "disk";
  rules[0].pattern = "No space left";
  rules[0].cause = "disk_full";
  rules[0].action = LogAction::kStop;
  Result<LogClassifier> c = LogClassifier::Create(std::move(rules));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->Classify("x: No space left on device")->cause, "disk_full");
  EXPECT_EQ(LogActionName(LogAction::kEvictNode), "evict_node");
  EXPECT_EQ(*ParseLogAction("investigate"), LogAction::kInvestigate);
  EXPECT_EQ(*ParseLogAction("stop_if_repeated"), LogAction::kStopIfRepeated);
}

// --- Splitting input ---------------------------------------------------------

std::vector<std::string> Texts(const std::vector<LogExcerpt>& excerpts) {
  std::vector<std::string> out;
  for (const LogExcerpt& e : excerpts) out.push_back(e.text);
  return out;
}

TEST(SplitExcerpts, BlankLinesSeparateExcerpts) {
  std::vector<LogExcerpt> parts = SplitExcerpts("\n\na\nb\n\n  \nc\r\n\n");
  EXPECT_THAT(Texts(parts), ElementsAre("a\nb\n", "c\n"));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].first_line, 3);
  EXPECT_EQ(parts[0].last_line, 4);
  EXPECT_EQ(parts[1].first_line, 7);
  EXPECT_EQ(parts[1].last_line, 7);
  EXPECT_THAT(Texts(SplitExcerpts("")), ElementsAre());
  EXPECT_THAT(Texts(SplitExcerpts("one line without newline")),
              ElementsAre("one line without newline\n"));
}

TEST(SplitExcerpts, ChainedTracebackStaysTogether) {
  const std::string chained =
      "Traceback (most recent call last):\n"
      "  File \"train.py\", line 10, in load\n"
      "    return table[key]\n"
      "KeyError: 'wq'\n"
      "\n"
      "During handling of the above exception, another exception occurred:\n"
      "\n"
      "Traceback (most recent call last):\n"
      "  File \"train.py\", line 20, in <module>\n"
      "    load()\n"
      "RuntimeError: checkpoint is missing 'wq'\n"
      "\n"
      "next excerpt\n";
  std::vector<std::string> parts = Texts(SplitExcerpts(chained));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_THAT(parts[0], HasSubstr("KeyError: 'wq'\n\nDuring handling"));
  EXPECT_THAT(parts[0], HasSubstr("occurred:\n\nTraceback"));
  EXPECT_EQ(parts[1], "next excerpt\n");
}

TEST(SplitNonBlankLines, DropsBlankLines) {
  std::vector<LogExcerpt> lines = SplitNonBlankLines("a\n\n b \r\n\t\nc");
  EXPECT_THAT(Texts(lines), ElementsAre("a\n", " b \n", "c\n"));
  EXPECT_EQ(lines[2].first_line, 5);
}

// --- The shipped rules against real-world output ----------------------------

LogClassifier ShippedRules() {
  Result<std::vector<TextFile>> files = ReadConfigFiles(ENDURE_LOG_RULES_PATH, ".toml");
  EXPECT_TRUE(files.ok()) << files.status().ToString();
  Result<LogClassifier> c = LogClassifier::FromTomlFiles(
      files.ok() ? *files : std::vector<TextFile>{}, ENDURE_LOG_RULES_PATH);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

TEST(ShippedLogRules, LoadAndEveryExampleIsClassifiedByItsRule) {
  LogClassifier c = ShippedRules();
  EXPECT_GE(c.rules().size(), 30u);
  Status s = c.CheckExamples();
  EXPECT_TRUE(s.ok()) << s.message();
  for (const LogRule* rule : c.rules()) {
    EXPECT_FALSE(rule->examples.empty()) << rule->name << " has no example";
    EXPECT_FALSE(rule->description.empty()) << rule->name << " has no description";
  }
}

struct Case {
  std::string excerpt;
  std::string cause;
  LogAction action;
  std::string rule;
  std::string line;  // the line that must be recorded; "" to skip
};

void ExpectClassified(const LogClassifier& c, const Case& k) {
  SCOPED_TRACE(k.excerpt.substr(0, 100));
  std::optional<LogMatch> m = c.Classify(k.excerpt);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->cause, k.cause);
  EXPECT_EQ(m->action, k.action) << LogActionName(m->action);
  EXPECT_EQ(m->rule, k.rule);
  if (!k.line.empty()) {
    EXPECT_EQ(m->line, k.line);
  }
}

TEST(ShippedLogRules, KernelXidLines) {
  LogClassifier c = ShippedRules();
  const std::vector<Case> cases = {
      {"[ 3342.918213] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
       "xid_79", LogAction::kEvictNode, "xid_restart_bm", ""},
      {"kernel: NVRM: Xid (PCI:0000:b7:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
       "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6.",
       "xid_48", LogAction::kEvictNode, "xid_workflow_48", ""},
      // Catalogue RESTART_APP: a contained memory error ends only the application using it.
      {"NVRM: Xid (PCI:0000:4e:00): 94, pid=30211, name=python, Contained: SM (0x1). RST: No, "
       "D-RST: No",
       "xid_94", LogAction::kRestart, "xid_restart_app", ""},
      // Catalogue IGNORE: the row remap is recorded; it takes effect at the next reset.
      {"NVRM: Xid (PCI:0000:18:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row "
       "(0x00000000003d2c10) Marked for Remapping, reset gpu to activate.",
       "xid_63", LogAction::kRestart, "xid_ignore", ""},
      // Catalogue RESTART_APP: faults of one application's channel; the GPU stays in service.
      {"NVRM: Xid (PCI:0000:18:00): 31, pid=3517, name=python, Ch 00000008, intr 10000000. MMU "
       "Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_4c000000.",
       "xid_31", LogAction::kRestart, "xid_restart_app", ""},
      {"NVRM: Xid (PCI:0000:18:00): 13, pid=3517, name=python, Graphics SM Warp Exception on "
       "(GPC 0, TPC 1, SM 0): Out Of Range Address",
       "xid_13", LogAction::kRestart, "xid_restart_app", ""},
      // An NVLink5 Xid without the Fatal/Nonfatal word the catalogue's decode needs.
      {"NVRM: Xid (PCI:0000:18:00): 149, pid=1, name=x, something new", "xid_149",
       LogAction::kInvestigate, "xid_unclassified", ""},
      // NVLink5 by the severity printed (tests/log_corpus/gpu.toml).
      {"NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 "
       "0x00000000 0x00000000 0x00000000 0x00000000)",
       "xid_149", LogAction::kEvictNode, "xid_nvlink5_fatal", ""},
      {"NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 "
       "0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
       "xid_145", LogAction::kRestart, "xid_nvlink5_nonfatal", ""},
      // Xid 45 follows the Xid it names; alone it is a process's channels torn down.
      {"kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by "
       "previous Xid 149",
       "xid_149", LogAction::kEvictNode, "xid_45_after_hardware", ""},
      {"Mar 27 17:40:36 kernel: NVRM: Xid (PCI:0000:01:00): 45, pid=12542, name=VLLM::Worker, "
       "channel 0x00000002",
       "xid_45", LogAction::kRestart, "xid_45", ""},
      // Xid 79 wins over the NCCL timeout it causes on the same node.
      {"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
       "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600000 milliseconds "
       "before timing out.\n"
       "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
       "xid_79", LogAction::kEvictNode, "xid_restart_bm",
       "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."},
  };
  for (const Case& k : cases) ExpectClassified(c, k);
}

TEST(ShippedLogRules, NcclAndGloo) {
  LogClassifier c = ShippedRules();
  const std::string watchdog_excerpt =
      "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation "
      "timeout: WorkNCCL(SeqNum=4262, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
      "Timeout(ms)=600000) ran for 600000 milliseconds before timing out.\n"
      "[rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Timeout at NCCL work: 4262, last "
      "enqueued NCCL work: 4262, last completed NCCL work: 4261.\n"
      "[rank1]:[E ProcessGroupNCCL.cpp:577] [Rank 1] Some NCCL operations have failed or timed "
      "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run "
      "on corrupted/incomplete data.\n"
      "[rank1]:[E ProcessGroupNCCL.cpp:583] [Rank 1] To avoid data inconsistency, we are taking "
      "the entire process down.\n"
      "terminate called after throwing an instance of 'c10::DistBackendError'\n"
      "  what():  [PG 0 Rank 1] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=4262, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
      "for 600000 milliseconds before timing out.\n";
  ExpectClassified(
      c, {watchdog_excerpt, "nccl_timeout", LogAction::kRestart, "nccl_watchdog_timeout", ""});
  std::optional<LogMatch> m = c.Classify(watchdog_excerpt);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->line_number, 1);
  EXPECT_EQ(m->captures.at("op"), "ALLREDUCE");
  EXPECT_EQ(m->captures.at("seq"), "4262");

  const std::vector<Case> cases = {
      {"torch.distributed.DistBackendError: NCCL error in: "
       "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run "
       "with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n"
       "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
       "device error.\nLast error:\nsocketStartConnect: Connect to 10.0.0.2<60123> failed : "
       "Software caused connection abort",
       // The "Last error" names the cause: the connection to the peer was aborted.
       "socket_error", LogAction::kRestart, "nccl_peer_socket_closed",
       "socketStartConnect: Connect to 10.0.0.2<60123> failed : Software caused connection "
       "abort"},
      // Without a "Last error" an NCCL system/CUDA error is ambiguous.
      {"RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:38, unhandled "
       "cuda error, NCCL version 2.7.8",
       "nccl_error", LogAction::kInvestigate, "nccl_system_error", ""},
      {"RuntimeError: NCCL communicator was aborted on rank 3.  Original reason for failure was: "
       "NCCL error: remote process exited or there was a network error",
       "nccl_remote_error", LogAction::kRestart, "nccl_remote_error", ""},
      {"host-7:2041:2203 [1] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from "
       "peer 10.1.4.17<53214> with error 12, opcode 1, len 0, vendor err 129 (Send)",
       "ib_error", LogAction::kInvestigate, "ib_completion_error", ""},
      // NCCL refused the call: the program is wrong on any node.
      {"torch.distributed.DistBackendError: NCCL error in: "
       "../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid usage (run with "
       "NCCL_DEBUG=WARN for details), NCCL version 2.20.5",
       "user_error", LogAction::kStop, "nccl_invalid_usage", ""},
      {"RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by "
       "peer [127.0.0.1]:31245",
       "gloo_error", LogAction::kRestart, "gloo_peer_lost", ""},
      {"RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
       "waiting 1800000ms for recv operation to complete",
       "gloo_timeout", LogAction::kRestart, "gloo_timeout", ""},
  };
  for (const Case& k : cases) ExpectClassified(c, k);
}

TEST(ShippedLogRules, MemoryAndDisk) {
  LogClassifier c = ShippedRules();
  const std::vector<Case> cases = {
      {"[1234567.890123] Out of memory: Killed process 1234 (python) total-vm:104857600kB, "
       "anon-rss:98765432kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:200000kB "
       "oom_score_adj:0",
       "oom", LogAction::kRestart, "oom_killer", ""},
      {"[rank0]: Traceback (most recent call last):\n"
       "[rank0]:   File \"/workspace/train.py\", line 141, in <module>\n"
       "[rank0]:     loss.backward()\n"
       "[rank0]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
       "GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is free.",
       "cuda_oom", LogAction::kStop, "cuda_oom",
       "[rank0]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU "
       "0 has a total capacity of 79.15 GiB of which 1.23 GiB is free."},
      {"Traceback (most recent call last):\n"
       "  File \"/usr/lib/python3/dist-packages/torch/serialization.py\", line 441, in save\n"
       "    _save(obj, opened_zipfile, pickle_module, pickle_protocol)\n"
       "OSError: [Errno 28] No space left on device",
       "disk_full", LogAction::kStopIfRepeated, "disk_full",
       "OSError: [Errno 28] No space left on device"},
  };
  for (const Case& k : cases) ExpectClassified(c, k);
}

// Every shipped rule names a cause the catalogue knows: what it means to the
// recovery policy (class, strike, collective) was decided, not defaulted. A
// rule of a cause outside it is listed, with where it is.
TEST(ShippedLogRules, EveryCauseIsInTheCatalogue) {
  LogClassifier c = ShippedRules();
  EXPECT_EQ(UncataloguedCauses(c), std::vector<std::string>{});
  Result<LogClassifier> site = LogClassifier::FromToml(
      "[[rule]]\nname = \"hca\"\npattern = 'mlx5: fw fatal'\ncause = \"hca_firmware\"\n"
      "action = \"evict_node\"\n[[rule]]\nname = \"xid\"\npattern = 'Xid (?P<xid>\\d+)'\n"
      "cause = \"xid_{xid}\"\naction = \"investigate\"\n",
      "90_site.toml");
  ASSERT_TRUE(site.ok()) << site.status().message();
  const std::vector<std::string> listed = UncataloguedCauses(*site);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].rfind("90_site.toml:4: rule \"hca\": the cause \"hca_firmware\" is not in "
                            "Endure's cause catalogue",
                            0),
            0u)
      << listed[0];
}

TEST(ShippedLogRules, CudaErrors) {
  LogClassifier c = ShippedRules();
  const std::vector<Case> cases = {
      // Bare illegal memory access: a bug in the program's kernel recurs at the
      // same step (one restart confirms it); hardware shows an Xid (below).
      {"Traceback (most recent call last):\n"
       "  File \"train.py\", line 90, in <module>\n"
       "    torch.cuda.synchronize()\n"
       "RuntimeError: CUDA error: an illegal memory access was encountered\n"
       "CUDA kernel errors might be asynchronously reported at some other API call, so the "
       "stacktrace below might be incorrect.\n"
       "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
       "cuda_error", LogAction::kStopIfRepeated, "cuda_illegal_memory_access",
       "RuntimeError: CUDA error: an illegal memory access was encountered"},
      // The same with Xid 48 in the kernel log next to it: hardware.
      {"RuntimeError: CUDA error: an illegal memory access was encountered\n"
       "NVRM: Xid (PCI:0000:3b:00): 48, pid=88, name=python, An uncorrectable double bit error",
       "xid_48", LogAction::kEvictNode, "xid_workflow_48", ""},
      {"RuntimeError: CUDA error: uncorrectable ECC error encountered", "ecc_uncorrectable",
       LogAction::kEvictNode, "ecc_uncorrectable", ""},
      {"RuntimeError: CUDA error: device-side assert triggered\nCompile with "
       "`TORCH_USE_CUDA_DSA` to enable device-side assertions.",
       "cuda_device_assert", LogAction::kStop, "cuda_device_assert", ""},
  };
  for (const Case& k : cases) ExpectClassified(c, k);
}

TEST(ShippedLogRules, PythonTracebacks) {
  LogClassifier c = ShippedRules();
  const std::string traceback =
      "Traceback (most recent call last):\n"
      "  File \"/workspace/train.py\", line 212, in <module>\n"
      "    main()\n"
      "  File \"/workspace/train.py\", line 180, in main\n"
      "    batch = next(loader)\n"
      "  File \"/workspace/data.py\", line 57, in __next__\n"
      "    raise ValueError(f\"shard {path} is empty\")\n"
      "ValueError: shard /data/shard_00017.bin is empty\n";
  ExpectClassified(c, {traceback, "user_error", LogAction::kStop, "python_program_error",
                       "ValueError: shard /data/shard_00017.bin is empty"});
  EXPECT_EQ(c.Classify(traceback)->captures.at("exception"), "ValueError");

  // A chained traceback records the root exception, which comes first.
  const std::string chained =
      "Traceback (most recent call last):\n"
      "  File \"ckpt.py\", line 10, in load\n"
      "    return state[key]\n"
      "KeyError: 'layers.0.attention.wq.weight'\n"
      "\n"
      "The above exception was the direct cause of the following exception:\n"
      "\n"
      "Traceback (most recent call last):\n"
      "  File \"train.py\", line 20, in <module>\n"
      "    load()\n"
      "checkpoint.CheckpointError: cannot restore step 1200\n";
  ASSERT_EQ(SplitExcerpts(chained).size(), 1u);
  ExpectClassified(c, {chained, "user_error", LogAction::kStop, "python_program_error",
                       "KeyError: 'layers.0.attention.wq.weight'"});
  EXPECT_EQ(c.Classify(chained)->captures.at("exception"), "KeyError");

  const std::vector<Case> cases = {
      {"  File \"/workspace/train.py\", line 88\n    for step in range(steps)\n"
       "                            ^\nSyntaxError: expected ':'",
       "user_error", LogAction::kStop, "python_syntax_error", ""},
      {"[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 1, in "
       "<module>\n[rank0]: torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
       "user_exception", LogAction::kInvestigate, "python_traceback", ""},
      // A non-finite gradient norm: a bad learning rate or data, or silent
      // data corruption on one GPU; not a deterministic AssertionError.
      {"[default3]:AssertionError: grad norm is not finite", "loss_nan", LogAction::kInvestigate,
       "loss_nan", ""},
      // An exception no rule knows: investigate.
      {"Traceback (most recent call last):\n  File \"train.py\", line 20, in <module>\n"
       "    load()\ncheckpoint.CheckpointError: cannot restore step 1200",
       "user_exception", LogAction::kInvestigate, "user_exception",
       "checkpoint.CheckpointError: cannot restore step 1200"},
      {"[stderr]ModuleNotFoundError: No module named 'tensorboard'", "user_error", LogAction::kStop,
       "python_import_error", ""},
  };
  for (const Case& k : cases) ExpectClassified(c, k);
}

TEST(ShippedLogRules, OrdinaryTrainingOutputIsNothing) {
  LogClassifier c = ShippedRules();
  const std::vector<std::string> lines = {
      "step 1200 | loss 2.4312 | lr 2.9e-04 | grad_norm 0.93 | tokens/s 152,311 | mfu 41.2%",
      "[rank0]: step 10 done in 152ms",
      "gpu-node-3:1234:1290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB "
      "ib0:10.0.0.17<0>",
      "gpu-node-3:1234:1290 [0] NCCL INFO Channel 00/08 :    0   1   2   3   4   5   6   7",
      "gpu-node-3:1234:1290 [0] NCCL INFO comm 0x5581c2a0 rank 0 nranks 8 cudaDev 0 busId 18000 "
      "- Init COMPLETE",
      "gpu-node-3:1234:1290 [0] NCCL INFO Using network IB",
      "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 "
      "(errno: 99 - Cannot assign requested address).",
      "ProcessGroupNCCL initialized with following options: NCCL_ASYNC_ERROR_HANDLING: 1, "
      "NCCL_DESYNC_DEBUG: 0, NCCL_ENABLE_TIMING: 0, NCCL_BLOCKING_WAIT: 0, TIMEOUT(ms): 600000, "
      "USE_HIGH_PRIORITY_STREAM: 0",
      "Saving checkpoint to /checkpoints/step_001200 (took 3.2s)",
      "validation | loss 2.31 | perplexity 10.07 | error rate 0.12",
      "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py:557: UserWarning: This "
      "DataLoader will create 16 worker processes in total.",
      "torch.distributed.elastic.multiprocessing.redirects: [WARNING] NOTE: Redirects are "
      "currently not supported in Windows or MacOs.",
      "memory: allocated 12.3 GiB, reserved 14.0 GiB, max reserved 15.1 GiB",
      "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023",
      "| N/A   34C    P0    69W / 700W |  71234MiB / 81559MiB |     98%      Default |",
      "INFO:root:retrying download after ConnectionError (attempt 2/5)",
      "    raise ValueError(\"unreachable in normal runs\")",
      "",
  };
  for (const std::string& line : lines) {
    std::optional<LogMatch> m = c.Classify(line);
    EXPECT_FALSE(m.has_value()) << "\"" << line << "\" classified as " << m->cause << " by rule "
                                << m->rule;
  }
}

}  // namespace
}  // namespace endure::core
