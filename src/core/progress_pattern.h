// Step progress from the output of programs that do not use the client
// library (`[detection] progress_pattern`, docs/progress_pattern.md): a
// regular expression with a named group `step` (and optionally `loss`)
// matched against each line a worker prints. Pure pieces, no I/O:
//
//   LineSplitter    bytes of a worker's output -> lines. '\n', '\r' and
//                   "\r\n" end a line, since progress bars (tqdm) redraw with
//                   '\r' even into a pipe; a line is cut at kMaxLineBytes so
//                   output without line ends cannot grow a buffer.
//   ProgressPattern one line -> the printed step number (and loss), if it
//                   matches.
//   OutputProgress  printed step numbers -> a monotonic count of steps
//                   completed, robust to repeats (a progress bar redrawn at
//                   the same count) and to counters that restart (Lightning's
//                   per-epoch bar).
//   OutputReports   one generation on one node: what its ranks reported by
//                   datagram, and which "ready" and "step" reports a line of
//                   output adds (rank 0's progress stands for every rank).
//
// ProgressPattern is immutable and thread-safe once built; the others are
// plain values (not thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace re2 {
class RE2;
}

namespace endure::core {

// The longest line matched or kept; the rest of a longer line is dropped.
inline constexpr size_t kMaxLineBytes = 64 * 1024;

class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line_bytes = kMaxLineBytes) : max_(max_line_bytes) {}

  // Feeds the next bytes of the stream; calls `on_line` for each line they
  // complete, without its terminator. A line that reaches the limit is passed
  // on at the limit, once, and the rest of it is skipped. "\r\n" is one line
  // end; an empty line ended by '\r' is dropped (tqdm starts each redraw
  // with '\r'), one ended by '\n' is passed on.
  void Feed(std::string_view bytes, const std::function<void(std::string_view)>& on_line);

  // End of the stream: passes on what is left of an unterminated line.
  void Finish(const std::function<void(std::string_view)>& on_line);

 private:
  size_t max_;
  std::string line_;
  bool truncated_ = false;  // line_ was passed on at the limit; skip to its end
  bool after_cr_ = false;   // the last byte was a '\r' that ended a line
};

struct ProgressMatch {
  int64_t step = 0;            // the number the program printed
  std::optional<double> loss;  // when the pattern has a `loss` group and it matched a number
};

// Patterns for the progress bars of stock frameworks, by name: a spec's
// progress_pattern may name one instead of spelling a pattern
// (docs/progress_pattern.md). Each is checked against the framework's real
// output, captured from PyPI's releases (tests/testdata/progress/).
struct ProgressPreset {
  std::string_view name;
  std::string_view pattern;
};
const std::vector<ProgressPreset>& ProgressPresets();
// The pattern `text` stands for: a preset's, when it names one; else `text`.
std::string ExpandProgressPattern(std::string_view text);

class ProgressPattern {
 public:
  // Compiles `pattern` (RE2 syntax). InvalidArgument, saying what to fix,
  // when it does not compile, has no named group `step`, or has a named group
  // other than `step` and `loss`.
  static Result<ProgressPattern> Compile(std::string_view pattern);

  // The step (and loss) of `line`, when the pattern is found in it and the
  // `step` group holds a non-negative integer (at most 18 digits).
  std::optional<ProgressMatch> Match(std::string_view line) const;

  const std::string& pattern() const;

 private:
  explicit ProgressPattern(std::shared_ptr<const re2::RE2> re) : re_(std::move(re)) {}
  std::shared_ptr<const re2::RE2> re_;
  int step_group_ = 0;  // 1-based capture indices; 0: absent
  int loss_group_ = 0;
};

// Turns the step numbers one worker prints into steps completed in this
// generation, which only ever grow:
//   - the first number is taken as is (a program that resumed from its own
//     checkpoint prints its absolute step);
//   - a higher number adds the difference (a program that prints every 10th
//     step advances by 10);
//   - the same number again adds nothing (a redrawn progress bar);
//   - a lower number means the counter restarted (a new epoch's progress
//     bar): it adds the new number itself, steps done since the restart.
class OutputProgress {
 public:
  // Returns the new count when `printed` advanced it, nullopt otherwise.
  std::optional<int64_t> Observe(int64_t printed);

  bool seen() const { return last_.has_value(); }
  int64_t completed() const { return completed_; }

 private:
  std::optional<int64_t> last_;
  int64_t completed_ = 0;
};

// A report for the controller, as the client library would have sent it.
struct OutputReport {
  enum class Kind { kReady, kStep };
  Kind kind = Kind::kStep;
  int rank = 0;
  int64_t step = 0;            // kStep: steps completed
  std::optional<double> loss;  // kStep: none means nothing to judge
  bool operator==(const OutputReport&) const = default;
};

// The ranks of one generation as seen by one node's agent, for the progress
// pattern. The decisions, in order:
//   - A rank that sent "step" or "skip" datagrams uses the client library:
//     its output is not read for progress (datagrams win, nothing counts
//     twice).
//   - The first match in a rank's output also reports it ready, unless it
//     sent a "ready" datagram: the controller's start-up phase and the
//     incident timeline need one.
//   - Steps come from OutputProgress and are reported when they advance,
//     with the loss when the pattern caught one.
//   - Rank 0 stands for the job while it reports through its output alone
//     (no "ready" datagram): usually only rank 0 prints progress, and in
//     data parallel every rank is in lockstep with it. Its ready and steps
//     are then reported for every rank of the world too, on this node or
//     not (except ranks of this node that send step datagrams), so that the
//     hang detector, which waits for every rank, and the job's step, the
//     lowest rank's, follow it. Ranks that also report themselves do so as
//     well; the controller keeps each rank's highest step.
class OutputReports {
 public:
  // A generation of `world_size` ranks.
  OutputReports(ProgressPattern pattern, int world_size);

  // A datagram of `type` ("ready", "step", "skip", ...) from `rank`, which
  // runs on this node.
  void OnDatagram(int rank, std::string_view type);

  // A line of `rank`'s output: the reports it adds, in the order to send them.
  std::vector<OutputReport> OnLine(int rank, std::string_view line);

  // Whether the pattern has matched a line of this node's output yet, and
  // the lines read for progress (from ranks that send no step datagrams)
  // before it did, the last of them at most kLastLineBytes long.
  bool matched() const { return matched_; }
  int64_t unmatched_lines() const { return unmatched_lines_; }
  const std::string& last_unmatched() const { return last_unmatched_; }
  static constexpr size_t kLastLineBytes = 200;

 private:
  struct Rank {
    bool ready = false;           // a "ready" went up for it (datagram or synthesised)
    bool datagram_ready = false;  // it sent a "ready" datagram
    bool datagram_steps = false;  // it sent "step"/"skip" datagrams
    OutputProgress output;
  };
  ProgressPattern pattern_;
  std::vector<Rank> ranks_;
  bool matched_ = false;
  int64_t unmatched_lines_ = 0;
  std::string last_unmatched_;
};

}  // namespace endure::core
