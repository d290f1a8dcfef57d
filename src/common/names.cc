// Node-name checks.
#include "common/names.h"

#include <cstdio>

namespace endure {
namespace {

bool IsAlnum(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

}  // namespace

bool IsValidNodeName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNodeNameBytes || !IsAlnum(name[0])) return false;
  for (char c : name) {
    if (!IsAlnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  // The first character is alphanumeric, so "." and ".." cannot match.
  return true;
}

Status CheckNodeName(std::string_view name, std::string_view what) {
  if (IsValidNodeName(name)) return Status::Ok();
  return InvalidArgument(std::string(what) + ": '" + QuoteForLog(name) +
                         "' is not a valid node name (1 to 64 characters of A-Z a-z 0-9 . _ -, "
                         "starting with a letter or digit)");
}

std::string QuoteForLog(std::string_view text, size_t max) {
  std::string out;
  const bool cut = text.size() > max;
  for (unsigned char c : text.substr(0, max)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  if (cut) out += "...";
  return out;
}

}  // namespace endure
