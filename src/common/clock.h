// Clock: where the agent's and the controller's shells read the time, so
// that their logic can be tested with a FakeClock (no sleeps). The decision
// cores in src/core take time as an argument and need neither.
#pragma once

#include <chrono>

#include "common/duration.h"
#include "common/mutex.h"

namespace endure {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;
  // Monotonic time: deadlines and intervals.
  virtual TimePoint Now() const = 0;
  // Seconds since the Unix epoch: timestamps that go into events and logs.
  virtual double WallSeconds() const = 0;

  // The process's real clock (steady_clock and system_clock); never null.
  static Clock* Real();
};

// A clock that moves only when told to. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(double wall_seconds = 1.7e9) : wall_(wall_seconds) {}

  TimePoint Now() const override {
    MutexLock lock(&mu_);
    return now_;
  }
  double WallSeconds() const override {
    MutexLock lock(&mu_);
    return wall_ + Seconds(now_ - TimePoint{});
  }
  void Advance(Duration d) {
    MutexLock lock(&mu_);
    now_ += std::chrono::duration_cast<TimePoint::duration>(d);
  }

 private:
  mutable Mutex mu_;
  TimePoint now_ GUARDED_BY(mu_) = TimePoint{};
  double wall_;
};

}  // namespace endure
