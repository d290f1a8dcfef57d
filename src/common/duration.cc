// Duration parsing and formatting.
#include "common/duration.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace endure {
namespace {

// Nanoseconds per unit, longest suffix first so that "ms" wins over "m".
struct Unit {
  std::string_view suffix;
  double ns;
};
constexpr Unit kUnits[] = {
    {"ns", 1.0}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}, {"m", 60e9}, {"h", 3600e9}, {"d", 86400e9},
};

Status Bad(std::string_view text, const char* why) {
  return InvalidArgument("invalid duration '" + std::string(text) + "': " + why +
                         " (write e.g. 500ms, 30s, 5m, 2h, 1h30m, 90d)");
}

}  // namespace

Result<Duration> ParseDuration(std::string_view text) {
  if (text.empty()) return Bad(text, "empty");
  double total_ns = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.')) ++i;
    if (i == start) {
      return Bad(text, text[start] == '-' ? "durations cannot be negative" : "expected a number");
    }
    std::string number(text.substr(start, i - start));
    char* end = nullptr;
    double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size()) return Bad(text, "malformed number");
    const Unit* unit = nullptr;
    for (const Unit& u : kUnits) {
      if (text.substr(i, u.suffix.size()) == u.suffix) {
        // "m" must not swallow the "m" of "ms": kUnits lists "ms" first.
        unit = &u;
        break;
      }
    }
    if (unit == nullptr) return Bad(text, "missing or unknown unit");
    i += unit->suffix.size();
    total_ns += value * unit->ns;
  }
  if (!std::isfinite(total_ns) || total_ns > 9.2e18) return Bad(text, "too large");
  return Duration(static_cast<int64_t>(std::llround(total_ns)));
}

std::string FormatDuration(Duration d) {
  double s = Seconds(d);
  char buf[64];
  if (s < 0) return "-" + FormatDuration(-d);
  if (s < 1) {
    std::snprintf(buf, sizeof buf, "%.0fms", s * 1e3);
  } else if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    auto total = static_cast<int64_t>(s);
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  } else if (s < 86400) {
    auto total = static_cast<int64_t>(s / 60);
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  } else {
    auto total = static_cast<int64_t>(s / 3600);
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(total / 24),
                  static_cast<long long>(total % 24));
  }
  return buf;
}

}  // namespace endure
