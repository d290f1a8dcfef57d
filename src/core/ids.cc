// Formatting of the shared value types; see ids.h.
#include "core/ids.h"

namespace endure::core {

std::string FormatRanks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string FormatRanks(const std::vector<Rank>& ranks) {
  std::vector<int> values;
  values.reserve(ranks.size());
  for (Rank r : ranks) values.push_back(r.value);
  return FormatRanks(values);
}

}  // namespace endure::core
