// A labelled corpus of real failure output, and how well a set of log rules
// does on it: the share of excerpts given the right action, the right cause,
// and the harmful actions (evicting a healthy node, restarting in place on
// broken hardware). tests/log_corpus/ is Endure's; an operator can keep one of
// their own logs in the same format and run `endure classify --corpus` on it.
//
// The format (TOML, one [[excerpt]] table per excerpt):
//   source = "https://..."   where the text was copied from (required)
//   cause = "xid_79"         the expected cause (required)
//   action = "evict_node"    the right action (required)
//   why = "..."              why that action is right (optional)
//   text = '''...'''         the excerpt, classified as one (required)
// This file does no I/O.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config_files.h"
#include "common/status.h"
#include "core/log_classifier.h"

namespace endure::core {

struct CorpusExcerpt {
  std::string source;
  std::string cause;
  LogAction action = LogAction::kInvestigate;
  std::string why;
  std::string text;
  std::string file;  // where it is, for messages
  int line = 0;
};

// Errors name the file and line: TOML syntax, unknown keys, missing or
// empty keys, unknown actions.
Result<std::vector<CorpusExcerpt>> ParseLogCorpus(std::string_view text, std::string_view path);
Result<std::vector<CorpusExcerpt>> ParseLogCorpusFiles(const std::vector<TextFile>& files);

// What the controller does with an excerpt no rule matches: its default for a
// failed worker, a restart in place (and nobody is asked to look).
inline constexpr LogAction kUnmatchedAction = LogAction::kRestart;

// Harmful: evict_node where the node is healthy, or a restart in place where
// the hardware is broken.
bool IsHarmful(LogAction expected, LogAction got);

struct CorpusOutcome {
  const CorpusExcerpt* excerpt = nullptr;
  std::optional<LogMatch> match;  // nullopt: no rule matched
  LogAction action = kUnmatchedAction;
  bool action_right = false;
  bool cause_right = false;
  bool harmful = false;
};

struct CauseScore {
  std::string cause;  // expected
  int excerpts = 0;
  int action_right = 0;
  int cause_right = 0;
};

struct CorpusScore {
  int excerpts = 0;
  int multi_line = 0;
  int action_right = 0;
  int cause_right = 0;
  int harmful = 0;
  int evicted_healthy = 0;              // evict_node, the hardware fine
  int restarted_on_broken = 0;          // restart in place, the hardware broken
  std::vector<CauseScore> by_cause;     // by cause name
  std::vector<CorpusOutcome> outcomes;  // in corpus order; point into the corpus

  double ActionAccuracy() const { return excerpts > 0 ? double(action_right) / excerpts : 0; }
  double CauseAccuracy() const { return excerpts > 0 ? double(cause_right) / excerpts : 0; }
  double HarmfulRate() const { return excerpts > 0 ? double(harmful) / excerpts : 0; }
};

CorpusScore ScoreCorpus(const LogClassifier& classifier, const std::vector<CorpusExcerpt>& corpus);

}  // namespace endure::core
