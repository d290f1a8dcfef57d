// The agent's real Transport: a gRPC channel to the controller and its
// Attach stream. The channel, and so its credentials, are made in one place,
// MakeControllerChannel (grpc_transport.cc).
#pragma once

#include <memory>

#include "agent/agent.h"
#include "agent/transport.h"

namespace endure::agent {

// A transport to `options.controller`. Attach() waits at most 15 s for the
// controller to answer. Thread safety as for Transport.
std::unique_ptr<Transport> NewGrpcTransport(const AgentOptions& options);

}  // namespace endure::agent
