// Node-name and address checks.
#include "common/names.h"

#include <algorithm>
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

Result<std::string> NodeNameOfHost(std::string_view hostname) {
  const std::string_view label = hostname.substr(0, hostname.find('.'));
  ENDURE_RETURN_IF_ERROR(CheckNodeName(label, "the host's name (pass --node-id NAME)"));
  return std::string(label);
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

std::string HostOfAddress(std::string_view address) {
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close != std::string_view::npos) return std::string(address.substr(1, close - 1));
  }
  const size_t colon = address.rfind(':');
  // More than one colon without brackets: a bare IPv6 address, no port.
  if (colon == std::string_view::npos || address.find(':') != colon) return std::string(address);
  return std::string(address.substr(0, colon));
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8 in dotted form: four decimal parts, the first 127.
  if (host.rfind("127.", 0) != 0) return false;
  int parts = 0;
  size_t i = 0;
  while (i <= host.size()) {
    const size_t dot = std::min(host.find('.', i), host.size());
    const std::string_view part = host.substr(i, dot - i);
    if (part.empty() || part.size() > 3 ||
        part.find_first_not_of("0123456789") != std::string_view::npos ||
        std::stoi(std::string(part)) > 255) {
      return false;
    }
    ++parts;
    i = dot + 1;
  }
  return parts == 4;
}

}  // namespace endure
