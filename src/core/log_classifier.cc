// Rule-based classification of worker output; see log_classifier.h.
#include "core/log_classifier.h"

#include <re2/re2.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <utility>

#include "core/cause.h"

namespace endure::core {

struct LogClassifier::Compiled {
  LogRule rule;
  std::unique_ptr<RE2> re;
  std::unique_ptr<RE2> context;          // null: the rule has none
  std::vector<std::string> group_names;  // by group index - 1; "" when unnamed
  // The cause, cut at its placeholders: literal text, or a group index.
  struct Piece {
    std::string literal;
    int group = 0;  // > 0: substitute this group
  };
  std::vector<Piece> cause;
};

namespace {

constexpr const char* kRuleKeys =
    "name, pattern, cause, action, priority, description, examples, context";

std::string Where(std::string_view source, int line) {
  if (source.empty()) return "";
  if (line <= 0) return std::string(source) + ": ";
  return std::string(source) + ":" + std::to_string(line) + ": ";
}

std::string RuleLabel(const LogRule& rule) {
  return rule.name.empty() ? std::string("rule") : "rule \"" + rule.name + "\"";
}

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// Removes ANSI colour and cursor sequences (ESC [ ... letter), which coloured
// loggers wrap around words a pattern wants to see.
std::string StripAnsi(std::string_view line) {
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\x1b' && i + 1 < line.size() && line[i + 1] == '[') {
      size_t j = i + 2;
      while (j < line.size() && !(line[j] >= '@' && line[j] <= '~')) ++j;
      i = j;
      continue;
    }
    out += line[i];
  }
  return out;
}

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    if (end == text.size()) break;
    start = end + 1;
  }
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

bool IsChainLine(std::string_view line) {
  return line.find("During handling of the above exception, another exception occurred") !=
             std::string_view::npos ||
         line.find("The above exception was the direct cause of the following exception") !=
             std::string_view::npos;
}

bool IsIdentifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace

std::string_view LogActionName(LogAction action) {
  switch (action) {
    case LogAction::kRestart:
      return "restart";
    case LogAction::kEvictNode:
      return "evict_node";
    case LogAction::kStop:
      return "stop";
    case LogAction::kInvestigate:
      return "investigate";
    case LogAction::kStopIfRepeated:
      return "stop_if_repeated";
  }
  return "investigate";
}

Result<LogAction> ParseLogAction(std::string_view name) {
  std::string names;
  for (LogAction a : {LogAction::kRestart, LogAction::kEvictNode, LogAction::kStop,
                      LogAction::kInvestigate, LogAction::kStopIfRepeated}) {
    if (name == LogActionName(a)) return a;
    names += (names.empty() ? "" : ", ") + std::string(LogActionName(a));
  }
  return InvalidArgument("unknown action \"" + std::string(name) + "\"; expected one of " + names);
}

LogClassifier::LogClassifier(std::vector<Compiled> rules, std::string source)
    : rules_(std::move(rules)), source_(std::move(source)) {}
LogClassifier::LogClassifier(LogClassifier&&) noexcept = default;
LogClassifier& LogClassifier::operator=(LogClassifier&&) noexcept = default;
LogClassifier::~LogClassifier() = default;

Result<LogClassifier> LogClassifier::Create(std::vector<LogRule> rules, std::string_view source) {
  std::vector<Compiled> compiled;
  compiled.reserve(rules.size());
  std::map<std::string, std::string> names;  // name -> where it is defined
  RE2::Options options;
  options.set_log_errors(false);
  auto compile = [&](const std::string& pattern, std::string_view what,
                     const std::string& at) -> Result<std::unique_ptr<RE2>> {
    auto re = std::make_unique<RE2>(pattern, options);
    if (!re->ok()) {
      return InvalidArgument(at + "the " + std::string(what) + " does not compile: " + re->error() +
                             "; patterns use RE2 syntax, see "
                             "https://github.com/google/re2/wiki/Syntax");
    }
    return re;
  };
  for (LogRule& rule : rules) {
    const std::string_view file = rule.file.empty() ? source : std::string_view(rule.file);
    auto at_line = [&](int line) {
      return Where(file, line > 0 ? line : rule.line) + RuleLabel(rule) + ": ";
    };
    const std::string at = at_line(rule.line);
    const std::string cause_at = at_line(rule.cause_line);
    if (rule.name.empty()) return InvalidArgument(at + "the rule needs a non-empty name");
    const std::string place = Where(file, rule.line);
    if (auto [it, fresh] = names.emplace(rule.name, place); !fresh) {
      return InvalidArgument(at + "another rule has the same name" +
                             (it->second.empty()
                                  ? std::string()
                                  : " (" + it->second.substr(0, it->second.size() - 2) + ")") +
                             "; give each rule its own");
    }
    if (rule.pattern.empty())
      return InvalidArgument(at_line(rule.pattern_line) + "the pattern is empty");
    ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<RE2> re,
                            compile(rule.pattern, "pattern", at_line(rule.pattern_line)));

    Compiled c;
    if (!rule.context.empty()) {
      ENDURE_ASSIGN_OR_RETURN(c.context,
                              compile(rule.context, "context", at_line(rule.context_line)));
    }
    c.group_names.assign(re->NumberOfCapturingGroups(), "");
    for (const auto& [name, index] : re->NamedCapturingGroups()) c.group_names[index - 1] = name;

    // Cut the cause at its {placeholders}.
    const std::string& cause = rule.cause;
    if (cause.empty()) return InvalidArgument(cause_at + "the cause is empty");
    size_t pos = 0;
    while (pos < cause.size()) {
      const size_t open = cause.find('{', pos);
      if (open == std::string::npos) {
        c.cause.push_back({cause.substr(pos), 0});
        break;
      }
      if (open > pos) c.cause.push_back({cause.substr(pos, open - pos), 0});
      const size_t close = cause.find('}', open);
      if (close == std::string::npos) {
        return InvalidArgument(cause_at + "the cause \"" + cause + "\" has a '{' without a '}'");
      }
      const std::string group = cause.substr(open + 1, close - open - 1);
      auto it = re->NamedCapturingGroups().find(group);
      if (!IsIdentifier(group) || it == re->NamedCapturingGroups().end()) {
        return InvalidArgument(cause_at + "the cause \"" + cause + "\" uses {" + group +
                               "}, but the pattern has no group named that; name a group with "
                               "(?P<" +
                               (IsIdentifier(group) ? group : std::string("name")) + ">...)");
      }
      c.cause.push_back({"", it->second});
      pos = close + 1;
    }
    c.re = std::move(re);
    c.rule = std::move(rule);
    compiled.push_back(std::move(c));
  }
  std::stable_sort(compiled.begin(), compiled.end(), [](const Compiled& a, const Compiled& b) {
    return a.rule.priority > b.rule.priority;
  });
  return LogClassifier(std::move(compiled), std::string(source));
}

namespace {

// The rules of one file, each knowing where it is.
Result<std::vector<LogRule>> ParseRulesToml(std::string_view text, std::string_view path) {
  toml::table doc;
  try {
    doc = toml::parse(text, std::string_view(path));
  } catch (const toml::parse_error& e) {
    return InvalidArgument(Where(path, static_cast<int>(e.source().begin.line)) +
                           "TOML syntax error: " + std::string(e.description()));
  }

  for (const auto& [key, value] : doc) {
    if (key.str() != "rule") {
      return InvalidArgument(Where(path, static_cast<int>(key.source().begin.line)) +
                             "unknown top-level key \"" + std::string(key.str()) +
                             "\"; the file holds [[rule]] tables only");
    }
  }
  const toml::node* rule_node = doc.get("rule");
  if (rule_node == nullptr) {
    return InvalidArgument(Where(path, 0) + "no rules: add [[rule]] tables");
  }
  const toml::array* array = rule_node->as_array();
  if (array == nullptr) {
    return InvalidArgument(Where(path, static_cast<int>(rule_node->source().begin.line)) +
                           "\"rule\" must be an array of tables: write each rule as [[rule]]");
  }

  std::vector<LogRule> rules;
  for (const toml::node& element : *array) {
    const int element_line = static_cast<int>(element.source().begin.line);
    const toml::table* table = element.as_table();
    if (table == nullptr) {
      return InvalidArgument(Where(path, element_line) +
                             "each rule must be a table: write it as [[rule]]");
    }
    LogRule rule;
    rule.file = std::string(path);
    rule.line = element_line;
    if (const toml::node* name = table->get("name"); name != nullptr && name->is_string()) {
      rule.name = name->as_string()->get();
    }
    const std::string label = RuleLabel(rule);

    auto string_of = [&](const toml::node& value, std::string_view key,
                         std::string* out) -> Status {
      if (!value.is_string()) {
        return InvalidArgument(Where(path, static_cast<int>(value.source().begin.line)) + label +
                               ": \"" + std::string(key) + "\" must be a string");
      }
      *out = value.as_string()->get();
      return Status::Ok();
    };
    for (const auto& [key, value] : *table) {
      const std::string_view k = key.str();
      const int line = static_cast<int>(value.source().begin.line);
      if (k == "name") {
        ENDURE_RETURN_IF_ERROR(string_of(value, k, &rule.name));
      } else if (k == "pattern") {
        ENDURE_RETURN_IF_ERROR(string_of(value, k, &rule.pattern));
        rule.pattern_line = line;
      } else if (k == "cause") {
        ENDURE_RETURN_IF_ERROR(string_of(value, k, &rule.cause));
        rule.cause_line = line;
      } else if (k == "context") {
        ENDURE_RETURN_IF_ERROR(string_of(value, k, &rule.context));
        rule.context_line = line;
        if (rule.context.empty()) {
          return InvalidArgument(Where(path, line) + label +
                                 ": \"context\" is empty; leave it out, or give a pattern that "
                                 "some line of the excerpt must match");
        }
      } else if (k == "description") {
        ENDURE_RETURN_IF_ERROR(string_of(value, k, &rule.description));
      } else if (k == "action") {
        std::string action;
        ENDURE_RETURN_IF_ERROR(string_of(value, k, &action));
        Result<LogAction> parsed = ParseLogAction(action);
        if (!parsed.ok()) {
          return InvalidArgument(Where(path, line) + label + ": " + parsed.status().message());
        }
        rule.action = *parsed;
      } else if (k == "priority") {
        if (!value.is_integer()) {
          return InvalidArgument(Where(path, line) + label +
                                 ": \"priority\" must be an integer (higher wins)");
        }
        rule.priority = static_cast<int>(value.as_integer()->get());
      } else if (k == "examples") {
        const toml::array* examples = value.as_array();
        if (examples == nullptr) {
          return InvalidArgument(Where(path, line) + label +
                                 ": \"examples\" must be an array of strings");
        }
        for (const toml::node& example : *examples) {
          std::string text;
          ENDURE_RETURN_IF_ERROR(string_of(example, "examples", &text));
          rule.examples.push_back(std::move(text));
        }
      } else {
        return InvalidArgument(Where(path, static_cast<int>(key.source().begin.line)) + label +
                               ": unknown key \"" + std::string(k) + "\"; the keys of a rule are " +
                               kRuleKeys);
      }
    }
    for (const char* required : {"name", "pattern", "cause", "action"}) {
      if (table->get(required) == nullptr) {
        return InvalidArgument(Where(path, element_line) + label + ": the key \"" + required +
                               "\" is missing");
      }
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

}  // namespace

Result<LogClassifier> LogClassifier::FromToml(std::string_view text, std::string_view path) {
  ENDURE_ASSIGN_OR_RETURN(std::vector<LogRule> rules, ParseRulesToml(text, path));
  return Create(std::move(rules), path);
}

Result<LogClassifier> LogClassifier::FromTomlFiles(const std::vector<TextFile>& files,
                                                   std::string_view source) {
  std::vector<LogRule> all;
  for (const TextFile& f : files) {
    ENDURE_ASSIGN_OR_RETURN(std::vector<LogRule> rules, ParseRulesToml(f.text, f.path));
    for (LogRule& r : rules) all.push_back(std::move(r));
  }
  if (all.empty()) return InvalidArgument(Where(source, 0) + "no rules: add [[rule]] tables");
  return Create(std::move(all), source);
}

std::vector<LogMatch> LogClassifier::Match(std::string_view excerpt, bool first_only) const {
  std::vector<std::string> lines;
  // Which part of a chained traceback each line is in: 0 before the first
  // chain line (the root cause), 1 after it.
  std::vector<int> part;
  bool chained = false;
  for (std::string_view line : Lines(excerpt)) {
    lines.push_back(StripAnsi(line));
    chained = chained || IsChainLine(lines.back());
    part.push_back(chained ? 1 : 0);
  }

  // Each rule's first matching line, in rule order (priority, then file).
  struct Found {
    LogMatch match;
    bool root = true;  // counts as the root cause
  };
  std::vector<Found> found;
  for (const Compiled& c : rules_) {
    if (c.context != nullptr && std::none_of(lines.begin(), lines.end(), [&](const std::string& l) {
          return RE2::PartialMatch(l, *c.context);
        })) {
      continue;
    }
    const int n = static_cast<int>(c.group_names.size());
    std::vector<std::string> groups(n);
    std::vector<RE2::Arg> args(n);
    std::vector<const RE2::Arg*> arg_ptrs(n);
    for (int i = 0; i < n; ++i) {
      args[i] = RE2::Arg(&groups[i]);
      arg_ptrs[i] = &args[i];
    }
    for (size_t i = 0; i < lines.size(); ++i) {
      if (!RE2::PartialMatchN(lines[i], *c.re, arg_ptrs.data(), n)) continue;
      LogMatch m;
      for (const Compiled::Piece& piece : c.cause) {
        m.cause += piece.group > 0 ? groups[piece.group - 1] : piece.literal;
      }
      m.action = c.rule.action;
      m.rule = c.rule.name;
      m.line = lines[i];
      m.line_number = static_cast<int>(i) + 1;
      for (int g = 0; g < n; ++g) {
        if (!c.group_names[g].empty()) m.captures[c.group_names[g]] = groups[g];
      }
      found.push_back({std::move(m), part[i] == 0 || c.rule.action == LogAction::kEvictNode});
      break;
    }
    // Without a chain every match counts: the first is the winner.
    if (first_only && !chained && !found.empty()) break;
  }
  // Matches that count as the root cause go first, each group in rule order;
  // when none does (nothing matched before the chain), all count.
  std::stable_partition(found.begin(), found.end(), [](const Found& f) { return f.root; });
  std::vector<LogMatch> matches;
  for (Found& f : found) {
    matches.push_back(std::move(f.match));
    if (first_only) break;
  }
  return matches;
}

std::optional<LogMatch> LogClassifier::Classify(std::string_view excerpt) const {
  std::vector<LogMatch> m = Match(excerpt, /*first_only=*/true);
  if (m.empty()) return std::nullopt;
  return std::move(m.front());
}

std::vector<LogMatch> LogClassifier::ClassifyAll(std::string_view excerpt) const {
  return Match(excerpt, /*first_only=*/false);
}

Status LogClassifier::CheckExamples() const {
  std::string problems;
  int count = 0;
  for (const Compiled& c : rules_) {
    for (const std::string& example : c.rule.examples) {
      std::optional<LogMatch> m = Classify(example);
      if (m.has_value() && m->rule == c.rule.name) continue;
      ++count;
      std::string shown = example.substr(0, 120);
      std::replace(shown.begin(), shown.end(), '\n', ' ');
      problems += "\n  " + Where(c.rule.file.empty() ? source_ : c.rule.file, c.rule.line) +
                  RuleLabel(c.rule) + ": example \"" + shown + "\" is ";
      problems += m.has_value() ? "classified by rule \"" + m->rule + "\" (cause " + m->cause +
                                      ", priority wins)"
                                : "matched by no rule";
    }
  }
  if (count == 0) return Status::Ok();
  return InvalidArgument(std::to_string(count) + " rule example" + (count == 1 ? "" : "s") +
                         " not classified by their own rule:" + problems);
}

std::vector<const LogRule*> LogClassifier::rules() const {
  std::vector<const LogRule*> out;
  for (const Compiled& c : rules_) out.push_back(&c.rule);
  return out;
}

std::vector<LogExcerpt> SplitExcerpts(std::string_view text) {
  std::vector<LogExcerpt> excerpts;
  LogExcerpt current;
  std::string_view last;  // the last non-blank line of `current`
  int blank_run = 0;
  int number = 0;
  for (std::string_view line : Lines(text)) {
    ++number;
    if (IsBlank(line)) {
      if (!current.text.empty()) ++blank_run;
      continue;
    }
    if (blank_run > 0) {
      // A chained traceback keeps its blank lines: it is one excerpt.
      if (IsChainLine(line) || IsChainLine(last)) {
        current.text += '\n';
      } else {
        excerpts.push_back(std::move(current));
        current = LogExcerpt{};
      }
      blank_run = 0;
    }
    if (current.text.empty()) current.first_line = number;
    current.last_line = number;
    current.text.append(line);
    current.text += '\n';
    last = line;
  }
  if (!current.text.empty()) excerpts.push_back(std::move(current));
  return excerpts;
}

std::vector<LogExcerpt> SplitNonBlankLines(std::string_view text) {
  std::vector<LogExcerpt> lines;
  int number = 0;
  for (std::string_view line : Lines(text)) {
    ++number;
    if (!IsBlank(line)) lines.push_back({std::string(line) + "\n", number, number});
  }
  return lines;
}

std::vector<std::string> UncataloguedCauses(const LogClassifier& classifier) {
  std::vector<std::string> out;
  for (const LogRule* rule : classifier.rules()) {
    if (IsCatalogued(rule->cause)) continue;
    const std::string_view file =
        rule->file.empty() ? classifier.source() : std::string_view(rule->file);
    out.push_back(Where(file, rule->cause_line > 0 ? rule->cause_line : rule->line) +
                  RuleLabel(*rule) + ": the cause \"" + rule->cause +
                  "\" is not in Endure's cause catalogue (src/core/cause.cc, listed in "
                  "docs/log_rules.md), so the recovery policy treats it as ambiguous; use a "
                  "catalogued cause, or add it there with its class");
  }
  return out;
}

}  // namespace endure::core
