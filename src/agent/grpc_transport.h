// The agent's real Transport: a gRPC channel to the controller and its
// Attach stream. The channel, and so its credentials, are made in one place,
// MakeControllerChannel (grpc_transport.cc).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent.h"
#include "agent/transport.h"
#include "common/tls.h"

namespace endure::agent {

// The addresses of `--controller`: one host:port, or a comma-separated list
// of the job's controllers (a leader and its standbys), in order. Empty
// items are dropped.
std::vector<std::string> ControllerAddresses(const std::string& controller);

// A transport to `options.controller`. Attach() tries each address in turn,
// on a new channel each time: one that refuses the connection gives way to
// the next at once (a standby controller does not listen), and a full round
// without an answer is tried again after 250 ms, for at most 15 s. Thread
// safety as for Transport.
// With `identity` (this node's), the channel uses mutual TLS: it presents
// the node's certificate and accepts only the job CA's certificate named
// tls::kControllerName.
std::unique_ptr<Transport> NewGrpcTransport(const AgentOptions& options,
                                            std::optional<tls::Identity> identity = std::nullopt);

}  // namespace endure::agent
