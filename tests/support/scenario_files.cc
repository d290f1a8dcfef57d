#include "tests/support/scenario_files.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

namespace endure::testing_support {
namespace fs = std::filesystem;

std::vector<std::string> ScenarioFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".txt") out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

bool Rewriting() {
  const char* v = std::getenv("ENDURE_REWRITE_TESTDATA");
  return v != nullptr && std::string_view(v) == "1";
}

// Where two texts first differ, as "line N: expected / got".
std::string FirstDifference(const std::string& want, const std::string& got) {
  std::istringstream a(want), b(got);
  std::string x, y;
  for (int n = 1;; ++n) {
    const bool more_a = static_cast<bool>(std::getline(a, x));
    const bool more_b = static_cast<bool>(std::getline(b, y));
    if (!more_a && !more_b) return "no difference";
    if (!more_a) x = "<end of file>";
    if (!more_b) y = "<end of output>";
    if (x != y || !more_a || !more_b) {
      return "line " + std::to_string(n) + ":\n  file: " + x + "\n  now:  " + y;
    }
  }
}

}  // namespace

std::string CheckScenarioFile(const std::string& dir, const std::string& name,
                              const std::function<Result<std::string>(const std::string&)>& run,
                              std::string_view test_binary) {
  const fs::path path = fs::path(dir) / name;
  std::ifstream in(path);
  if (!in) return "cannot read " + path.string();
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  Result<std::string> got = run(text);
  if (!got.ok()) return path.string() + ": " + got.status().message();
  if (Rewriting()) {
    if (*got != text) {
      std::ofstream(path) << *got;
      std::cout << "rewrote " << path.string() << "\n";
    }
    return "";
  }
  if (*got == text) return "";
  // Only where they differ: the whole texts would bury it.
  return path.string() + " differs at " + FirstDifference(text, *got) +
         "\n(if the change is intended: ENDURE_REWRITE_TESTDATA=1 " + std::string(test_binary) +
         ", then review the diff)";
}

std::string ScenarioTestName(const std::string& file) {
  std::string name = fs::path(file).stem().string();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

std::string Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> Words(std::string_view s) {
  std::vector<std::string> out;
  std::istringstream in{std::string(s)};
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

Result<std::vector<std::string>> QuotedWords(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (true) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    if (i == s.size()) return out;
    std::string word;
    bool quoted = false;
    for (; i < s.size() && (quoted || (s[i] != ' ' && s[i] != '\t')); ++i) {
      if (s[i] == '"') {
        quoted = !quoted;
      } else if (quoted && s[i] == '\\' && i + 1 < s.size() &&
                 (s[i + 1] == '"' || s[i + 1] == '\\' || s[i + 1] == 'n')) {
        ++i;
        word += s[i] == 'n' ? '\n' : s[i];
      } else {
        word += s[i];
      }
    }
    if (quoted) return InvalidArgument("an unterminated quote in: " + std::string(s));
    out.push_back(std::move(word));
  }
}

Result<int64_t> ParseSecondsNs(std::string_view s) {
  const size_t dot = s.find('.');
  const std::string_view whole = s.substr(0, dot);
  std::string_view frac = dot == std::string_view::npos ? "" : s.substr(dot + 1);
  int64_t w = 0;
  auto [end, ec] = std::from_chars(whole.data(), whole.data() + whole.size(), w);
  if (whole.empty() || ec != std::errc() || end != whole.data() + whole.size() || w < 0 ||
      frac.size() > 9) {
    return InvalidArgument("expected seconds such as 12 or 0.15, got '" + std::string(s) + "'");
  }
  int64_t f = 0;
  for (size_t i = 0; i < 9; ++i) {
    const char c = i < frac.size() ? frac[i] : '0';
    if (c < '0' || c > '9') {
      return InvalidArgument("expected seconds such as 12 or 0.15, got '" + std::string(s) + "'");
    }
    f = f * 10 + (c - '0');
  }
  return w * 1'000'000'000 + f;
}

std::string FormatSecondsNs(int64_t ns) {
  std::string frac = std::to_string(ns % 1'000'000'000);
  frac.insert(0, 9 - frac.size(), '0');
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return std::to_string(ns / 1'000'000'000) + (frac.empty() ? "" : "." + frac);
}

Result<int64_t> ParseInt(std::string_view s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
    return InvalidArgument("expected an integer, got '" + std::string(s) + "'");
  }
  return v;
}

Result<std::vector<int64_t>> ParseInts(std::string_view s) {
  std::vector<int64_t> out;
  while (!s.empty()) {
    const size_t comma = std::min(s.find(','), s.size());
    Result<int64_t> n = ParseInt(s.substr(0, comma));
    if (!n.ok()) return n.status();
    out.push_back(*n);
    s.remove_prefix(std::min(s.size(), comma + 1));
  }
  return out;
}

Result<double> ParseDouble(std::string_view s) {
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
    return InvalidArgument("expected a number, got '" + std::string(s) + "'");
  }
  return v;
}

Result<bool> ParseBool(std::string_view s) {
  if (s == "true") return true;
  if (s == "false") return false;
  return InvalidArgument("expected true or false, got '" + std::string(s) + "'");
}

Result<std::map<std::string, std::string>> KeyValues(const std::vector<std::string>& words,
                                                     size_t from) {
  std::map<std::string, std::string> out;
  for (size_t i = from; i < words.size(); ++i) {
    const size_t eq = words[i].find('=');
    if (eq == std::string::npos) return InvalidArgument("expected key=value, got " + words[i]);
    out[words[i].substr(0, eq)] = words[i].substr(eq + 1);
  }
  return out;
}

std::string Num(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

}  // namespace endure::testing_support
