// The election's decisions (LeaderElection) and their shell against etcd
// (Candidate).
#include "controller/leader_election.h"

#include <charconv>
#include <cstdio>

#include "common/names.h"

namespace endure::controller {
namespace {

using TimePoint = Clock::TimePoint;

constexpr Duration kMinLeaseTtl = std::chrono::seconds(2);
constexpr Duration kMaxLeaseTtl = std::chrono::hours(1);
// How often Campaign asks whether to stop, at the longest.
constexpr auto kStopPoll = std::chrono::milliseconds(100);

TimePoint At(TimePoint t, Duration d) {
  return t + std::chrono::duration_cast<TimePoint::duration>(d);
}

}  // namespace

Status LeaderElectionOptions::Validate() const {
  if (lease_ttl < kMinLeaseTtl || lease_ttl > kMaxLeaseTtl ||
      lease_ttl % std::chrono::seconds(1) != Duration::zero()) {
    return InvalidArgument("lease: must be whole seconds in [2s, 1h], got " +
                           FormatDuration(lease_ttl));
  }
  if (campaign_every <= Duration::zero() || campaign_every >= lease_ttl) {
    return InvalidArgument("campaign interval: must be positive and shorter than the lease (" +
                           FormatDuration(lease_ttl) + "), got " + FormatDuration(campaign_every));
  }
  if (request_timeout <= Duration::zero()) {
    return InvalidArgument("etcd request timeout: must be positive, got " +
                           FormatDuration(request_timeout));
  }
  return Status::Ok();
}

LeaderElection::LeaderElection(LeaderElectionOptions options) : o_(options) {
  ENDURE_CHECK(o_.Validate().ok());
}

bool LeaderElection::LeaseValidAt(TimePoint now) const {
  return lease_ != 0 && now < At(lease_until_, -o_.fence_margin());
}

TimePoint LeaderElection::RequestDeadline(TimePoint now) const {
  const TimePoint deadline = At(now, o_.request_timeout);
  // A leader's request must end while it may still act on its answer.
  if (role_ == Role::kLeader) return std::min(deadline, At(lease_until_, -o_.fence_margin()));
  return deadline;
}

ElectionStep LeaderElection::Next(TimePoint now) {
  if (role_ == Role::kFenced || role_ == Role::kStoodDown) {
    return {.what = ElectionStep::Do::kWait, .at = TimePoint::max()};
  }
  if (role_ == Role::kLeader) {
    if (!LeaseValidAt(now)) {
      role_ = Role::kFenced;
      return {.what = ElectionStep::Do::kFence,
              .reason = "the leadership lease " + std::to_string(lease_) +
                        " could not be renewed in time (" +
                        (last_failure_.empty() ? std::string("no answer") : last_failure_) +
                        "): another controller may take over"};
    }
    if (announce_lead_) {
      announce_lead_ = false;
      return {.what = ElectionStep::Do::kLead,
              .reason = "won the election with lease " + std::to_string(lease_) + " (TTL " +
                        FormatDuration(o_.lease_ttl) + ")"};
    }
    if (now >= next_renew_) {
      return {.what = ElectionStep::Do::kKeepAlive, .deadline = RequestDeadline(now)};
    }
    return {.what = ElectionStep::Do::kWait,
            .at = std::min(next_renew_, At(lease_until_, -o_.fence_margin()))};
  }
  // A standby.
  if (finished_) {
    role_ = Role::kStoodDown;
    return {.what = ElectionStep::Do::kStandDown,
            .reason =
                "the job ended under another leader (exit code " + std::to_string(*finished_) + ")",
            .exit_code = *finished_};
  }
  if (!LeaseValidAt(now)) {
    // None yet, or it ran out while etcd could not be reached: a new one.
    lease_ = 0;
    if (now >= next_grant_) {
      return {.what = ElectionStep::Do::kGrantLease, .deadline = RequestDeadline(now)};
    }
    return {.what = ElectionStep::Do::kWait, .at = next_grant_};
  }
  if (now >= next_renew_) {
    return {.what = ElectionStep::Do::kKeepAlive, .deadline = RequestDeadline(now)};
  }
  if (now >= next_campaign_) {
    return {.what = ElectionStep::Do::kCampaign, .deadline = RequestDeadline(now)};
  }
  return {.what = ElectionStep::Do::kWait,
          .at = std::min({next_renew_, next_campaign_, At(lease_until_, -o_.fence_margin())})};
}

void LeaderElection::OnLeaseGranted(const EtcdLease& lease, TimePoint sent_at) {
  if (lease.id == 0 || lease.ttl <= Duration::zero()) {
    OnFailure("etcd granted no lease", sent_at);
    return;
  }
  lease_ = lease.id;
  lease_until_ = At(sent_at, lease.ttl);
  next_renew_ = At(sent_at, o_.renew_every());
  next_campaign_ = sent_at;  // at once
  if (since_ < 0) since_ = lease.revision;
  last_failure_.clear();
}

void LeaderElection::OnKeepAlive(const EtcdLease& lease, TimePoint sent_at) {
  if (lease.ttl <= Duration::zero()) {
    last_failure_ = "etcd no longer has lease " + std::to_string(lease_);
    if (role_ == Role::kLeader) {
      lease_until_ = std::min(lease_until_, sent_at);  // fences at the next step
    } else {
      lease_ = 0;
      next_grant_ = sent_at;
    }
    return;
  }
  lease_until_ = At(sent_at, lease.ttl);
  next_renew_ = At(sent_at, o_.renew_every());
  last_failure_.clear();
}

void LeaderElection::OnCampaign(const EtcdCampaign& answer, TimePoint sent_at) {
  last_failure_.clear();
  // An earlier campaign may have won without its answer arriving: the key
  // bound to our own lease is ours.
  if (answer.won || (lease_ != 0 && answer.leader_lease == lease_)) {
    role_ = Role::kLeader;
    announce_lead_ = true;
    leader_.clear();
    return;
  }
  leader_ = answer.leader;
  if (!answer.finished.empty() && answer.finished_revision > since_) {
    int code = 1;
    const char* end = answer.finished.data() + answer.finished.size();
    const auto [parsed, ec] = std::from_chars(answer.finished.data(), end, code);
    if (ec != std::errc() || parsed != end || code < 0 || code > 255) code = 1;
    finished_ = code;
    return;
  }
  next_campaign_ = At(sent_at, o_.campaign_every);
}

void LeaderElection::OnFailure(const std::string& why, TimePoint now) {
  last_failure_ = why;
  const TimePoint retry = At(now, o_.campaign_every);
  next_grant_ = retry;
  next_campaign_ = retry;
  // A renewal is tried again soon; a leader fences when its lease could
  // have expired (Next), whatever the failures in between.
  next_renew_ = retry;
}

Status CandidateOptions::Validate() const {
  ENDURE_RETURN_IF_ERROR(etcd.Validate());
  ENDURE_RETURN_IF_ERROR(election.Validate());
  // job_spec.cc checked it; it names etcd keys.
  if (job.empty() || job.find('/') != std::string::npos) {
    return InvalidArgument("job name '" + QuoteForLog(job) + "' cannot name etcd keys");
  }
  if (address.empty()) return InvalidArgument("the controller's address is empty");
  return Status::Ok();
}

Result<std::unique_ptr<Candidate>> Candidate::Make(CandidateOptions options) {
  ENDURE_RETURN_IF_ERROR(options.Validate());
  EtcdClientOptions etcd = options.etcd;
  etcd.timeout = options.election.request_timeout;
  ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Make(std::move(etcd)));
  return std::unique_ptr<Candidate>(new Candidate(std::move(options), std::move(client)));
}

Candidate::Candidate(CandidateOptions options, std::unique_ptr<EtcdClient> etcd)
    : o_(std::move(options)), etcd_(std::move(etcd)), election_(o_.election) {}

Candidate::~Candidate() { StopRenewing(); }

void Candidate::Carry(const ElectionStep& step) {
  const TimePoint sent = Clock::Real()->Now();
  Status failed = Status::Ok();
  switch (step.what) {
    case ElectionStep::Do::kGrantLease: {
      Result<EtcdLease> lease = etcd_->GrantLease(o_.election.lease_ttl, step.deadline);
      if (lease.ok()) {
        election_.OnLeaseGranted(*lease, sent);
      } else {
        failed = lease.status();
      }
      break;
    }
    case ElectionStep::Do::kKeepAlive: {
      Result<EtcdLease> lease = etcd_->KeepAlive(election_.lease(), step.deadline);
      if (lease.ok()) {
        election_.OnKeepAlive(*lease, sent);
      } else {
        failed = lease.status();
      }
      break;
    }
    case ElectionStep::Do::kCampaign: {
      Result<EtcdCampaign> answer =
          etcd_->Campaign(leader_key(), o_.address, election_.lease(), finished_key(),
                          election_.since_revision(), step.deadline);
      if (answer.ok()) {
        election_.OnCampaign(*answer, sent);
      } else {
        failed = answer.status();
      }
      break;
    }
    default:
      return;
  }
  if (!failed.ok()) election_.OnFailure(failed.message(), Clock::Real()->Now());
}

Result<Candidate::Outcome> Candidate::Campaign(const std::function<bool()>& stop) {
  std::string said_leader = "?";
  while (true) {
    if (stop()) return Unavailable("stopped while standing by");
    const TimePoint now = Clock::Real()->Now();
    const ElectionStep step = election_.Next(now);
    switch (step.what) {
      case ElectionStep::Do::kLead:
        return Outcome{.leads = true, .reason = step.reason};
      case ElectionStep::Do::kStandDown:
        return Outcome{.leads = false, .exit_code = step.exit_code, .reason = step.reason};
      case ElectionStep::Do::kFence:
        return Unavailable("lost the leadership at once: " + step.reason);
      case ElectionStep::Do::kWait:
        std::this_thread::sleep_until(std::min(step.at, now + kStopPoll));
        break;
      default:
        Carry(step);
    }
    if (election_.role() == LeaderElection::Role::kStandby && !election_.leader().empty() &&
        election_.leader() != said_leader) {
      said_leader = election_.leader();
      std::fprintf(stderr,
                   "endure controller: standing by for job '%s' (the leader is %s); taking over "
                   "within the lease (%s) of its end\n",
                   o_.job.c_str(), said_leader.c_str(),
                   FormatDuration(o_.election.lease_ttl).c_str());
    }
  }
}

void Candidate::KeepLeading(std::function<void(const std::string& why)> on_lost) {
  ENDURE_CHECK(election_.role() == LeaderElection::Role::kLeader && !renewer_.joinable());
  renewer_ = std::thread([this, on_lost = std::move(on_lost)] {
    while (true) {
      const ElectionStep step = election_.Next(Clock::Real()->Now());
      if (step.what == ElectionStep::Do::kFence) {
        on_lost(step.reason);
        return;
      }
      if (step.what == ElectionStep::Do::kWait) {
        MutexLock lock(&mu_);
        if (wake_.WaitUntil(lock, step.at, [this]() REQUIRES(mu_) { return stop_; })) return;
        continue;
      }
      {
        MutexLock lock(&mu_);
        if (stop_) return;
      }
      Carry(step);
    }
  });
}

void Candidate::StopRenewing() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.NotifyAll();
  if (renewer_.joinable()) renewer_.join();
}

Status Candidate::Resign(std::optional<int> exit_code) {
  StopRenewing();
  if (election_.role() != LeaderElection::Role::kLeader) return Status::Ok();
  const TimePoint deadline = Clock::Real()->Now() + std::chrono::duration_cast<TimePoint::duration>(
                                                        o_.election.request_timeout);
  Status result = Status::Ok();
  if (exit_code) {
    Result<bool> held = etcd_->Resign(leader_key(), election_.lease(), finished_key(),
                                      std::to_string(*exit_code), deadline);
    if (!held.ok()) {
      result = held.status();
    } else if (!*held) {
      result = Unavailable("the leader key was no longer this controller's: the job's end (" +
                           std::to_string(*exit_code) + ") was not recorded for the standbys");
    }
  }
  if (Status st = etcd_->RevokeLease(election_.lease(), deadline); !st.ok() && result.ok()) {
    result = st;
  }
  return result;
}

}  // namespace endure::controller
