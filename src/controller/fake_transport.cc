// A transport played by the test: streams, messages and hang-ups on demand.
#include "controller/fake_transport.h"

#include <vector>

namespace endure::controller {

Result<std::string> FakeTransport::Start(TransportSink* sink) {
  sink_ = sink;
  return std::string("fake:0");
}

bool FakeTransport::Send(ConnectionId id, const proto::AgentCommand& command) {
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it == streams_.end() || !it->second.open) return false;
  it->second.sent.push_back(command);
  return true;
}

bool FakeTransport::End(ConnectionId id, const StreamVerdict& end, bool cut) {
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it == streams_.end() || !it->second.open) return false;
  it->second.open = false;
  it->second.end = end;
  it->second.cut = cut;
  return true;
}

void FakeTransport::Close(ConnectionId id) {
  if (End(id, StreamVerdict::Accept(), /*cut=*/true)) sink_->OnClose(id, kStreamClosed);
}

void FakeTransport::Shutdown(Duration) {
  std::vector<ConnectionId> open;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, s] : streams_) {
      if (s.open) open.push_back(id);
    }
  }
  for (ConnectionId id : open) Close(id);
}

ConnectionId FakeTransport::Open(const std::string& peer) {
  ConnectionId id;
  {
    MutexLock lock(&mu_);
    id = ConnectionId{next_id_++};
    streams_[id] = Stream{};
  }
  const StreamVerdict v = sink_->OnOpen(id, PeerInfo{peer});
  if (!v.accepted()) End(id, v, /*cut=*/false);
  return id;
}

bool FakeTransport::Deliver(ConnectionId id, const proto::AgentEvent& event) {
  bool hello;
  {
    MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end() || !it->second.open) return false;
    hello = !it->second.said_hello;
    it->second.said_hello = true;
  }
  const StreamVerdict v = hello ? sink_->OnHello(id, event) : sink_->OnEvent(id, event);
  if (v.accepted()) return true;
  if (End(id, v, /*cut=*/false)) sink_->OnClose(id, v.message);
  return false;
}

void FakeTransport::HangUp(ConnectionId id) {
  bool said_hello;
  {
    MutexLock lock(&mu_);
    auto it = streams_.find(id);
    if (it == streams_.end()) return;
    said_hello = it->second.said_hello;
  }
  if (End(id, StreamVerdict::Accept(), /*cut=*/false)) {
    sink_->OnClose(id, said_hello ? kStreamClosed : "no hello");
  }
}

bool FakeTransport::open(ConnectionId id) const {
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  return it != streams_.end() && it->second.open;
}

bool FakeTransport::cut(ConnectionId id) const {
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  return it != streams_.end() && it->second.cut;
}

StreamVerdict FakeTransport::ended_with(ConnectionId id) const {
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  return it == streams_.end() ? StreamVerdict::Accept() : it->second.end;
}

std::vector<proto::AgentCommand> FakeTransport::TakeCommands(ConnectionId id) {
  MutexLock lock(&mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return {};
  return std::exchange(it->second.sent, {});
}

}  // namespace endure::controller
