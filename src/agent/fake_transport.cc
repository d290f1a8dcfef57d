// The in-memory controller stream of agent/fake_transport.h.
#include "agent/fake_transport.h"

namespace endure::agent {

void FakeTransport::FailAttach(Status status) {
  MutexLock lock(&mu_);
  attach_ = std::move(status);
}

void FakeTransport::Push(proto::AgentCommand command) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(command));
  }
  cv_.NotifyAll();
}

void FakeTransport::Close(Status end) {
  {
    MutexLock lock(&mu_);
    closed_ = true;
    close_status_ = std::move(end);
    reopen_ = false;  // for the stream open now, or else the next one
  }
  cv_.NotifyAll();
}

void FakeTransport::Break() {
  {
    MutexLock lock(&mu_);
    broken_ = true;
    queue_.clear();
    reopen_ = false;  // for the stream open now, or else the next one
  }
  cv_.NotifyAll();
}

std::vector<proto::AgentEvent> FakeTransport::events() const {
  MutexLock lock(&mu_);
  return events_;
}

std::vector<proto::AgentEvent> FakeTransport::EventsWhere(const EventMatch& match) const {
  MutexLock lock(&mu_);
  std::vector<proto::AgentEvent> out;
  for (const proto::AgentEvent& e : events_) {
    if (match(e)) out.push_back(e);
  }
  return out;
}

std::vector<proto::AgentEvent> FakeTransport::WaitForEvents(
    const EventMatch& match, size_t count, std::chrono::milliseconds timeout) const {
  std::vector<proto::AgentEvent> out;
  MutexLock lock(&mu_);
  cv_.WaitFor(lock, timeout, [&]() REQUIRES(mu_) {
    out.clear();
    for (const proto::AgentEvent& e : events_) {
      if (match(e)) out.push_back(e);
    }
    return out.size() >= count;
  });
  return out;
}

std::vector<proto::AgentEvent> FakeTransport::WaitUntil(
    const std::function<bool(const std::vector<proto::AgentEvent>&)>& done,
    std::chrono::milliseconds timeout) const {
  MutexLock lock(&mu_);
  cv_.WaitFor(lock, timeout, [&]() REQUIRES(mu_) { return done(events_); });
  return events_;
}

std::optional<proto::AgentEvent> FakeTransport::WaitForEvent(
    const EventMatch& match, std::chrono::milliseconds timeout) const {
  std::vector<proto::AgentEvent> found = WaitForEvents(match, 1, timeout);
  if (found.empty()) return std::nullopt;
  return found.front();
}

bool FakeTransport::WaitUntilIdle(std::chrono::milliseconds timeout) const {
  MutexLock lock(&mu_);
  return cv_.WaitFor(lock, timeout,
                     [&]() REQUIRES(mu_) { return (queue_.empty() && reading_) || EndedLocked(); });
}

int FakeTransport::attaches() const {
  MutexLock lock(&mu_);
  return attaches_;
}

int FakeTransport::attach_attempts() const {
  MutexLock lock(&mu_);
  return attach_attempts_;
}

bool FakeTransport::WaitForAttaches(int count, std::chrono::milliseconds timeout) const {
  MutexLock lock(&mu_);
  return cv_.WaitFor(lock, timeout, [&]() REQUIRES(mu_) { return attaches_ >= count; });
}

bool FakeTransport::cancelled() const {
  MutexLock lock(&mu_);
  return cancelled_;
}

bool FakeTransport::writes_closed() const {
  MutexLock lock(&mu_);
  return writes_closed_;
}

bool FakeTransport::finished() const {
  MutexLock lock(&mu_);
  return finished_;
}

Status FakeTransport::Attach(const std::function<bool()>& give_up) {
  (void)give_up;
  {
    MutexLock lock(&mu_);
    ++attach_attempts_;
    ENDURE_CHECK(!open_);  // the agent finishes a stream before it opens the next
    if (cancelled_) return Unavailable("cancelled");
    if (!attach_.ok()) return attach_;
    open_ = true;
    ++attaches_;
    if (reopen_) {
      // A new stream: the last one's end is behind it.
      reopen_ = false;
      closed_ = broken_ = writes_closed_ = finished_ = false;
      close_status_ = Status::Ok();
    }
  }
  cv_.NotifyAll();
  return Status::Ok();
}

bool FakeTransport::Send(const proto::AgentEvent& event) {
  {
    MutexLock lock(&mu_);
    if (broken_ || cancelled_ || writes_closed_) return false;
    events_.push_back(event);
  }
  cv_.NotifyAll();
  return true;
}

bool FakeTransport::Read(proto::AgentCommand* command) {
  MutexLock lock(&mu_);
  reading_ = true;
  cv_.NotifyAll();
  cv_.Wait(lock,
           [&]() REQUIRES(mu_) { return broken_ || cancelled_ || !queue_.empty() || closed_; });
  reading_ = false;
  if (broken_ || cancelled_ || queue_.empty()) return false;
  *command = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void FakeTransport::Cancel() {
  {
    MutexLock lock(&mu_);
    cancelled_ = true;
  }
  cv_.NotifyAll();
}

void FakeTransport::CloseWrites() {
  MutexLock lock(&mu_);
  writes_closed_ = true;
}

Status FakeTransport::Finish() {
  MutexLock lock(&mu_);
  finished_ = true;
  open_ = false;
  reopen_ = true;
  if (broken_) return Unavailable("connection reset by peer");
  if (closed_) return close_status_;
  if (cancelled_) return Unavailable("cancelled");
  return Status::Ok();  // the agent stopped reading; the controller closes after it
}

}  // namespace endure::agent
