// UTF-8 validation and repair (Unicode 15, table 3-7).
#include "common/utf8.h"

#include <cstdint>

namespace endure {
namespace {

// The length of the well-formed sequence at the start of `s`, or 0 when it
// is ill-formed; `*bad` is then the length of its maximal invalid subpart
// (at least 1).
size_t SequenceLength(std::string_view s, size_t* bad) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(0);
  *bad = 1;
  if (b0 < 0x80) return 1;
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    if (b0 == 0xe0) lo = 0xa0;  // overlong
    if (b0 == 0xed) hi = 0x9f;  // surrogates
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    if (b0 == 0xf0) lo = 0x90;  // overlong
    if (b0 == 0xf4) hi = 0x8f;  // above U+10FFFF
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; ++i) {
    if (i >= s.size()) return 0;
    const uint8_t b = byte(i);
    const uint8_t min = i == 1 ? lo : 0x80;
    const uint8_t max = i == 1 ? hi : 0xbf;
    if (b < min || b > max) return 0;
    *bad = i + 1;
  }
  return n;
}

}  // namespace

bool IsValidUtf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t bad = 0;
    const size_t n = SequenceLength(bytes.substr(pos), &bad);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view bytes) {
  if (IsValidUtf8(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 16);
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t bad = 0;
    const size_t n = SequenceLength(bytes.substr(pos), &bad);
    if (n > 0) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      pos += bad;
    }
  }
  return out;
}

}  // namespace endure
