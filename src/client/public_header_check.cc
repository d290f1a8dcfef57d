// Compiled with include/ as the only project include directory: the build
// fails if a public header (endure/client.h, endure/status.h, endure/endure.h)
// includes a header of Endure's source tree.
#include "endure/client.h"
#include "endure/endure.h"
#include "endure/status.h"

namespace {
[[maybe_unused]] endure::StatusCode kChecked = endure::StatusCode::kOk;
}  // namespace
