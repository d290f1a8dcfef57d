// Recognizing a failure seen before: the text of an incident (its log excerpt,
// its stack signature, its cause) normalized so that two occurrences of one
// fault compare equal despite their pids, addresses, times and paths; a
// similarity between two incidents; and, from the incidents an operator
// resolved that no log rule matched, candidate rules to review (Acme, NSDI'24,
// turns diagnoses back into rules the same way).
//
// The knowledge base that stores incidents across jobs is the controller's
// (controller/incident_kb); this file does no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/log_classifier.h"

namespace endure::core {

// The excerpt with what varies between occurrences replaced, line by line
// (line i of the result is line i of the input): timestamps and kernel time
// prefixes, PCI addresses, IP addresses and ports, hexadecimal numbers and
// addresses, numbers of four or more digits (pids, sizes, sequence numbers;
// shorter ones, such as an Xid, an errno or an exit code, stay), directories
// of paths (the file name stays), lower-cased. ANSI colours and trailing
// spaces go.
std::string NormalizeExcerpt(std::string_view excerpt);

// The excerpt kept for an incident: the last `max_lines` lines of a worker's
// output, at most `max_bytes` (whole lines; a single longer line is cut to its
// end), as the agent sends it and the knowledge base stores it.
std::string BoundedExcerpt(std::string_view tail, size_t max_lines = 60, size_t max_bytes = 8192);

// What is compared: one incident as the knowledge base keeps it.
struct IncidentText {
  int64_t id = 0;
  std::string cause;
  std::string normalized;       // NormalizeExcerpt of its log excerpt
  std::string stack_signature;  // of the stuck rank's main thread, for hangs
};

struct Similar {
  int64_t id = 0;
  double score = 0;  // 0..1
};

// A recurrence: at least this similar.
inline constexpr double kRecurrenceScore = 0.6;

// The `k` past incidents most similar to `query` (excluding its own id), best
// first, at least `min_score`. The score is the cosine similarity of TF-IDF
// vectors over the words and word pairs of the excerpt's evidence lines (those
// that read as an error, a warning or a kernel message, when there are any;
// else all its lines: the progress output around an error differs from job to
// job), the stack signature's frames and the cause, with the inverse document
// frequencies taken over `past`: words every incident has count little, a
// rare error message much.
std::vector<Similar> FindSimilar(const IncidentText& query, const std::vector<IncidentText>& past,
                                 int k, double min_score);

// An incident an operator resolved, for SuggestRules.
struct ResolvedIncident {
  int64_t id = 0;
  std::string excerpt;  // as the worker printed it
  std::string cause;    // the operator's cause when they gave one, else the incident's
  LogAction action = LogAction::kInvestigate;  // the operator's resolution
  std::string note;
};

struct RuleCandidate {
  LogRule rule;                    // name, pattern, cause, action, examples, description
  std::vector<int64_t> incidents;  // the resolved incidents it comes from
  std::string key_line;            // the normalized line the pattern is made from
  // Other resolved incidents it would match whose resolution differs.
  std::vector<int64_t> conflicts;
};

// Groups the resolved incidents by similarity (kRecurrenceScore), and for each
// group proposes a rule: the most specific normalized line the group's
// excerpts share, as a pattern (literal text escaped, the normalized parts as
// \d+, hex and \S+), the operator's action (investigate where the group's
// resolutions disagree) and cause, the group's raw lines as examples. Each
// candidate compiles and matches its examples; `conflicts` names resolved
// incidents it would match that were resolved otherwise.
std::vector<RuleCandidate> SuggestRules(const std::vector<ResolvedIncident>& resolved);

// The candidates as [[rule]] tables for a rules file, with comments naming
// the incidents; ready for review, then `endure classify --check`.
std::string RuleCandidatesToToml(const std::vector<RuleCandidate>& candidates);

}  // namespace endure::core
