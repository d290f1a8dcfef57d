// UTF-8 checks for text that came from a process (worker output, stacks):
// it travels as bytes, and is made valid UTF-8 only where it becomes text
// that must be (JSON, a report, a terminal).
#pragma once

#include <string>
#include <string_view>

namespace endure {

// Whether `bytes` is well-formed UTF-8 (no overlong forms, no surrogates,
// nothing above U+10FFFF). Thread-safe, pure.
bool IsValidUtf8(std::string_view bytes);

// `bytes` with every ill-formed sequence replaced by U+FFFD (one per maximal
// invalid subpart, as the Unicode standard recommends); valid input comes
// back unchanged. Thread-safe, pure.
std::string SanitizeUtf8(std::string_view bytes);

}  // namespace endure
