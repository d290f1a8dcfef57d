// FakeTransport: a Transport that a test drives by hand, in place of gRPC.
// The test plays the agents: it opens streams, delivers AgentEvents on them
// and hangs up; the controller's commands down each stream are kept for it
// to read. Every call into the sink happens on the test's thread, within the
// call that causes it, in the order GrpcTransport makes them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "controller/transport.h"

namespace endure::controller {

// Thread-safe (one test thread is the usual caller).
class FakeTransport final : public Transport {
 public:
  // Returns "fake:0".
  Result<std::string> Start(TransportSink* sink) override;
  bool Send(ConnectionId id, const proto::AgentCommand& command) override;
  // Ends the stream and delivers its OnClose (kStreamClosed) before it
  // returns; cut(id) is true from then on.
  void Close(ConnectionId id) override;
  // Ends every open stream (OnClose, kStreamClosed).
  void Shutdown(Duration grace) override;

  // An agent opens a stream (OnOpen). Returns its id; a refused stream has
  // ended (ended_with says how).
  ConnectionId Open(const std::string& peer = "ipv4:127.0.0.1:40000");
  // The agent sends `event`: its hello when it is the stream's first
  // message (OnHello), else OnEvent. Returns true when the controller took
  // it; false when it refused it, which ends the stream (OnClose with the
  // refusal's message), or when the stream had already ended.
  bool Deliver(ConnectionId id, const proto::AgentEvent& event);
  // The agent hangs up (OnClose: kStreamClosed, or "no hello" before its
  // first message). A no-op for a stream that has ended.
  void HangUp(ConnectionId id);

  bool open(ConnectionId id) const;
  // Whether the controller cut the stream (Close).
  bool cut(ConnectionId id) const;
  // The refusal that ended the stream; Accept while it is open, or when it
  // ended otherwise.
  StreamVerdict ended_with(ConnectionId id) const;
  // The commands sent down the stream since the last call, oldest first.
  std::vector<proto::AgentCommand> TakeCommands(ConnectionId id);

 private:
  struct Stream {
    bool open = true;
    bool said_hello = false;
    bool cut = false;
    StreamVerdict end;
    std::vector<proto::AgentCommand> sent;
  };
  // Marks `id` ended; returns whether it was open (its OnClose is then due).
  bool End(ConnectionId id, const StreamVerdict& end, bool cut);

  mutable Mutex mu_;
  TransportSink* sink_ = nullptr;  // set by Start, before any stream opens
  std::map<ConnectionId, Stream> streams_ GUARDED_BY(mu_);
  int64_t next_id_ GUARDED_BY(mu_) = 0;
};

}  // namespace endure::controller
