// `endure classify`: runs the log classifier over text, so that operators can
// see which cause and action Endure would give their logs and check changes
// to the rules. Input (standard input, or files) is cut into excerpts at blank
// lines (--lines: one excerpt per line); for each, it prints the cause, the
// action, the rule and the matching line (--json: one JSON object per
// excerpt). --check verifies the examples in the rules file. The matching is
// in src/core/log_classifier; this file reads files and formats output.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/shipped_files.h"
#include "core/log_classifier.h"
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
};

Result<std::string> FindRules(const std::string& flag) {
  if (!flag.empty()) return flag;
  return FindShippedConfig("log_rules.toml", "--rules FILE");
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
  std::printf("%s: %zu rules; all %zu examples are classified by their own rule\n",
              std::string(classifier.source()).c_str(), classifier.rules().size(), examples);
  return kExitOk;
}

int Run(const ClassifyFlags& flags) {
  Result<std::string> rules_path = FindRules(flags.rules);
  if (!rules_path.ok()) {
    std::fprintf(stderr, "endure classify: %s\n", rules_path.status().message().c_str());
    return kExitUsage;
  }
  Result<std::string> rules_text = Env::Default()->ReadFile(*rules_path);
  if (!rules_text.ok()) {
    std::fprintf(stderr, "endure classify: --rules: cannot read %s: %s\n", rules_path->c_str(),
                 rules_text.status().message().c_str());
    return kExitUsage;
  }
  Result<LogClassifier> classifier = LogClassifier::FromToml(*rules_text, *rules_path);
  if (!classifier.ok()) {
    std::fprintf(stderr, "endure classify: %s\n", classifier.status().message().c_str());
    return kExitUsage;
  }
  if (flags.check) return RunCheck(*classifier);

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
                  "Rules file (default: config/log_rules.toml shipped with this binary)");
  cmd->add_flag("--json", flags->json, "One JSON object per excerpt (JSON Lines)");
  cmd->add_flag("--lines", flags->lines,
                "Classify every non-blank line on its own instead of blank-line-separated "
                "excerpts");
  cmd->add_flag("--check", flags->check,
                "List the rules and verify that each rule's examples are classified by it");
  return {cmd, [flags] { return Run(*flags); }};
}

}  // namespace endure::cli
