// The live node and incident tables; see live_tables.h.
#include "controller/live_tables.h"

#include <charconv>
#include <string>

namespace endure::controller {

LiveTables BuildLiveTables(const core::JobMachine& machine, core::TimePoint start) {
  LiveTables t;
  for (const core::JobMachine::NodeView& v : machine.NodeViews()) {
    nlohmann::json row = {{"node", v.node.value}, {"name", v.name}};
    if (!v.refused.empty()) {
      row["state"] = "refused";
      row["why"] = v.refused;
    } else if (!v.up) {
      row["state"] = "down";
    } else if (v.first) {
      row["state"] = "member";
      row["first_rank"] = v.first->value;
    } else {
      row["state"] = "spare";
    }
    t.nodes.push_back(std::move(row));
  }
  const std::vector<core::Incident>& incidents = machine.incidents();
  for (auto it = incidents.rbegin(); it != incidents.rend(); ++it) {
    t.incidents.push_back(IncidentJson(*it, start));
  }
  return t;
}

Result<nlohmann::json> PageOf(const std::vector<nlohmann::json>& rows, std::string_view page,
                              size_t page_rows) {
  int64_t asked = 0;
  if (!page.empty()) {
    const auto [end, ec] = std::from_chars(page.data(), page.data() + page.size(), asked);
    if (ec != std::errc() || end != page.data() + page.size() || asked < 0 ||
        asked > 1'000'000'000) {
      return InvalidArgument("page '" + std::string(page) +
                             "' is not a page number: send ?page=N, N from 0");
    }
  }
  const size_t pages = (rows.size() + page_rows - 1) / page_rows;
  nlohmann::json out = {{"total", rows.size()},
                        {"page", asked},
                        {"pages", pages},
                        {"page_rows", page_rows},
                        {"rows", nlohmann::json::array()}};
  const size_t first = static_cast<size_t>(asked) * page_rows;
  for (size_t i = first; i < rows.size() && i < first + page_rows; ++i) {
    out["rows"].push_back(rows[i]);
  }
  return out;
}

}  // namespace endure::controller
