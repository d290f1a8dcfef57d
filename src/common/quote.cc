// Quoting strings; see quote.h.
#include "common/quote.h"

#include <cstdio>

namespace endure {

void AppendQuoted(std::string_view s, ControlEscape style, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, style == ControlEscape::kHexByte ? "\\x%02x" : "\\u%04x",
                        c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

}  // namespace endure
