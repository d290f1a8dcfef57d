// `endure classify`: runs the log classifier over text, so that operators can
// see which cause and action Endure would give their logs and check changes
// to the rules. Input (standard input, or files) is cut into excerpts at blank
// lines (--lines: one excerpt per line); for each, it prints the cause, the
// action, the rule and the matching line (--json: one JSON object per
// excerpt). --check verifies the examples in the rules file; --corpus scores
// the rules against labelled real-world excerpts (tests/log_corpus/). The
// matching is in src/core/log_classifier, the scoring in src/core/log_corpus;
// this file reads files and formats output.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/config_files.h"
#include "common/env.h"
#include "common/shipped_files.h"
#include "controller/incident_kb.h"
#include "core/incident_match.h"
#include "core/log_classifier.h"
#include "core/log_corpus.h"
#include "tools/endure/cli_util.h"
#include "tools/endure/verbs.h"

namespace endure::cli {
namespace {

using core::LogClassifier;
using core::LogExcerpt;
using core::LogMatch;
using Json = nlohmann::ordered_json;

struct ClassifyFlags {
  std::string rules;
  std::vector<std::string> inputs;
  bool json = false;
  bool lines = false;
  bool check = false;
  std::string corpus;
  std::string suggest;      // a state directory
  double min_accuracy = 0;  // --corpus: exit 1 below this share of right actions
  double max_harmful = 1;   // --corpus: exit 1 above this share of harmful ones
};

Result<std::string> FindRules(const std::string& flag) {
  if (!flag.empty()) return flag;
  return FindShippedConfig("log_rules", "--rules PATH");
}

Result<std::string> ReadInput(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  Result<std::string> text = Env::Default()->ReadFile(path);
  if (!text.ok()) return InvalidArgument("cannot read input: " + text.status().message());
  return text;
}

std::string LineRange(const LogExcerpt& e) {
  if (e.first_line == e.last_line) return "line " + std::to_string(e.first_line);
  return "lines " + std::to_string(e.first_line) + "-" + std::to_string(e.last_line);
}

Json ToJson(const std::string& source, int index, const LogExcerpt& e,
            const std::vector<LogMatch>& matches) {
  Json j;
  j["input"] = index;
  if (!source.empty()) j["file"] = source;
  j["first_line"] = e.first_line;
  j["last_line"] = e.last_line;
  if (matches.empty()) {
    j["cause"] = nullptr;
    j["action"] = nullptr;
    j["rule"] = nullptr;
    return j;
  }
  const LogMatch& m = matches.front();
  j["cause"] = m.cause;
  j["action"] = std::string(core::LogActionName(m.action));
  j["rule"] = m.rule;
  j["line_number"] = e.first_line + m.line_number - 1;
  j["line"] = m.line;
  j["captures"] = m.captures;
  Json also = Json::array();
  for (size_t i = 1; i < matches.size(); ++i) also.push_back(matches[i].rule);
  j["also_matched"] = also;
  return j;
}

void PrintHuman(const std::string& source, int index, const LogExcerpt& e,
                const std::vector<LogMatch>& matches) {
  const std::string where = (source.empty() ? "" : source + " ") + LineRange(e);
  if (matches.empty()) {
    std::printf("[%d] %s: no rule matched\n", index, where.c_str());
    return;
  }
  const LogMatch& m = matches.front();
  std::printf("[%d] %s: cause=%s action=%s rule=%s\n", index, where.c_str(), m.cause.c_str(),
              std::string(core::LogActionName(m.action)).c_str(), m.rule.c_str());
  std::printf("    line %d: %s\n", e.first_line + m.line_number - 1, m.line.c_str());
  if (matches.size() > 1) {
    std::string also;
    for (size_t i = 1; i < matches.size(); ++i) also += (i > 1 ? ", " : "") + matches[i].rule;
    std::printf("    also matched: %s\n", also.c_str());
  }
}

int RunCheck(const LogClassifier& classifier) {
  size_t examples = 0;
  std::printf("%-28s %8s  %-22s %s\n", "RULE", "PRIORITY", "CAUSE", "ACTION");
  for (const core::LogRule* r : classifier.rules()) {
    examples += r->examples.size();
    std::printf("%-28s %8d  %-22s %s\n", r->name.c_str(), r->priority, r->cause.c_str(),
                std::string(core::LogActionName(r->action)).c_str());
  }
  Status s = classifier.CheckExamples();
  if (!s.ok()) {
    std::fprintf(stderr, "endure classify: %s\n", s.message().c_str());
    return kExitUsage;
  }
  const std::vector<std::string> uncatalogued = core::UncataloguedCauses(classifier);
  for (const std::string& m : uncatalogued)
    std::fprintf(stderr, "endure classify: %s\n", m.c_str());
  if (!uncatalogued.empty()) return kExitUsage;
  std::printf(
      "%s: %zu rules; all %zu examples are classified by their own rule, every cause is "
      "in the catalogue\n",
      std::string(classifier.source()).c_str(), classifier.rules().size(), examples);
  return kExitOk;
}

std::string Percent(int n, int of) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%d/%d (%.1f%%)", n, of, of > 0 ? 100.0 * n / of : 0.0);
  return buf;
}

std::string OneLine(std::string_view text, size_t width) {
  std::string s(text.substr(0, width));
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return s;
}

// Scores the rules against a labelled corpus: per expected cause, then the
// totals and every excerpt given a wrong action.
int RunCorpus(const LogClassifier& classifier, const ClassifyFlags& flags) {
  Result<std::vector<TextFile>> files = ReadConfigFiles(flags.corpus, ".toml");
  if (!files.ok()) {
    std::fprintf(stderr, "endure classify: --corpus: %s\n", files.status().message().c_str());
    return kExitUsage;
  }
  Result<std::vector<core::CorpusExcerpt>> corpus = core::ParseLogCorpusFiles(*files);
  if (!corpus.ok()) {
    std::fprintf(stderr, "endure classify: %s\n", corpus.status().message().c_str());
    return kExitUsage;
  }
  const core::CorpusScore score = core::ScoreCorpus(classifier, *corpus);
  std::printf("corpus %s: %zu file%s, %d excerpts (%d of several lines); rules %s\n",
              flags.corpus.c_str(), files->size(), files->size() == 1 ? "" : "s", score.excerpts,
              score.multi_line, std::string(classifier.source()).c_str());
  std::printf("%-28s %8s  %-18s %s\n", "CAUSE", "EXCERPTS", "ACTION RIGHT", "CAUSE RIGHT");
  for (const core::CauseScore& c : score.by_cause) {
    std::printf("%-28s %8d  %-18s %s\n", c.cause.c_str(), c.excerpts,
                Percent(c.action_right, c.excerpts).c_str(),
                Percent(c.cause_right, c.excerpts).c_str());
  }
  std::printf("%-28s %8d  %-18s %s\n", "all", score.excerpts,
              Percent(score.action_right, score.excerpts).c_str(),
              Percent(score.cause_right, score.excerpts).c_str());
  std::printf(
      "harmful actions: %s (evict_node on a healthy node: %d; restart in place on "
      "broken hardware: %d)\n",
      Percent(score.harmful, score.excerpts).c_str(), score.evicted_healthy,
      score.restarted_on_broken);
  bool header = false;
  for (const core::CorpusOutcome& o : score.outcomes) {
    if (o.action_right) continue;
    if (!header) std::printf("wrong actions:\n");
    header = true;
    const core::CorpusExcerpt& e = *o.excerpt;
    std::printf("  %s:%d: expected %s (%s), got %s%s\n    %s\n    %s\n", e.file.c_str(), e.line,
                std::string(core::LogActionName(e.action)).c_str(), e.cause.c_str(),
                o.match ? (std::string(core::LogActionName(o.action)) + " (" + o.match->cause +
                           ", rule " + o.match->rule + ")")
                              .c_str()
                        : "no rule (restart)",
                o.harmful ? " HARMFUL" : "",
                o.match ? OneLine(o.match->line, 160).c_str() : OneLine(e.text, 160).c_str(),
                e.source.c_str());
  }
  std::fflush(stdout);
  const bool missed =
      score.ActionAccuracy() < flags.min_accuracy || score.HarmfulRate() > flags.max_harmful;
  if (missed) {
    std::fprintf(stderr,
                 "endure classify: --corpus: %.1f%% of actions right (at least %.1f%% wanted), "
                 "%.1f%% harmful (at most %.1f%% wanted)\n",
                 100 * score.ActionAccuracy(), 100 * flags.min_accuracy, 100 * score.HarmfulRate(),
                 100 * flags.max_harmful);
    return 1;
  }
  return kExitOk;
}

// Rule candidates from the incidents an operator resolved that no rule
// matched, as [[rule]] tables on standard output; checked against the rules
// in use (each must classify its own examples alongside them).
int RunSuggest(const LogClassifier& classifier, const std::vector<TextFile>& rules_files,
               const ClassifyFlags& flags) {
  Result<std::string> path =
      StateDatabase(flags.suggest, "incidents.db", "incident knowledge base");
  if (!path.ok()) return Fail("classify --suggest", path.status());
  Result<controller::IncidentKb> kb = controller::IncidentKb::OpenExisting(*path);
  if (!kb.ok()) return Fail("classify --suggest", kb.status());
  Result<std::vector<controller::KbIncident>> all = kb->List();
  if (!all.ok()) return Fail("classify --suggest", all.status());
  std::vector<core::ResolvedIncident> resolved;
  int unmatched = 0;
  for (const controller::KbIncident& k : *all) {
    if (!k.resolution) continue;
    // Resolved, and the rules in use still match nothing in it.
    if (!k.excerpt.empty() && classifier.Classify(k.excerpt).has_value()) continue;
    ++unmatched;
    if (k.excerpt.empty()) continue;
    resolved.push_back({k.id, k.excerpt, k.resolution_cause.empty() ? k.cause : k.resolution_cause,
                        *k.resolution, k.resolution_note});
  }
  const std::vector<core::RuleCandidate> candidates = core::SuggestRules(resolved);
  const std::string toml = core::RuleCandidatesToToml(candidates);
  std::fprintf(stderr,
               "endure classify --suggest: %zu rule candidate%s from %d resolved incident%s that "
               "no rule matches (%zu with a log excerpt)\n",
               candidates.size(), candidates.size() == 1 ? "" : "s", unmatched,
               unmatched == 1 ? "" : "s", resolved.size());
  if (candidates.empty()) return kExitOk;
  std::vector<TextFile> with = rules_files;
  with.push_back({"(suggested)", toml});
  Result<LogClassifier> checked = LogClassifier::FromTomlFiles(with, "(rules and suggestions)");
  Status st = checked.ok() ? checked->CheckExamples() : checked.status();
  if (!st.ok()) {
    std::fprintf(stderr, "endure classify --suggest: the candidates need work: %s\n",
                 st.message().c_str());
  }
  std::printf(
      "# Rule candidates from %s; review them, then add them to a rules file\n"
      "# (e.g. config/log_rules/90_site.toml) and run endure classify --check.\n\n%s",
      kb->path().c_str(), toml.c_str());
  return kExitOk;
}

int Run(const ClassifyFlags& flags) {
  Result<std::string> rules_path = FindRules(flags.rules);
  if (!rules_path.ok()) {
    std::fprintf(stderr, "endure classify: %s\n", rules_path.status().message().c_str());
    return kExitUsage;
  }
  Result<std::vector<TextFile>> rules_files = ReadConfigFiles(*rules_path, ".toml");
  if (!rules_files.ok()) {
    std::fprintf(stderr, "endure classify: --rules: %s\n", rules_files.status().message().c_str());
    return kExitUsage;
  }
  Result<LogClassifier> classifier = LogClassifier::FromTomlFiles(*rules_files, *rules_path);
  if (!classifier.ok()) {
    std::fprintf(stderr, "endure classify: %s\n", classifier.status().message().c_str());
    return kExitUsage;
  }
  if (flags.check) return RunCheck(*classifier);
  if (!flags.corpus.empty()) return RunCorpus(*classifier, flags);
  if (!flags.suggest.empty()) return RunSuggest(*classifier, *rules_files, flags);

  const std::vector<std::string> inputs =
      flags.inputs.empty() ? std::vector<std::string>{"-"} : flags.inputs;
  int index = 0;
  for (const std::string& input : inputs) {
    Result<std::string> text = ReadInput(input);
    if (!text.ok()) {
      std::fprintf(stderr, "endure classify: %s\n", text.status().message().c_str());
      return kExitUsage;
    }
    // Name the file only when there are several to tell apart.
    const std::string source = inputs.size() > 1 ? input : "";
    const std::vector<LogExcerpt> excerpts =
        flags.lines ? core::SplitNonBlankLines(*text) : core::SplitExcerpts(*text);
    for (const LogExcerpt& e : excerpts) {
      const std::vector<LogMatch> matches = classifier->ClassifyAll(e.text);
      ++index;
      if (flags.json) {
        std::printf("%s\n", ToJson(source, index, e, matches).dump().c_str());
      } else {
        PrintHuman(source, index, e, matches);
      }
    }
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

Verb AddClassifyVerb(CLI::App& root) {
  auto flags = std::make_shared<ClassifyFlags>();
  CLI::App* cmd = root.add_subcommand(
      "classify",
      "Classify log excerpts with the log rules: prints the cause, the action and the rule "
      "that matched, for each excerpt (text separated by blank lines) read from standard input "
      "or FILEs");
  cmd->add_option("files", flags->inputs, "Files to read ('-' for standard input; default)");
  cmd->add_option("--rules", flags->rules,
                  "Rules file, or a directory of *.toml rules files read in name order "
                  "(default: config/log_rules/ shipped with this binary)");
  cmd->add_flag("--json", flags->json, "One JSON object per excerpt (JSON Lines)");
  cmd->add_flag("--lines", flags->lines,
                "Classify every non-blank line on its own instead of blank-line-separated "
                "excerpts");
  cmd->add_flag("--check", flags->check,
                "List the rules and verify that each rule's examples are classified by it");
  cmd->add_option("--corpus", flags->corpus,
                  "Score the rules against a labelled corpus (a file or a directory of *.toml "
                  "[[excerpt]] files, as tests/log_corpus/): actions and causes right per "
                  "cause, harmful actions, and each excerpt given a wrong action");
  cmd->add_option("--suggest", flags->suggest,
                  "Print rule candidates (TOML) made from the incidents of the knowledge base in "
                  "STATE_DIR that an operator resolved (endure incidents resolve) and no rule "
                  "matches")
      ->option_text("STATE_DIR");
  cmd->add_option("--min-accuracy", flags->min_accuracy,
                  "With --corpus: exit 1 when fewer than this share of actions are right")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-harmful", flags->max_harmful,
                  "With --corpus: exit 1 when more than this share of actions are harmful")
      ->check(CLI::Range(0.0, 1.0));
  return {cmd, [flags] { return Run(*flags); }};
}

}  // namespace endure::cli
