// The reconnection backoff of agent/reconnect.h.
#include "agent/reconnect.h"

#include <algorithm>
#include <utility>

namespace endure::agent {

Status ReconnectBackoffOptions::Validate() const {
  if (initial <= Duration::zero()) {
    return InvalidArgument("reconnect backoff: initial must be positive, got " +
                           FormatDuration(initial));
  }
  if (max < initial) {
    return InvalidArgument("reconnect backoff: max must be at least initial=" +
                           FormatDuration(initial) + ", got " + FormatDuration(max));
  }
  if (!(jitter >= 0.0 && jitter < 1.0)) {
    return InvalidArgument("reconnect backoff: jitter must be in [0, 1), got " +
                           std::to_string(jitter));
  }
  return Status::Ok();
}

ReconnectBackoff::ReconnectBackoff(ReconnectBackoffOptions options, uint64_t seed)
    : o_(options), rng_(seed) {
  ENDURE_CHECK(o_.Validate().ok());
}

Duration ReconnectBackoff::Next() {
  if (attempts_++ == 0) {
    nominal_ = o_.initial;
    return Duration::zero();
  }
  const Duration base = nominal_;
  nominal_ = std::min(o_.max, nominal_ * 2);
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return std::chrono::duration_cast<Duration>(base * (1.0 - o_.jitter * u));
}

}  // namespace endure::agent
