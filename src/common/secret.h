// Secrets: credentials generated from the kernel's random source, and their
// comparison in time that does not depend on where two strings differ (so
// that a peer cannot guess a token byte by byte from response times).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace endure {

// Whether `a` and `b` are equal. The time taken depends only on the two
// lengths, never on the contents. Thread-safe, pure.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// `bytes` random bytes from getrandom(2) as 2 * `bytes` lowercase hex
// digits, e.g. RandomHex(16) for a 128-bit credential. kIOError when the
// kernel cannot supply them.
Result<std::string> RandomHex(size_t bytes);

}  // namespace endure
