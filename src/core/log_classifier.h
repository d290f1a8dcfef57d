// LogClassifier: names the cause of a failure from what the worker printed.
//
// A rule maps a regular expression (RE2 syntax) on one line of worker output
// to a cause ("xid_79", "nccl_timeout", "user_error", ...) and an action
// (restart, evict_node, stop, investigate). An excerpt — a line, or several
// lines such as the tail of a worker's output, a whole Python traceback, an
// nvidia-smi table or a dmesg record — is classified as one piece of evidence
// by its root cause:
// - the rule of highest priority that matches any of its lines wins (ties:
//   the rule listed first); within that rule the first matching line is the
//   one recorded;
// - a rule with a `context` pattern matches only where some line of the same
//   excerpt matches that pattern too (evidence that spans lines);
// - in a chained Python traceback ("During handling of the above exception",
//   "The above exception was the direct cause"), the first exception is the
//   root cause: matches after the first chain line count only when no rule
//   matches before it, except evict_node rules (broken hardware behind a
//   cascade of errors), which count anywhere.
// A cause may name capture groups of its pattern, as in `cause = "xid_{xid}"`.
//
// The rules live in config/log_rules/ (one file per family of causes);
// docs/log_rules.md describes the format and the policy. This file does no
// I/O: the caller reads the rules files and passes their text. A
// LogClassifier is immutable once built; Classify is thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config_files.h"
#include "common/status.h"

namespace re2 {
class RE2;
}

namespace endure::core {

enum class LogAction {
  kRestart,      // restart the workers in place
  kEvictNode,    // the node is faulty: take it out of the job
  kStop,         // restarting cannot help: stop the job
  kInvestigate,  // the text is ambiguous: no confident action, flag for a person
  // Certain to recur unless what caused it changes (a full disk, a missing
  // device, a fault in the program's own kernel): one restart confirms it;
  // the same cause again, in that restart, stops the job.
  kStopIfRepeated,
};

// "restart", "evict_node", "stop", "investigate", "stop_if_repeated".
std::string_view LogActionName(LogAction action);
// Accepts the names above; the error lists them.
Result<LogAction> ParseLogAction(std::string_view name);

struct LogRule {
  std::string name;     // unique, e.g. "xid_hardware"
  std::string pattern;  // RE2 syntax, searched for in each line
  std::string context;  // RE2, optional: some line of the excerpt must match it
  std::string cause;    // may contain {group} placeholders for named groups
  LogAction action = LogAction::kInvestigate;
  int priority = 0;  // higher wins
  std::string description;
  // Lines or excerpts this rule must classify; checked by CheckExamples.
  std::vector<std::string> examples;
  // Where the rule, its pattern and its cause are in their file, for error
  // messages (file empty, lines 0: not from a file).
  std::string file;
  int line = 0;
  int pattern_line = 0;
  int cause_line = 0;
  int context_line = 0;
};

struct LogMatch {
  std::string cause;  // placeholders filled in
  LogAction action = LogAction::kInvestigate;
  std::string rule;
  std::string line;                             // the matching line, as classified
  int line_number = 0;                          // 1-based, within the excerpt
  std::map<std::string, std::string> captures;  // named groups of the pattern
};

class LogClassifier {
 public:
  // Compiles `rules`. Fails with InvalidArgument naming `source`:line and the
  // rule on an empty or duplicate name, a pattern that does not compile, or a
  // cause that is empty or names a group the pattern lacks.
  static Result<LogClassifier> Create(std::vector<LogRule> rules, std::string_view source = "");

  // Parses the text of a rules file (see docs/log_rules.md) read from `path`
  // (used in messages only). Errors are "PATH:LINE: what is wrong and how to
  // fix it": TOML syntax, unknown keys, wrong types, missing keys, and the
  // errors of Create.
  static Result<LogClassifier> FromToml(std::string_view text, std::string_view path);

  // The rules of several files (a rules directory, in name order), tried as
  // one list: priority first, then file order. A rule name used twice, in one
  // file or two, is an error naming both places. `source` names the whole
  // (the directory) in source().
  static Result<LogClassifier> FromTomlFiles(const std::vector<TextFile>& files,
                                             std::string_view source);

  LogClassifier(LogClassifier&&) noexcept;
  LogClassifier& operator=(LogClassifier&&) noexcept;
  ~LogClassifier();

  // The match of the winning rule, or nullopt when no rule matches.
  std::optional<LogMatch> Classify(std::string_view excerpt) const;

  // The match of every rule that matches, winner first.
  std::vector<LogMatch> ClassifyAll(std::string_view excerpt) const;

  // Verifies that every rule's examples are classified by that rule. The
  // error lists each example that is not, with what it got instead.
  Status CheckExamples() const;

  // The rules in the order they are tried (priority, then file order).
  std::vector<const LogRule*> rules() const;
  std::string_view source() const { return source_; }

 private:
  struct Compiled;
  explicit LogClassifier(std::vector<Compiled> rules, std::string source);
  std::vector<LogMatch> Match(std::string_view excerpt, bool first_only) const;

  std::vector<Compiled> rules_;  // sorted by priority, stable
  std::string source_;
};

// A piece of input to classify, with where it sits in the input.
struct LogExcerpt {
  std::string text;    // lines joined with '\n', each ending in one
  int first_line = 0;  // 1-based line numbers in the input
  int last_line = 0;
};

// Splits input into excerpts at blank lines, except the blank lines Python
// prints around "During handling of the above exception, another exception
// occurred:" and "The above exception was the direct cause of the following
// exception:", which belong to one chained traceback. Excerpts keep their
// line breaks and have no leading or trailing blank lines.
std::vector<LogExcerpt> SplitExcerpts(std::string_view text);

// Splits input into its non-blank lines, one excerpt each.
std::vector<LogExcerpt> SplitNonBlankLines(std::string_view text);

// The rules whose cause is not in the cause catalogue (cause.h), one
// message each ("FILE:LINE: rule "NAME": the cause "C" is not in ..."): the
// recovery policy knows nothing of such a cause and treats it as ambiguous.
// The agent prints them when it loads the rules; `endure classify --check`
// fails on them, and the shipped rules have none (a unit test).
std::vector<std::string> UncataloguedCauses(const LogClassifier& classifier);

}  // namespace endure::core
