// Normalizing, comparing and generalizing incidents; see incident_match.h.
#include "core/incident_match.h"

#include <re2/re2.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "common/quote.h"

namespace endure::core {
namespace {

// Replacements in order: the more specific shapes first, so that the parts of
// a timestamp or an address are not taken for numbers.
struct Replacement {
  const char* pattern;
  const char* with;
};
constexpr Replacement kReplacements[] = {
    {R"(\x1b\[[0-9;?]*[@-~])", ""},
    {R"(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)", "<time>"},
    {R"(^[A-Z][a-z]{2} +\d+ \d{2}:\d{2}:\d{2} \S+ )", "<time> <host> "},
    {R"(\[ *\d+\.\d+\])", "[<time>]"},
    {R"(\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b)", "<time>"},
    {R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})", "<uuid>"},
    {R"(\b[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?\b)", "<pci>"},
    {R"(\b[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]\b)", "<pci>"},
    {R"(\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b)", "<ip>"},
    {R"(\b0[xX][0-9a-fA-F]+\b)", "<hex>"},
    {R"(\b[0-9a-fA-F]{8,}\b)", "<hex>"},
    {R"((?:[\w.+~-]*/)+([\w.+-]+))", "<dir>/\\1"},
    {R"(\bline \d+)", "line <n>"},
    // Which process, rank, step or device printed it: different in every
    // occurrence of one fault.
    {R"(\[\d+\])", "[<n>]"},
    {R"((?i)\b(pid|tid|rank|local_rank|step|iter|iteration|epoch|seqnum|device|gpu|cuda:)([ =:#]*)\d+)",
     "\\1\\2<n>"},
    {R"(\b\d+\.\d+\b)", "<f>"},
    {R"(\b\d{4,}\b)", "<n>"},
};

const std::vector<std::unique_ptr<RE2>>& CompiledReplacements() {
  static const auto* res = [] {
    auto* v = new std::vector<std::unique_ptr<RE2>>;  // never deleted: used until exit
    for (const Replacement& r : kReplacements) v->push_back(std::make_unique<RE2>(r.pattern));
    return v;
  }();
  return *res;
}

std::vector<std::string> SplitLines(std::string_view text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::string NormalizeLine(std::string line) {
  const auto& res = CompiledReplacements();
  for (size_t i = 0; i < res.size(); ++i) RE2::GlobalReplace(&line, *res[i], kReplacements[i].with);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  for (char& c : line) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return line;
}

bool IsGenericLine(std::string_view line) {
  const std::string_view trimmed =
      line.substr(std::min(line.find_first_not_of(" \t"), line.size()));
  if (trimmed.size() < 12) return true;
  if (trimmed.starts_with("traceback (most recent call last)") || trimmed.starts_with("file \"") ||
      trimmed.starts_with("during handling of the above") ||
      trimmed.starts_with("the above exception was")) {
    return true;
  }
  // Nothing but placeholders and punctuation.
  std::string letters;
  bool in_placeholder = false;
  for (char c : trimmed) {
    if (c == '<') in_placeholder = true;
    if (!in_placeholder && std::isalpha(static_cast<unsigned char>(c))) letters += c;
    if (c == '>') in_placeholder = false;
  }
  return letters.size() < 6;
}

bool LooksLikeAnError(std::string_view line) {
  for (const char* word :
       {"error",     "fail",   "exception", "fatal",   "abort",   "killed",        "timeout",
        "timed out", "denied", "lost",      "fault",   "panic",   "assert",        "warn",
        "cannot",    "unable", "invalid",   "refused", "corrupt", "out of memory", "no space",
        "not found", "errno",  "sigsegv",   "sigabrt", "xid",     "nvrm",          "ecc"}) {
    if (line.find(word) != std::string_view::npos) return true;
  }
  return false;
}

// Words and word pairs; the pairs keep some of the order. Of the excerpt,
// the lines that read as evidence (an error, a warning, a kernel message)
// when there are any: the ordinary output around them (progress lines, a
// banner) differs from job to job and says nothing about the fault.
std::map<std::string, double> Terms(const IncidentText& t) {
  std::map<std::string, double> terms;
  std::vector<std::string> words;
  auto add_words = [&](std::string_view text, const std::string& prefix) {
    std::string word;
    std::string previous;
    for (size_t i = 0; i <= text.size(); ++i) {
      const char c = i < text.size() ? text[i] : ' ';
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '<' || c == '>') {
        word += c;
        continue;
      }
      if (word.empty()) continue;
      terms[prefix + word] += 1;
      if (!previous.empty()) terms[prefix + previous + " " + word] += 1;
      previous = std::move(word);
      word.clear();
    }
  };
  std::string evidence;
  for (const std::string& line : SplitLines(t.normalized)) {
    if (LooksLikeAnError(line) && !IsGenericLine(line)) evidence += line + "\n";
  }
  add_words(evidence.empty() ? t.normalized : evidence, "");
  add_words(t.stack_signature, "frame:");
  if (!t.cause.empty()) terms["cause:" + t.cause] += 1;
  return terms;
}

// A line's words, split at whitespace.
std::vector<std::string> Words(std::string_view line) {
  std::vector<std::string> words;
  std::string word;
  for (char c : line) {
    if (c == ' ' || c == '\t') {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

// The normalized line as an RE2 pattern for the raw lines it came from.
std::string PatternOf(std::string_view normalized) {
  static const std::pair<const char*, const char*> kPlaceholders[] = {
      {"<time> <host> ", R"(.*?)"},
      {"<time>", R"([^\]]*?)"},
      {"<uuid>", R"([0-9a-fA-F-]+)"},
      {"<pci>", R"([0-9a-fA-F:.]+)"},
      {"<ip>", R"([0-9.]+(?::\d+)?)"},
      {"<hex>", R"((?:0[xX])?[0-9a-fA-F]+)"},
      {"<dir>/", R"(\S*?/)"},
      {"<f>", R"(\d+\.\d+)"},
      {"<n>", R"(\d+)"},
  };
  std::string pattern = "(?i)";
  std::string literal;
  auto flush = [&] {
    for (char c : literal) {
      if (std::string_view("\\.^$|?*+()[]{}").find(c) != std::string_view::npos) pattern += '\\';
      pattern += c;
    }
    literal.clear();
  };
  size_t i = normalized.find_first_not_of(" \t");
  if (i == std::string_view::npos) i = normalized.size();
  while (i < normalized.size()) {
    bool replaced = false;
    for (const auto& [placeholder, regex] : kPlaceholders) {
      if (normalized.substr(i).starts_with(placeholder)) {
        flush();
        pattern += regex;
        i += std::string_view(placeholder).size();
        replaced = true;
        break;
      }
    }
    if (replaced) continue;
    if (normalized[i] == ' ' || normalized[i] == '\t') {
      flush();
      while (i < normalized.size() && (normalized[i] == ' ' || normalized[i] == '\t')) ++i;
      pattern += R"(\s+)";
      continue;
    }
    literal += normalized[i++];
  }
  flush();
  return pattern;
}

std::string RuleName(std::string_view cause) {
  std::string name;
  for (char c : cause) {
    name += std::isalnum(static_cast<unsigned char>(c))
                ? static_cast<char>(std::tolower(static_cast<unsigned char>(c)))
                : '_';
  }
  if (name.empty() || !std::isalpha(static_cast<unsigned char>(name[0]))) name = "site_" + name;
  return name;
}

std::string TomlString(std::string_view s) {
  std::string out;
  AppendQuoted(s, ControlEscape::kUnicode, out);
  return out;
}

// A literal '...' string where the text allows one (no quote, no control
// character): a pattern then reads as it is.
std::string TomlPattern(std::string_view s) {
  const bool literal = std::none_of(s.begin(), s.end(), [](char c) {
    return c == '\'' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  return literal ? "'" + std::string(s) + "'" : TomlString(s);
}

// Text for a TOML comment: control characters (which TOML forbids there,
// except a tab) written as \xNN.
std::string CommentText(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string Ids(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
  return s;
}

}  // namespace

std::string NormalizeExcerpt(std::string_view excerpt) {
  std::string out;
  for (std::string& line : SplitLines(excerpt)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out += NormalizeLine(std::move(line));
    out += '\n';
  }
  return out;
}

std::string BoundedExcerpt(std::string_view tail, size_t max_lines, size_t max_bytes) {
  size_t end = tail.size();
  while (end > 0 && tail[end - 1] == '\n') --end;
  size_t start = end;  // the excerpt is [start, end)
  size_t lines = 0;
  while (lines < max_lines && start > 0) {
    // The line before `start` ends at `end` (the last one) or at the newline
    // just before `start`.
    const size_t line_end = start == end ? end : start - 1;
    const size_t nl = line_end == 0 ? std::string_view::npos : tail.rfind('\n', line_end - 1);
    const size_t line_start = nl == std::string_view::npos ? 0 : nl + 1;
    if (end - line_start > max_bytes) break;
    start = line_start;
    ++lines;
  }
  if (lines == 0 && end > 0) {
    // One line longer than the bound: its end, where errors are.
    return std::string(
               tail.substr(end > max_bytes ? end - max_bytes : 0, std::min(end, max_bytes))) +
           "\n";
  }
  return start < end ? std::string(tail.substr(start, end - start)) + "\n" : "";
}

std::vector<Similar> FindSimilar(const IncidentText& query, const std::vector<IncidentText>& past,
                                 int k, double min_score) {
  std::vector<std::map<std::string, double>> docs;
  std::map<std::string, int> df;
  for (const IncidentText& p : past) {
    docs.push_back(Terms(p));
    for (const auto& [term, n] : docs.back()) ++df[term];
  }
  const std::map<std::string, double> q = Terms(query);
  const double n_docs = static_cast<double>(past.size()) + 1;
  auto idf = [&](const std::string& term) {
    auto it = df.find(term);
    const int d = (it == df.end() ? 0 : it->second) + 1;  // the query is a document too
    return std::log((n_docs + 1) / (d + 1)) + 1;
  };
  auto norm = [&](const std::map<std::string, double>& v) {
    double s = 0;
    for (const auto& [term, tf] : v) s += std::pow(tf * idf(term), 2);
    return std::sqrt(s);
  };
  const double q_norm = norm(q);
  std::vector<Similar> out;
  if (q_norm == 0) return out;
  for (size_t i = 0; i < past.size(); ++i) {
    if (past[i].id == query.id) continue;
    double dot = 0;
    for (const auto& [term, tf] : q) {
      auto it = docs[i].find(term);
      if (it != docs[i].end()) dot += tf * it->second * std::pow(idf(term), 2);
    }
    const double d_norm = norm(docs[i]);
    if (d_norm == 0) continue;
    const double score = std::min(1.0, dot / (q_norm * d_norm));
    if (score >= min_score) out.push_back({past[i].id, score});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Similar& a, const Similar& b) { return a.score > b.score; });
  if (k >= 0 && out.size() > static_cast<size_t>(k)) out.resize(k);
  return out;
}

std::vector<RuleCandidate> SuggestRules(const std::vector<ResolvedIncident>& resolved) {
  // Group: each incident joins the first group whose first member it
  // resembles.
  std::vector<IncidentText> texts;
  for (const ResolvedIncident& r : resolved) {
    texts.push_back({r.id, r.cause, NormalizeExcerpt(r.excerpt), ""});
  }
  // Word weights come from all of them: what they all share counts little.
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<Similar> like = FindSimilar(texts[i], texts, -1, kRecurrenceScore);
    bool placed = false;
    for (std::vector<size_t>& g : groups) {
      const bool close = std::any_of(like.begin(), like.end(),
                                     [&](const Similar& s) { return s.id == texts[g.front()].id; });
      if (close) {
        g.push_back(i);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({i});
  }

  std::vector<RuleCandidate> out;
  std::set<std::string> names;
  for (const std::vector<size_t>& g : groups) {
    // The line most members have a version of (the same words but a few);
    // then one that reads as an error; then the longest (the most
    // specific). Where the versions differ, the pattern takes any word.
    std::vector<std::string> candidates;
    for (size_t member : g) {
      for (const std::string& line : SplitLines(texts[member].normalized)) {
        if (IsGenericLine(line)) continue;
        candidates.push_back(line);
      }
    }
    std::vector<std::string> best_words;
    std::string best_line;
    std::tuple<size_t, bool, size_t> best_rank{0, false, 0};
    for (const std::string& line : candidates) {
      const std::vector<std::string> words = Words(line);
      std::vector<std::string> merged = words;
      size_t holders = 0;
      for (size_t member : g) {
        size_t best_equal = 0;
        std::vector<std::string> version;  // the member's closest line, if any is close
        for (const std::string& other : SplitLines(texts[member].normalized)) {
          std::vector<std::string> w = Words(other);
          if (w.size() != words.size()) continue;
          size_t equal = 0;
          for (size_t k = 0; k < w.size(); ++k) equal += w[k] == words[k];
          if (equal * 4 >= words.size() * 3 && equal > best_equal) {
            best_equal = equal;
            version = std::move(w);
          }
        }
        if (version.empty()) continue;
        ++holders;
        for (size_t k = 0; k < merged.size(); ++k) {
          if (merged[k] != version[k]) merged[k].clear();  // any word
        }
      }
      const auto rank =
          std::make_tuple(holders, LooksLikeAnError(line), std::min<size_t>(line.size(), 200));
      if (rank > best_rank) {
        best_rank = rank;
        best_words = merged;
        best_line = line;
      }
    }
    if (best_words.empty()) continue;

    RuleCandidate c;
    c.key_line = best_line;
    for (size_t k = 0; k < best_words.size(); ++k) {
      if (k > 0) c.rule.pattern += R"(\s+)";
      c.rule.pattern += best_words[k].empty() ? R"(\S+)" : PatternOf(best_words[k]).substr(4);
    }
    c.rule.pattern = "(?i)" + c.rule.pattern;
    // The pattern as the classifier applies it (lines cleaned of colours
    // and carriage returns), to pick the examples it will match.
    LogRule probe;
    probe.name = "probe";
    probe.pattern = c.rule.pattern;
    probe.cause = "probe";
    Result<LogClassifier> matcher = LogClassifier::Create({probe});
    if (!matcher.ok()) continue;
    auto matches = [&](const std::string& line) {
      // A NUL has no place in a rules file's string.
      return line.find('\0') == std::string::npos && matcher->Classify(line).has_value();
    };
    std::set<LogAction> actions;
    std::string notes;
    for (size_t member : g) {
      const ResolvedIncident& r = resolved[member];
      bool matched = false;
      for (const std::string& raw : SplitLines(r.excerpt)) {
        if (!matches(raw)) continue;
        if (std::find(c.rule.examples.begin(), c.rule.examples.end(), raw) ==
            c.rule.examples.end()) {
          c.rule.examples.push_back(raw);
        }
        matched = true;
        break;
      }
      if (!matched) continue;
      c.incidents.push_back(r.id);
      actions.insert(r.action);
      if (!r.note.empty()) notes += (notes.empty() ? "" : "; ") + r.note;
    }
    if (c.incidents.empty()) continue;
    const ResolvedIncident& first = resolved[g.front()];
    c.rule.action = actions.size() == 1 ? *actions.begin() : LogAction::kInvestigate;
    c.rule.cause = RuleName(first.cause.empty() ? "site_failure" : first.cause);
    std::string name = "suggested_" + c.rule.cause;
    for (int n = 2; !names.insert(name).second; ++n) {
      name = "suggested_" + c.rule.cause + "_" + std::to_string(n);
    }
    c.rule.name = name;
    c.rule.priority = 30;
    c.rule.description = "Suggested from incident" +
                         std::string(c.incidents.size() > 1 ? "s " : " ") + Ids(c.incidents) +
                         (actions.size() > 1 ? ", whose resolutions disagree" : "") +
                         (notes.empty() ? std::string() : ": " + notes) +
                         ". Review the pattern, the action and the priority band before use.";
    for (size_t i = 0; i < resolved.size(); ++i) {
      if (std::find(c.incidents.begin(), c.incidents.end(), resolved[i].id) != c.incidents.end() ||
          resolved[i].action == c.rule.action) {
        continue;
      }
      if (matcher->Classify(resolved[i].excerpt).has_value()) c.conflicts.push_back(resolved[i].id);
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::string RuleCandidatesToToml(const std::vector<RuleCandidate>& candidates) {
  std::string out;
  for (const RuleCandidate& c : candidates) {
    out += "# From incident" + std::string(c.incidents.size() > 1 ? "s " : " ") + Ids(c.incidents) +
           "; the line they share:\n#   " + CommentText(c.key_line) + "\n";
    if (!c.conflicts.empty()) {
      out += "# CONFLICT: it also matches incident" +
             std::string(c.conflicts.size() > 1 ? "s " : " ") + Ids(c.conflicts) +
             ", resolved otherwise: narrow the pattern.\n";
    }
    out += "[[rule]]\nname = " + TomlString(c.rule.name) +
           "\npriority = " + std::to_string(c.rule.priority) +
           "\npattern = " + TomlPattern(c.rule.pattern) + "\ncause = " + TomlString(c.rule.cause) +
           "\naction = " + TomlString(LogActionName(c.rule.action)) +
           "\ndescription = " + TomlString(c.rule.description) + "\nexamples = [\n";
    for (const std::string& e : c.rule.examples) out += "  " + TomlString(e) + ",\n";
    out += "]\n\n";
  }
  return out;
}

}  // namespace endure::core
