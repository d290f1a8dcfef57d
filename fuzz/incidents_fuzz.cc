// Fuzz target: what the incident knowledge base does with a worker's output
// (hostile bytes, sanitized to UTF-8 as the controller does) and with a
// labelled corpus file. The input is cut at NUL bytes into excerpts.
//   - NormalizeExcerpt keeps one line per line;
//   - FindSimilar scores in [0, 1], best first, never an incident itself;
//   - SuggestRules' candidates read back as a rules file that compiles and
//     classifies each candidate's examples by that candidate;
//   - ParseLogCorpus accepts the text or says where it is wrong.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "core/incident_match.h"
#include "core/log_corpus.h"
#include "fuzz/fuzz_util.h"

using namespace endure;

namespace {

size_t Lines(std::string_view s) {
  if (s.empty()) return 0;
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')) + (s.back() == '\n' ? 0 : 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view raw = fuzz::AsText(data, size);

  Result<std::vector<core::CorpusExcerpt>> corpus = core::ParseLogCorpus(raw, "c.toml");
  if (!corpus.ok()) {
    FUZZ_CHECK(corpus.status().code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(corpus.status().message().rfind("c.toml", 0) == 0);
  }

  std::vector<std::string> excerpts;
  size_t start = 0;
  while (start <= raw.size() && excerpts.size() < 8) {
    size_t end = raw.find('\0', start);
    if (end == std::string_view::npos) end = raw.size();
    excerpts.push_back(SanitizeUtf8(raw.substr(start, end - start)));
    start = end + 1;
  }

  std::vector<core::IncidentText> texts;
  std::vector<core::ResolvedIncident> resolved;
  for (size_t i = 0; i < excerpts.size(); ++i) {
    const std::string normalized = core::NormalizeExcerpt(excerpts[i]);
    FUZZ_CHECK(Lines(normalized) == Lines(excerpts[i]));
    const int64_t id = static_cast<int64_t>(i) + 1;
    texts.push_back({id, i % 2 == 0 ? "c" : "d", normalized, ""});
    resolved.push_back({id, excerpts[i], "site_cause",
                        i % 3 == 0 ? core::LogAction::kEvictNode : core::LogAction::kStop, "n"});
    const std::string bounded = core::BoundedExcerpt(excerpts[i], 5, 64);
    FUZZ_CHECK(bounded.size() <= 65 && Lines(bounded) <= 5);
  }
  for (const core::IncidentText& t : texts) {
    const std::vector<core::Similar> s = core::FindSimilar(t, texts, -1, 0);
    for (size_t i = 0; i < s.size(); ++i) {
      FUZZ_CHECK(s[i].id != t.id);
      FUZZ_CHECK(s[i].score >= 0 && s[i].score <= 1);
      if (i > 0) FUZZ_CHECK(s[i - 1].score >= s[i].score);
    }
  }

  const std::vector<core::RuleCandidate> candidates = core::SuggestRules(resolved);
  if (candidates.empty()) return 0;
  Result<core::LogClassifier> rules =
      core::LogClassifier::FromToml(core::RuleCandidatesToToml(candidates), "suggested.toml");
  if (!rules.ok()) std::fprintf(stderr, "%s\n", rules.status().ToString().c_str());
  FUZZ_CHECK(rules.ok());
  FUZZ_CHECK(rules->rules().size() == candidates.size());
  for (const core::RuleCandidate& c : candidates) {
    FUZZ_CHECK(!c.rule.examples.empty());
    for (const std::string& example : c.rule.examples) {
      // Each example is matched by some candidate (the first of equal
      // priority may be another's whose pattern is as general).
      FUZZ_CHECK(rules->Classify(example).has_value());
    }
  }
  return 0;
}
