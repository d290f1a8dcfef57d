// Controller leadership through an etcd lease, for a job with standby
// controllers (`endure controller --etcd`). Each controller holds a lease of
// its own and, while it stands by, tries every `campaign_every` to create the
// job's leader key bound to that lease; whoever creates it leads and keeps
// the lease alive. A controller that dies stops renewing, etcd expires the
// lease and deletes the key, and a standby's next campaign wins.
//
// Fencing: a leader that could not renew its lease stops acting before etcd
// could have expired it (by its own clock, counted from when it sent the
// last renewal that etcd answered), so that two controllers never lead at
// once. A leader that ends the job resigns: it records the job's exit code
// in the job's finished key and deletes the leader key in one transaction,
// and the standbys that see it exit with that code instead of taking over.
//
// LeaderElection is the decision part, without I/O or clock reads: it says
// what to do at `now` and learns the answers. Candidate carries it out
// against etcd (EtcdClient) on real time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/duration.h"
#include "common/mutex.h"
#include "common/status.h"
#include "controller/etcd_client.h"

namespace endure::controller {

struct LeaderElectionOptions {
  // The lease's time to live: how long a dead leader keeps the leadership.
  // Whole seconds in [2s, 1h] (etcd grants nothing shorter than about 2 s).
  Duration lease_ttl = std::chrono::seconds(5);
  // How often a standby tries for the leader key.
  Duration campaign_every = std::chrono::milliseconds(250);
  // How long one request to etcd may take (a leader's renewal is cut
  // shorter still, to end before it must fence).
  Duration request_timeout = std::chrono::seconds(2);

  // Names the first invalid field and its accepted range.
  Status Validate() const;
  // A renewal is due this long after the previous one was sent.
  Duration renew_every() const { return lease_ttl / 3; }
  // A leader fences this long before its lease could expire.
  Duration fence_margin() const {
    return std::min<Duration>(std::chrono::seconds(1), lease_ttl / 4);
  }
};

// What the caller does next (LeaderElection::Next).
struct ElectionStep {
  enum class Do {
    kWait,        // nothing until `at`
    kGrantLease,  // GrantLease(lease_ttl), by `deadline`
    kKeepAlive,   // KeepAlive(lease()), by `deadline`
    kCampaign,    // Campaign(..., lease(), ..., since_revision()), by `deadline`
    kLead,        // this process leads from now on (said once)
    kFence,       // the leadership may be lost: stop acting at once (said once)
    kStandDown,   // the job ended under another leader, with `exit_code` (said once)
  };
  Do what = Do::kWait;
  Clock::TimePoint at;        // kWait
  Clock::TimePoint deadline;  // requests
  std::string reason;         // kLead, kFence, kStandDown: for the log
  int exit_code = 0;          // kStandDown
};

// The decisions of one controller's candidacy. Starts as a standby without
// a lease. Not thread-safe; deterministic.
class LeaderElection {
 public:
  enum class Role { kStandby, kLeader, kFenced, kStoodDown };

  // `options` must be valid (ENDURE_CHECK).
  explicit LeaderElection(LeaderElectionOptions options);

  // What to do at `now`. After kFence or kStandDown, kWait forever.
  ElectionStep Next(Clock::TimePoint now);

  // The answers to the requests Next asked for, each with the instant the
  // request was sent (the lease is counted from then, never from the
  // answer, so that a slow answer cannot lengthen it).
  void OnLeaseGranted(const EtcdLease& lease, Clock::TimePoint sent_at);
  void OnKeepAlive(const EtcdLease& lease, Clock::TimePoint sent_at);
  void OnCampaign(const EtcdCampaign& answer, Clock::TimePoint sent_at);
  // A request failed (etcd out of reach, a timeout): tried again after
  // `campaign_every`; a leader fences once its lease could have expired.
  void OnFailure(const std::string& why, Clock::TimePoint now);

  Role role() const { return role_; }
  int64_t lease() const { return lease_; }
  // The store's revision when this candidate got its first lease: the job's
  // end must be recorded after it to count (an earlier job of the same name
  // left its own).
  int64_t since_revision() const { return since_; }
  // The leader key's value as last seen by a losing campaign ("" none).
  const std::string& leader() const { return leader_; }

 private:
  bool LeaseValidAt(Clock::TimePoint now) const;
  Clock::TimePoint RequestDeadline(Clock::TimePoint now) const;

  const LeaderElectionOptions o_;
  Role role_ = Role::kStandby;
  int64_t lease_ = 0;
  Clock::TimePoint lease_until_{};  // the lease may expire from then on
  Clock::TimePoint next_renew_{};
  Clock::TimePoint next_campaign_{};
  Clock::TimePoint next_grant_{};
  int64_t since_ = -1;
  std::string leader_;
  std::string last_failure_;
  bool announce_lead_ = false;
  std::optional<int> finished_;  // the job's exit code, once seen
  ElectionStep terminal_;        // what Next said last, once fenced or stood down
};

struct CandidateOptions {
  EtcdClientOptions etcd;
  std::string job;      // the keys: /endure/JOB/leader and /endure/JOB/finished
  std::string address;  // the leader key's value: this controller's gRPC address
  LeaderElectionOptions election;

  Status Validate() const;
};

// One controller's candidacy against etcd, on the real clock. Campaign on
// one thread; once it leads, KeepLeading renews the lease on a thread of
// its own until Resign or the destructor. Not thread-safe otherwise.
class Candidate {
 public:
  static Result<std::unique_ptr<Candidate>> Make(CandidateOptions options);
  ~Candidate();  // stops renewing, without resigning: the lease runs out

  struct Outcome {
    bool leads = false;  // else the job ended under another leader ...
    int exit_code = 0;   // ... with this code
    std::string reason;
  };
  // Stands by until this controller leads or the job ends under another
  // leader. `stop` is asked at least every 100 ms; when it returns true,
  // gives up with kUnavailable. Says on stderr when it stands by and why.
  Result<Outcome> Campaign(const std::function<bool()>& stop);

  // Leader only: renews the lease on a thread; `on_lost` runs there, once,
  // when the lease may have expired (the caller must stop acting at once).
  void KeepLeading(std::function<void(const std::string& why)> on_lost);

  // Stops renewing, records `exit_code` as the job's end for the standbys
  // (unless the leader key is no longer this lease's), and revokes the
  // lease. With no exit code (the controller failed), only revokes it, so
  // that a standby takes over at once.
  Status Resign(std::optional<int> exit_code);

  std::string leader_key() const { return "/endure/" + o_.job + "/leader"; }
  std::string finished_key() const { return "/endure/" + o_.job + "/finished"; }

 private:
  Candidate(CandidateOptions options, std::unique_ptr<EtcdClient> etcd);
  // Carries out one step that asks for a request.
  void Carry(const ElectionStep& step);
  void StopRenewing();

  const CandidateOptions o_;
  std::unique_ptr<EtcdClient> etcd_;
  // Used by Campaign's thread, then by the renewing thread only, then (once
  // it is joined) by Resign.
  LeaderElection election_;
  std::thread renewer_;
  Mutex mu_;
  CondVar wake_;
  bool stop_ GUARDED_BY(mu_) = false;
};

}  // namespace endure::controller
