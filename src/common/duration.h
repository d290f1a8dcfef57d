// Durations as people write them in flags and job specs: "500ms", "30s",
// "5m", "2h", "90d", and sums such as "1h30m". Plain numbers are refused so
// that a unit is never guessed.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "common/status.h"

namespace endure {

using Duration = std::chrono::nanoseconds;

// Parses `text`; the error message quotes the text and lists the units.
Result<Duration> ParseDuration(std::string_view text);

// Short human form: "850ms", "12.5s", "3m20s", "2h05m", "4d03h".
std::string FormatDuration(Duration d);

inline double Seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
inline Duration FromSeconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

}  // namespace endure
