// The job report as one self-contained HTML page (`endure report --html`):
// the outcome and ETTR, the ledger by category (a table and a bar chart),
// ETTR, the ledger, loss and throughput over time from the report's
// "history" with the incidents marked, every incident with its timings, and
// every run of the state directory. Inline CSS and inline SVG charts
// (common/svg_chart.h): no script, nothing fetched, so the file can be
// mailed, archived or opened offline. docs/report.md describes it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace endure::controller {

// The page for `report` (ReportFromStore's or BuildReport's JSON, keys as in
// docs/report.md; any may be missing or null) and `runs` (RunHistory's
// array; empty or null: no runs table). Every string from either is
// escaped, so hostile log lines, reasons or names stay text. The ETTR
// figure is in an element with id "ettr" whose `value` attribute is the
// report's "ettr" exactly as JSON writes it. Without a non-empty "history"
// the page says "no history recorded". Pure and thread-safe; never fails.
std::string RenderReportHtml(const nlohmann::json& report, const nlohmann::json& runs);

}  // namespace endure::controller
