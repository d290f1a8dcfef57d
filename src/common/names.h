// Names that Endure joins into file paths or uses as keys across processes
// and the network (node names, above all), checked against one strict
// pattern so that a hostile peer cannot make a path leave its directory.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace endure {

// The longest node name accepted (bytes).
inline constexpr size_t kMaxNodeNameBytes = 64;

// Whether `name` is a valid node name: ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$, so
// never "", ".", ".." or anything with a '/', a NUL or a non-ASCII byte.
// Safe as one component of a file path. Thread-safe, pure.
bool IsValidNodeName(std::string_view name);

// OK for a valid node name; kInvalidArgument otherwise, with a message that
// names `what` ("--node-id", "the replica frame's 'node'") and shows the
// offending name (cut to 64 printable characters).
Status CheckNodeName(std::string_view name, std::string_view what);

// The node name of a host named `hostname`: its first label (up to the
// first dot), as Slurm and Kubernetes name nodes. kInvalidArgument, saying
// to pass --node-id, when that is not a valid node name.
Result<std::string> NodeNameOfHost(std::string_view hostname);

// `text` cut to `max` bytes with every byte outside printable ASCII shown as
// \xHH: for quoting hostile input in an error message or a log line.
std::string QuoteForLog(std::string_view text, size_t max = 64);

// The host part of "host:port" or "[v6addr]:port" (brackets removed); the
// whole text when it has no port.
std::string HostOfAddress(std::string_view address);

// Whether `host` names this machine's loopback interface only: "localhost",
// 127.0.0.0/8 or ::1. "", "0.0.0.0" and "::" (every interface) are not:
// what listens there is reachable from other hosts. Pure.
bool IsLoopbackHost(std::string_view host);

}  // namespace endure
