// What the scenario-file tests share (core/job_machine_scenario_test.cc,
// core/node_machine_scenario_test.cc), in the style of etcd-io/raft's
// datadriven tests: a directory of .txt files, each replayed into a fresh
// machine and compared, as a whole text, with what the machine printed;
// ENDURE_REWRITE_TESTDATA=1 writes the new output back for review. And the
// small parsers their lines need.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace endure::testing_support {

// The .txt files in `dir`, sorted by name.
std::vector<std::string> ScenarioFiles(const std::string& dir);

// Replays `dir`/`name` through `run` (the file's text -> the text it should
// be) and compares. Returns "" when they agree (or, with
// ENDURE_REWRITE_TESTDATA=1, after writing the new text back), else what to
// report: where they first differ and how to accept a deliberate change.
std::string CheckScenarioFile(const std::string& dir, const std::string& name,
                              const std::function<Result<std::string>(const std::string&)>& run,
                              std::string_view test_binary);

// A gtest parameter name for a file: its stem, other characters than
// letters and digits as '_'.
std::string ScenarioTestName(const std::string& file);

// ---- Small parsers ----

std::string Trim(std::string_view s);
// Words separated by blanks.
std::vector<std::string> Words(std::string_view s);
// The same, where a word may hold `key="quoted text"`: one word, its quotes
// removed. Inside, \" \\ and \n are escapes; any other backslash is kept
// (regular expressions stay readable).
Result<std::vector<std::string>> QuotedWords(std::string_view s);
// "12", "0.15", "6.05": seconds, read exactly into nanoseconds (no binary
// rounding, so that times print back as written).
Result<int64_t> ParseSecondsNs(std::string_view s);
std::string FormatSecondsNs(int64_t ns);
Result<int64_t> ParseInt(std::string_view s);
// "3,0,12": integers separated by commas ("" is none).
Result<std::vector<int64_t>> ParseInts(std::string_view s);
// Also "nan" and "inf".
Result<double> ParseDouble(std::string_view s);
Result<bool> ParseBool(std::string_view s);
// `key=value` words from `from` on.
Result<std::map<std::string, std::string>> KeyValues(const std::vector<std::string>& words,
                                                     size_t from);
// The shortest text that reads back as `v`.
std::string Num(double v);

}  // namespace endure::testing_support
