// Transport: the agent's connection to the controller, one stream at a time
// with AgentEvents going up and AgentCommands coming down
// (proto/endure.proto, Controller.Attach). The real one is gRPC
// (agent/grpc_transport.h); tests use FakeTransport (agent/fake_transport.h),
// which hands commands in order, records what was sent, and breaks and
// reopens streams when told.
#pragma once

#include <functional>

#include "common/status.h"
#include "proto/endure.pb.h"

namespace endure::agent {

// A transport can be attached again once its stream has ended and been
// finished: each Attach() opens a new stream (a reconnection after the
// controller went away).
//
// Thread safety: Cancel() may be called from any thread at any time, also
// before Attach() and after Finish(). Send() and CloseWrites() are called by
// the agent's loop thread only (agent/node_loop.h), concurrently with Read(),
// and never while Attach() or Finish() runs: the node core's link makes no
// write between a stream's loss and the next stream, and the agent waits
// for the loop to take in the loss before it finishes the stream. The rest
// is called by the thread that runs the agent, in this order, once per
// stream: Attach, then Read until it returns false (or the agent stops
// reading), CloseWrites (optional, on the loop), Finish.
class Transport {
 public:
  virtual ~Transport() = default;

  // Reaches the controller and opens a new stream. Gives up when `give_up()`
  // turns true (asked at least every 250 ms while it waits) or the
  // transport's own connect deadline passes: kUnavailable, naming the
  // controller, when it could not connect; kUnavailable too once Cancel()
  // was called.
  [[nodiscard]] virtual Status Attach(const std::function<bool()>& give_up) = 0;

  // Sends one event; false when the stream is broken (the event is lost).
  virtual bool Send(const proto::AgentEvent& event) = 0;

  // Blocks until the next command; false at the end of the stream (the
  // controller closed it, it broke, or Cancel() was called).
  virtual bool Read(proto::AgentCommand* command) = 0;

  // Ends the transport for good: a blocked Read() or Send() returns, later
  // ones fail, and later Attach() calls fail. Before Attach(), the stream
  // ends as soon as it opens.
  virtual void Cancel() = 0;

  // The agent sends no more events.
  virtual void CloseWrites() = 0;

  // Waits for the end of the stream and says how it ended: OK when the
  // controller closed it; kInvalidArgument when the controller refused this
  // agent (a wrong job token), with the controller's message; kUnavailable
  // otherwise (broken, cancelled), with the reason.
  [[nodiscard]] virtual Status Finish() = 0;
};

}  // namespace endure::agent
