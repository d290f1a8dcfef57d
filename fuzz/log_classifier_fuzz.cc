// Fuzz target: what the log classifier does with worker output — any bytes,
// not necessarily UTF-8, and lines far longer than a terminal's — under the
// shipped config/log_rules/: SplitExcerpts, SplitNonBlankLines, Classify
// and ClassifyAll. An input whose first byte is 0xff is the rest repeated
// into one line of 128 KiB, without a newline: twice the longest line an
// agent passes on (agent::kMaxLineBytes), as an excerpt of several lines is.
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "common/config_files.h"
#include "common/env.h"
#include "core/log_classifier.h"
#include "fuzz/fuzz_util.h"

using namespace endure;
using core::LogClassifier;
using core::LogExcerpt;

namespace {

const LogClassifier& Shipped() {
  static const LogClassifier* const classifier = [] {
    Result<std::vector<TextFile>> files = ReadConfigFiles(ENDURE_LOG_RULES_PATH, ".toml");
    FUZZ_CHECK(files.ok());
    Result<LogClassifier> c = LogClassifier::FromTomlFiles(*files, ENDURE_LOG_RULES_PATH);
    if (!c.ok()) std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    FUZZ_CHECK(c.ok());
    return new LogClassifier(std::move(c).value());
  }();
  return *classifier;
}

void CheckExcerpts(const std::vector<LogExcerpt>& excerpts, bool one_line_each) {
  int last = 0;
  for (const LogExcerpt& e : excerpts) {
    FUZZ_CHECK(!e.text.empty() && e.text.back() == '\n');
    FUZZ_CHECK(e.first_line > last && e.first_line <= e.last_line);
    if (one_line_each) FUZZ_CHECK(e.first_line == e.last_line);
    last = e.last_line;
  }
}

void CheckClassify(const LogClassifier& c, std::string_view text) {
  const std::optional<core::LogMatch> first = c.Classify(text);
  const std::vector<core::LogMatch> all = c.ClassifyAll(text);
  FUZZ_CHECK(first.has_value() == !all.empty());
  if (!first) return;
  FUZZ_CHECK(first->rule == all.front().rule && first->cause == all.front().cause &&
             first->line_number == all.front().line_number);
  for (const core::LogMatch& m : all) {
    FUZZ_CHECK(m.line_number >= 1 && !m.rule.empty());
    FUZZ_CHECK(m.line.size() <= text.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const LogClassifier& c = Shipped();
  std::string_view text = fuzz::AsText(data, size);
  std::string huge;
  if (!text.empty() && text.front() == '\xff') {
    text.remove_prefix(1);
    if (text.empty()) return 0;
    constexpr size_t kHugeLineBytes = 128 << 10;
    huge.reserve(kHugeLineBytes + text.size());
    while (huge.size() < kHugeLineBytes) {
      for (char ch : text) huge += ch == '\n' ? ' ' : ch;
    }
    CheckClassify(c, huge);
    return 0;
  }
  CheckClassify(c, text);
  const std::vector<LogExcerpt> excerpts = core::SplitExcerpts(text);
  CheckExcerpts(excerpts, false);
  for (const LogExcerpt& e : excerpts) CheckClassify(c, e.text);
  CheckExcerpts(core::SplitNonBlankLines(text), true);
  return 0;
}
