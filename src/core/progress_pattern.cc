// Progress from worker output; see progress_pattern.h.
#include "core/progress_pattern.h"

#include <re2/re2.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <vector>

namespace endure::core {

void LineSplitter::Feed(std::string_view bytes,
                        const std::function<void(std::string_view)>& on_line) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const char c = bytes[pos];
    if (c == '\n' && after_cr_) {  // the second half of "\r\n"
      after_cr_ = false;
      ++pos;
      continue;
    }
    after_cr_ = false;
    if (c == '\n' || c == '\r') {
      const bool empty = line_.empty() && !truncated_;
      if (!truncated_ && (!empty || c == '\n')) on_line(line_);
      line_.clear();
      truncated_ = false;
      after_cr_ = c == '\r';
      ++pos;
      continue;
    }
    size_t end = bytes.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) end = bytes.size();
    if (!truncated_) {
      const size_t take = std::min(end - pos, max_ - line_.size());
      line_.append(bytes.substr(pos, take));
      if (line_.size() >= max_) {
        on_line(line_);
        line_.clear();
        truncated_ = true;
      }
    }
    pos = end;
  }
}

void LineSplitter::Finish(const std::function<void(std::string_view)>& on_line) {
  if (!truncated_ && !line_.empty()) on_line(line_);
  line_.clear();
  truncated_ = false;
  after_cr_ = false;
}

const std::vector<ProgressPreset>& ProgressPresets() {
  static const std::vector<ProgressPreset> presets = {
      // The Trainer's tqdm bar of training steps, alone on its line. Its
      // evaluation and checkpoint-saving bars are nested under it: each of
      // their lines ends with tqdm's cursor-up ("\x1b[A"), or is prefixed
      // ("Writing model shards:"), and is no training step.
      {"huggingface", R"(^\s*\d+%\|[^|]*\| (?P<step>\d+)/\d+ \[[^\]]*\]\s*$)"},
      // Lightning's tqdm bar of an epoch's training batches ("Epoch 3:"; its
      // counter restarts each epoch), and the loss it shows when the
      // program logs one with prog_bar=True; not the sanity check's or the
      // validation's bars.
      {"lightning", R"(Epoch \d+:\s*(?:\d+%)?\|[^|]*\| (?P<step>\d+)/(?:\d+|\?) \[)"
                    R"((?:[^\]]*?\w*loss=(?P<loss>[^,\]]+))?[^\]]*\])"},
  };
  return presets;
}

std::string ExpandProgressPattern(std::string_view text) {
  for (const ProgressPreset& p : ProgressPresets()) {
    if (p.name == text) return std::string(p.pattern);
  }
  return std::string(text);
}

Result<ProgressPattern> ProgressPattern::Compile(std::string_view pattern) {
  RE2::Options options;
  options.set_log_errors(false);
  auto re = std::make_shared<const RE2>(re2::StringPiece(pattern.data(), pattern.size()), options);
  if (!re->ok()) {
    return InvalidArgument("the regular expression does not compile: " + re->error() +
                           " (RE2 syntax, https://github.com/google/re2/wiki/Syntax)");
  }
  ProgressPattern p(re);
  for (const auto& [name, index] : re->NamedCapturingGroups()) {
    if (name == "step") {
      p.step_group_ = index;
    } else if (name == "loss") {
      p.loss_group_ = index;
    } else {
      return InvalidArgument("unknown named group '" + name +
                             "': only (?P<step>...) and (?P<loss>...) are read");
    }
  }
  if (p.step_group_ == 0) {
    return InvalidArgument(
        "needs a named group 'step' around the step number, e.g. 'step (?P<step>\\d+)'");
  }
  return p;
}

const std::string& ProgressPattern::pattern() const { return re_->pattern(); }

std::optional<ProgressMatch> ProgressPattern::Match(std::string_view line) const {
  const int groups = re_->NumberOfCapturingGroups();
  std::vector<re2::StringPiece> sub(static_cast<size_t>(groups) + 1);
  if (!re_->Match(re2::StringPiece(line.data(), line.size()), 0, line.size(), RE2::UNANCHORED,
                  sub.data(), groups + 1)) {
    return std::nullopt;
  }
  const re2::StringPiece step = sub[step_group_];
  if (step.empty() || step.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (char c : step) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    value = value * 10 + (c - '0');
  }
  ProgressMatch m;
  m.step = value;
  if (loss_group_ > 0 && sub[loss_group_].data() != nullptr && !sub[loss_group_].empty()) {
    const std::string text(sub[loss_group_].data(), sub[loss_group_].size());
    char* end = nullptr;
    const double loss = std::strtod(text.c_str(), &end);
    if (end == text.c_str() + text.size()) m.loss = loss;
  }
  return m;
}

std::optional<int64_t> OutputProgress::Observe(int64_t printed) {
  if (printed < 0) return std::nullopt;
  const int64_t before = completed_;
  if (!last_) {
    completed_ = printed;
  } else if (printed > *last_) {
    completed_ += printed - *last_;
  } else if (printed < *last_) {
    completed_ += printed;
  }
  last_ = printed;
  if (completed_ > before) return completed_;
  return std::nullopt;
}

OutputReports::OutputReports(ProgressPattern pattern, int world_size)
    : pattern_(std::move(pattern)), ranks_(static_cast<size_t>(std::max(world_size, 0))) {}

void OutputReports::OnDatagram(int rank, std::string_view type) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  Rank& r = ranks_[rank];
  if (type == "ready") {
    r.ready = r.datagram_ready = true;
  } else if (type == "step" || type == "skip") {
    r.datagram_steps = true;
  }
}

std::vector<OutputReport> OutputReports::OnLine(int rank, std::string_view line) {
  std::vector<OutputReport> out;
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return out;
  Rank& r = ranks_[rank];
  if (r.datagram_steps) return out;
  const std::optional<ProgressMatch> match = pattern_.Match(line);
  if (!match) {
    if (!matched_) {
      ++unmatched_lines_;
      last_unmatched_ = std::string(line.substr(0, kLastLineBytes));
    }
    return out;
  }
  matched_ = true;
  const bool whole_job = rank == 0 && !r.datagram_ready;
  const bool first = !r.output.seen();
  const std::optional<int64_t> completed = r.output.Observe(match->step);
  auto ready = [&](int q) {
    if (ranks_[q].ready) return;
    ranks_[q].ready = true;
    out.push_back({OutputReport::Kind::kReady, q, 0, std::nullopt});
  };
  if (first) {
    ready(rank);
    if (whole_job) {
      for (int q = 1; q < static_cast<int>(ranks_.size()); ++q) ready(q);
    }
  }
  if (!completed) return out;
  out.push_back({OutputReport::Kind::kStep, rank, *completed, match->loss});
  if (whole_job) {
    for (int q = 1; q < static_cast<int>(ranks_.size()); ++q) {
      if (!ranks_[q].datagram_steps) {
        out.push_back({OutputReport::Kind::kStep, q, *completed, std::nullopt});
      }
    }
  }
  return out;
}

}  // namespace endure::core
