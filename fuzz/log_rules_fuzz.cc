// Fuzz target: core::LogClassifier::FromToml, the parser of rules files
// such as those of config/log_rules/, on any text. Rules it accepts compile, keep
// their names unique, come back from rules() in priority order, and rebuild
// (Create) into a classifier that classifies every example the same way.
#include <cstddef>
#include <cstdint>
#include <set>

#include "core/log_classifier.h"
#include "fuzz/fuzz_util.h"

using namespace endure;
using core::LogClassifier;
using core::LogRule;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<LogClassifier> c = LogClassifier::FromToml(fuzz::AsText(data, size), "fuzz_rules.toml");
  if (!c.ok()) {
    FUZZ_CHECK(c.status().code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(c.status().message().rfind("fuzz_rules.toml:", 0) == 0);
    return 0;
  }
  std::set<std::string> names;
  std::vector<LogRule> copies;
  const LogRule* previous = nullptr;
  for (const LogRule* r : c->rules()) {
    FUZZ_CHECK(!r->name.empty() && !r->pattern.empty() && !r->cause.empty());
    FUZZ_CHECK(names.insert(r->name).second);
    if (previous != nullptr) FUZZ_CHECK(previous->priority >= r->priority);
    previous = r;
    copies.push_back(*r);
  }
  // Examples another rule steals are the file's problem, said as such.
  const Status checked = c->CheckExamples();
  FUZZ_CHECK(checked.ok() || checked.code() == StatusCode::kInvalidArgument);

  Result<LogClassifier> rebuilt = LogClassifier::Create(copies, "fuzz_rules.toml");
  FUZZ_CHECK(rebuilt.ok());
  FUZZ_CHECK(rebuilt->rules().size() == copies.size());
  for (const LogRule& r : copies) {
    for (const std::string& example : r.examples) {
      const std::optional<core::LogMatch> a = c->Classify(example);
      const std::optional<core::LogMatch> b = rebuilt->Classify(example);
      FUZZ_CHECK(a.has_value() == b.has_value());
      if (a) FUZZ_CHECK(a->rule == b->rule && a->cause == b->cause && a->line == b->line);
    }
  }
  return 0;
}
