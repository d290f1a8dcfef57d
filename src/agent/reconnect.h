// The delays between an agent's attempts to reach its controller again
// (ReconnectBackoff), a pure piece: it reads no clock and does no I/O. The
// events that happen meanwhile wait in the node core's outage buffer
// (core/outage_buffer.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

#include "common/duration.h"
#include "common/status.h"

namespace endure::agent {

struct ReconnectBackoffOptions {
  Duration initial = std::chrono::milliseconds(500);  // before the second attempt
  Duration max = std::chrono::seconds(10);            // no delay is longer
  // Each delay is shortened by up to this fraction of itself, at random, so
  // that the agents of a job do not all knock at the same instant.
  double jitter = 0.25;

  // Names the first invalid field and its accepted range.
  Status Validate() const;
};

// Delays between reconnection attempts: none before the first (a blip is
// over at once more often than not), then `initial` doubling up to `max`,
// each jittered down. Deterministic for a given seed. Not thread-safe.
class ReconnectBackoff {
 public:
  // `options` must be valid (ENDURE_CHECK).
  ReconnectBackoff(ReconnectBackoffOptions options, uint64_t seed);

  // The wait before the next attempt; the first call returns zero.
  Duration Next();
  // The delay that Next() jitters, for the attempt after the next one
  // (zero before the first call).
  Duration nominal() const { return nominal_; }

 private:
  ReconnectBackoffOptions o_;
  std::mt19937_64 rng_;
  int attempts_ = 0;
  Duration nominal_{0};
};

}  // namespace endure::agent
