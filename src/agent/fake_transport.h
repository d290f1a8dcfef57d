// FakeTransport: the controller's end of the agent's stream, in memory, for
// tests. A test pushes commands, which Read() hands to the agent in order,
// and reads back the events the agent sent; Close() ends the stream as a
// controller would, Break() as a broken connection would. After either, the
// agent may attach again, which opens a new stream (FailAttach keeps the
// controller out of reach meanwhile); the events of every stream are kept
// in one list, in the order they came. Every wait is bounded. Thread-safe.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "agent/transport.h"
#include "common/mutex.h"

namespace endure::agent {

class FakeTransport : public Transport {
 public:
  using EventMatch = std::function<bool(const proto::AgentEvent&)>;
  static constexpr std::chrono::milliseconds kWait{10000};

  // --- The test's side.

  // What Attach() returns from now on (OK until set): an error keeps the
  // controller out of reach, OK lets the next attempt open a stream.
  void FailAttach(Status status);
  // A command for the agent; Read() hands them over in order.
  void Push(proto::AgentCommand command);
  // The controller ends the stream: once the commands pushed before are
  // read, Read() returns false, and Finish() returns `end`. Between two
  // streams (and before the first), Close() and Break() are for the next.
  void Close(Status end = Status::Ok());
  // The connection breaks now: Read() returns false (commands not yet read
  // are lost), Send() fails, Finish() returns kUnavailable. Commands pushed
  // afterwards are for the next stream.
  void Break();

  // Every event sent, in order.
  std::vector<proto::AgentEvent> events() const;
  // The events `match` selects, in order.
  std::vector<proto::AgentEvent> EventsWhere(const EventMatch& match) const;
  // Waits until `count` events that `match` selects have been sent, at most
  // `timeout`; returns them (fewer on timeout).
  std::vector<proto::AgentEvent> WaitForEvents(const EventMatch& match, size_t count,
                                               std::chrono::milliseconds timeout = kWait) const;
  // Waits until `done` holds of the events sent so far, at most `timeout`;
  // returns them.
  std::vector<proto::AgentEvent> WaitUntil(
      const std::function<bool(const std::vector<proto::AgentEvent>&)>& done,
      std::chrono::milliseconds timeout = kWait) const;
  // The first event `match` selects, waiting for it at most `timeout`.
  std::optional<proto::AgentEvent> WaitForEvent(const EventMatch& match,
                                                std::chrono::milliseconds timeout = kWait) const;
  // Waits until the agent has read every command pushed and waits in Read()
  // for the next, i.e. has carried them all out, or the stream has ended;
  // false on timeout.
  bool WaitUntilIdle(std::chrono::milliseconds timeout = kWait) const;

  // Streams opened (successful Attach calls), and Attach calls in all.
  int attaches() const;
  int attach_attempts() const;
  // Waits until `count` streams have been opened, at most `timeout`; false
  // on timeout.
  bool WaitForAttaches(int count, std::chrono::milliseconds timeout = kWait) const;

  bool cancelled() const;
  bool writes_closed() const;
  bool finished() const;

  // --- Transport, the agent's side.
  Status Attach(const std::function<bool()>& give_up) override;
  bool Send(const proto::AgentEvent& event) override;
  bool Read(proto::AgentCommand* command) override;
  void Cancel() override;
  void CloseWrites() override;
  Status Finish() override;

 private:
  bool EndedLocked() const { return closed_ || broken_ || cancelled_; }

  mutable Mutex mu_;
  mutable CondVar cv_;
  Status attach_ GUARDED_BY(mu_) = Status::Ok();
  std::deque<proto::AgentCommand> queue_ GUARDED_BY(mu_);
  std::vector<proto::AgentEvent> events_ GUARDED_BY(mu_);
  bool reading_ GUARDED_BY(mu_) = false;  // Read() waits with nothing to hand
  bool closed_ GUARDED_BY(mu_) = false;   // the current stream
  Status close_status_ GUARDED_BY(mu_) = Status::Ok();
  bool broken_ GUARDED_BY(mu_) = false;         // the current stream
  bool cancelled_ GUARDED_BY(mu_) = false;      // for good
  bool writes_closed_ GUARDED_BY(mu_) = false;  // of the current stream
  bool finished_ GUARDED_BY(mu_) = false;       // the current stream
  bool open_ GUARDED_BY(mu_) = false;           // attached and not yet finished
  bool reopen_ GUARDED_BY(mu_) = false;         // the next Attach starts a stream afresh
  int attaches_ GUARDED_BY(mu_) = 0;
  int attach_attempts_ GUARDED_BY(mu_) = 0;
};

}  // namespace endure::agent
