// The agent's gate on worker datagrams, and its log rate limiter.
#include "core/datagram_gate.h"

#include <algorithm>

#include "common/secret.h"

namespace endure::core {

DatagramGate::Verdict DatagramGate::Admit(const Datagram& d) const {
  if (d.generation != generation) return Verdict::kStale;
  if (credential.empty() || !ConstantTimeEquals(d.token, credential)) {
    return Verdict::kBadCredential;
  }
  if (!local_ranks.count(d.rank)) return Verdict::kForeignRank;
  return Verdict::kAccept;
}

std::string_view VerdictName(DatagramGate::Verdict v) {
  switch (v) {
    case DatagramGate::Verdict::kAccept:
      return "accepted";
    case DatagramGate::Verdict::kStale:
      return "from another generation";
    case DatagramGate::Verdict::kBadCredential:
      return "wrong credential (not this generation's ENDURE_TOKEN)";
    case DatagramGate::Verdict::kForeignRank:
      return "from a rank this node does not run in this generation";
  }
  return "?";
}

LogRateLimiter::LogRateLimiter(int burst, Clock::duration interval)
    : burst_(std::max(1, burst)), interval_(interval), credit_(interval * burst_) {}

bool LogRateLimiter::Allow(Clock::time_point now, int64_t* suppressed) {
  // Credit is kept as time (exact integer arithmetic): each event costs one
  // interval, and at most `burst` intervals are saved up.
  if (last_ && now > *last_) credit_ = std::min(interval_ * burst_, credit_ + (now - *last_));
  if (!last_ || now > *last_) last_ = now;
  if (credit_ < interval_) {
    ++held_back_;
    return false;
  }
  credit_ -= interval_;
  if (suppressed != nullptr) *suppressed = held_back_;
  held_back_ = 0;
  return true;
}

}  // namespace endure::core
