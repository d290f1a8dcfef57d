// The live node and incident tables (issue 24, item 6): what the dashboard
// at `/` and `/api/nodes`, `/api/incidents` show a page at a time. The shell
// builds them from its machine at most once a second; the HTTP thread reads
// one page of the last ones built, so no request walks 12,500 nodes or
// touches the event loop.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/report.h"
#include "core/job_machine.h"

namespace endure::controller {

struct LiveTables {
  // One row per registered node, by id: "node", "name", "state" (member,
  // spare, down or refused), "first_rank" (members) and "why" (refused).
  std::vector<nlohmann::json> nodes;
  // One row per incident, newest first, as the report has it
  // (IncidentJson).
  std::vector<nlohmann::json> incidents;
};
LiveTables BuildLiveTables(const core::JobMachine& machine, core::TimePoint start);

// Page `page` of `rows` (the request's "page" parameter; empty is page 0):
// {"total", "page", "pages", "page_rows", "rows"}; a page is as long as
// the report's tables. A page past the last has
// no rows. Anything but a whole number 0..1e9 is an InvalidArgument that
// says what to send.
Result<nlohmann::json> PageOf(const std::vector<nlohmann::json>& rows, std::string_view page,
                              size_t page_rows = kReportRows);

}  // namespace endure::controller
