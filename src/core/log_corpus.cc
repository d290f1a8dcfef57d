// Scoring log rules against a labelled corpus; see log_corpus.h.
#include "core/log_corpus.h"

#include <toml++/toml.h>

#include <map>

namespace endure::core {
namespace {

std::string At(std::string_view path, int64_t line) {
  return std::string(path) + ":" + std::to_string(line) + ": ";
}

}  // namespace

Result<std::vector<CorpusExcerpt>> ParseLogCorpus(std::string_view text, std::string_view path) {
  toml::table doc;
  try {
    doc = toml::parse(text, std::string_view(path));
  } catch (const toml::parse_error& e) {
    return InvalidArgument(At(path, e.source().begin.line) +
                           "TOML syntax error: " + std::string(e.description()));
  }
  for (const auto& [key, value] : doc) {
    if (key.str() != "excerpt") {
      return InvalidArgument(At(path, key.source().begin.line) + "unknown top-level key \"" +
                             std::string(key.str()) +
                             "\"; a corpus file holds [[excerpt]] tables only");
    }
  }
  const toml::array* array = doc["excerpt"].as_array();
  if (array == nullptr) {
    return InvalidArgument(std::string(path) +
                           ": no excerpts: write each one as an [[excerpt]] table");
  }
  std::vector<CorpusExcerpt> out;
  for (const toml::node& element : *array) {
    const int64_t line = element.source().begin.line;
    const toml::table* t = element.as_table();
    if (t == nullptr) return InvalidArgument(At(path, line) + "write each excerpt as [[excerpt]]");
    CorpusExcerpt e;
    e.file = std::string(path);
    e.line = static_cast<int>(line);
    std::string action;
    for (const auto& [key, value] : *t) {
      const std::string_view k = key.str();
      std::string* field = k == "source"   ? &e.source
                           : k == "cause"  ? &e.cause
                           : k == "action" ? &action
                           : k == "why"    ? &e.why
                           : k == "text"   ? &e.text
                                           : nullptr;
      if (field == nullptr) {
        return InvalidArgument(At(path, key.source().begin.line) + "unknown key \"" +
                               std::string(k) +
                               "\"; the keys of an excerpt are source, cause, action, why, text");
      }
      if (!value.is_string()) {
        return InvalidArgument(At(path, value.source().begin.line) + "\"" + std::string(k) +
                               "\" must be a string");
      }
      *field = value.as_string()->get();
    }
    for (auto [name, value] : {std::pair<const char*, const std::string*>{"source", &e.source},
                               {"cause", &e.cause},
                               {"action", &action},
                               {"text", &e.text}}) {
      if (value->empty()) {
        return InvalidArgument(At(path, line) + "the excerpt needs a non-empty \"" + name + "\"");
      }
    }
    Result<LogAction> parsed = ParseLogAction(action);
    if (!parsed.ok()) return InvalidArgument(At(path, line) + parsed.status().message());
    e.action = *parsed;
    out.push_back(std::move(e));
  }
  return out;
}

Result<std::vector<CorpusExcerpt>> ParseLogCorpusFiles(const std::vector<TextFile>& files) {
  std::vector<CorpusExcerpt> all;
  for (const TextFile& f : files) {
    ENDURE_ASSIGN_OR_RETURN(std::vector<CorpusExcerpt> some, ParseLogCorpus(f.text, f.path));
    for (CorpusExcerpt& e : some) all.push_back(std::move(e));
  }
  return all;
}

// stop and stop_if_repeated end the same way where the label is right: in a
// stop with a verdict (the second after one confirming restart).
bool SameOutcome(LogAction expected, LogAction got) {
  auto stops = [](LogAction a) { return a == LogAction::kStop || a == LogAction::kStopIfRepeated; };
  return expected == got || (stops(expected) && stops(got));
}

bool IsHarmful(LogAction expected, LogAction got) {
  if (got == LogAction::kEvictNode) return expected != LogAction::kEvictNode;
  return got == LogAction::kRestart && expected == LogAction::kEvictNode;
}

CorpusScore ScoreCorpus(const LogClassifier& classifier, const std::vector<CorpusExcerpt>& corpus) {
  CorpusScore score;
  std::map<std::string, CauseScore> by_cause;
  for (const CorpusExcerpt& e : corpus) {
    CorpusOutcome o;
    o.excerpt = &e;
    o.match = classifier.Classify(e.text);
    o.action = o.match ? o.match->action : kUnmatchedAction;
    o.action_right = SameOutcome(e.action, o.action);
    o.cause_right = o.match && o.match->cause == e.cause;
    o.harmful = IsHarmful(e.action, o.action);
    ++score.excerpts;
    const size_t newline = e.text.find('\n');
    if (newline != std::string::npos && newline + 1 < e.text.size() &&
        e.text.find_first_not_of(" \t\r\n", newline) != std::string::npos) {
      ++score.multi_line;
    }
    score.action_right += o.action_right;
    score.cause_right += o.cause_right;
    if (o.harmful) {
      ++score.harmful;
      ++(o.action == LogAction::kEvictNode ? score.evicted_healthy : score.restarted_on_broken);
    }
    CauseScore& c = by_cause[e.cause];
    c.cause = e.cause;
    ++c.excerpts;
    c.action_right += o.action_right;
    c.cause_right += o.cause_right;
    score.outcomes.push_back(std::move(o));
  }
  for (auto& [name, c] : by_cause) score.by_cause.push_back(c);
  return score;
}

}  // namespace endure::core
