// The agent's real Transport: a gRPC channel to the controller and its
// Attach stream. The channel, and so its credentials, are made in one place,
// MakeControllerChannel (grpc_transport.cc).
#pragma once

#include <memory>
#include <optional>

#include "agent/agent.h"
#include "agent/transport.h"
#include "common/tls.h"

namespace endure::agent {

// A transport to `options.controller`. Attach() waits at most 15 s for the
// controller to answer, each time on a new channel. Thread safety as for
// Transport.
// With `identity` (this node's), the channel uses mutual TLS: it presents
// the node's certificate and accepts only the job CA's certificate named
// tls::kControllerName.
std::unique_ptr<Transport> NewGrpcTransport(const AgentOptions& options,
                                            std::optional<tls::Identity> identity = std::nullopt);

}  // namespace endure::agent
