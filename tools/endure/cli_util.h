// Small pieces the verbs share: the time, exit codes from a Status, and the
// databases of a state directory.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace endure::cli {

// Milliseconds since the Unix epoch, now.
int64_t NowUnixMs();
// "2026-12-01 18:02:39Z".
std::string Utc(int64_t unix_ms);
// Prints "endure VERB: message" and returns the exit code: 2 (usage) for
// InvalidArgument and NotFound, 1 otherwise.
int Fail(const std::string& verb, const Status& st);
// STATE_DIR/FILE when both exist; InvalidArgument saying what to pass when
// not (`what` names the database, e.g. "node health ledger").
Result<std::string> StateDatabase(const std::string& state_dir, const std::string& file,
                                  const std::string& what);

}  // namespace endure::cli
