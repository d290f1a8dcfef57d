// JobMachine; see job_machine.h.
#include "core/job_machine.h"

#include <algorithm>
#include <cmath>

#include "common/duration.h"
#include "core/crash_detector.h"
#include "core/failure_decision.h"

namespace endure::core {
namespace {

// Steps remembered for the ledger between two copies (a job that takes no
// checkpoint would otherwise remember every step).
constexpr size_t kMaxStepsWithoutCopy = 4096;

JobAction ToJobAction(BookAction action) {
  return std::visit([](auto&& a) -> JobAction { return std::move(a); }, std::move(action));
}

using faults::FaultKind;

double SecondsBetween(TimePoint a, TimePoint b) { return Seconds(b - a); }

}  // namespace

std::string_view JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kWaitingForNodes:
      return "waiting_for_nodes";
    case JobPhase::kRunning:
      return "running";
    case JobPhase::kStopping:
      return "stopping";
    case JobPhase::kTesting:
      return "testing";
    case JobPhase::kWaiting:
      return "waiting";
    case JobPhase::kDone:
      return "done";
  }
  return "?";
}

Status IsolationOptions::Validate() const {
  ENDURE_RETURN_IF_ERROR(straggler.Validate());
  if (sdc_check_every < 0) return InvalidArgument("sdc_check_every must not be negative");
  ENDURE_RETURN_IF_ERROR(pairwise.Validate());
  ENDURE_RETURN_IF_ERROR(health.Validate());
  for (auto [name, d] : {std::pair{"pairwise_timeout", pairwise_timeout},
                         {"straggler_horizon", straggler_horizon},
                         {"restart_cost", restart_cost},
                         {"replacement_wait", replacement_wait}}) {
    if (d <= Duration(0)) return InvalidArgument(std::string(name) + " must be positive");
  }
  return Status::Ok();
}

Status JobMachineOptions::Validate() const {
  if (nodes < 1) return InvalidArgument("nodes must be at least 1");
  if (ranks_per_node < 1) return InvalidArgument("ranks_per_node must be at least 1");
  if (min_nodes < 0 || min_nodes > nodes) {
    return InvalidArgument("min_nodes must be in [0, nodes] (0: no shrink)");
  }
  if (first_generation.value < 0) {
    return InvalidArgument("first_generation must not be negative");
  }
  if (replacement_timeout < Duration(0)) {
    return InvalidArgument("replacement_timeout must not be negative");
  }
  ENDURE_RETURN_IF_ERROR(hang.Validate());
  ENDURE_RETURN_IF_ERROR(heartbeat.Validate());
  ENDURE_RETURN_IF_ERROR(loss.Validate());
  ENDURE_RETURN_IF_ERROR(anomaly.Validate());
  ENDURE_RETURN_IF_ERROR(isolation.Validate());
  ENDURE_RETURN_IF_ERROR(checkpoint.Validate());
  return recovery.Validate();
}

JobMachine::JobMachine(TimePoint start)
    : start_(start),
      ledger_(start),
      hang_(options_.hang),
      heartbeats_(options_.heartbeat),
      loss_(options_.loss),
      anomaly_(options_.anomaly),
      recovery_(options_.recovery),
      stragglers_(options_.isolation.straggler) {}

JobMachine::JobMachine(JobMachineOptions options, std::vector<ExternalFault> external_faults,
                       TimePoint start)
    : JobMachine(start) {
  const std::vector<JobAction> none =
      Step(Configure{std::move(options), std::move(external_faults)}, start);
  ENDURE_CHECK(none.empty());
}

void JobMachine::OnConfigure(const Configure& c) {
  ENDURE_CHECK(c.options.Validate().ok());
  configured_ = true;
  options_ = c.options;
  external_ = c.faults;
  hang_ = HangDetector(options_.hang);
  heartbeats_ = HeartbeatMonitor(options_.heartbeat);
  loss_ = LossAnomalyDetector(options_.loss);
  anomaly_ = AnomalyPolicy(options_.anomaly);
  recovery_ = RecoveryPolicy(options_.recovery);
  stragglers_ = StragglerDetector(options_.isolation.straggler);
  CheckpointBookOptions book = options_.checkpoint;
  book.ranks_per_node = options_.ranks_per_node;
  book.max_shards = options_.nodes * options_.ranks_per_node;
  book_ = CheckpointBook(book);
  generation_ = Generation{options_.first_generation.value - 1};
}

std::string JobMachine::NodeName(NodeId node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? "node?" : it->second.name;
}

NodeId JobMachine::NodeOfRank(Rank rank) const {
  const size_t i = static_cast<size_t>(rank.value / options_.ranks_per_node);
  return rank.valid() && i < members_.size() ? members_[i] : NodeId{};
}

std::vector<NodeId> JobMachine::NodesUp() const {
  std::vector<NodeId> out;
  for (const auto& [id, node] : nodes_) {
    if (node.up) out.push_back(id);
  }
  return out;
}

std::map<std::string, std::string> JobMachine::RefusedNodes() const {
  std::map<std::string, std::string> out;
  for (const auto& [id, node] : nodes_) {
    if (!node.refused.empty()) out[node.name] = node.refused;
  }
  return out;
}

std::vector<std::pair<NodeId, std::string>> JobMachine::Nodes() const {
  std::vector<std::pair<NodeId, std::string>> out;
  for (const auto& [id, node] : nodes_) out.emplace_back(id, node.name);
  return out;
}

std::vector<JobMachine::NodeView> JobMachine::NodeViews() const {
  std::map<NodeId, Rank> first;
  for (size_t i = 0; i < members_.size(); ++i) {
    first[members_[i]] = Rank{static_cast<int32_t>(i) * options_.ranks_per_node};
  }
  std::vector<NodeView> out;
  out.reserve(nodes_.size());
  for (const auto& [id, node] : nodes_) {
    NodeView v{id, node.name, node.up, std::nullopt, node.refused};
    if (auto it = first.find(id); it != first.end()) v.first = it->second;
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<NodeId> JobMachine::HealthyNodes() const {
  // Previous members first, in their order, so that ranks stay where they were.
  std::vector<NodeId> out;
  std::set<NodeId> taken;
  auto healthy = [&](const Node& node) {
    return node.up && node.refused.empty() && node.slots >= options_.ranks_per_node;
  };
  for (NodeId n : members_) {
    auto it = nodes_.find(n);
    if (it != nodes_.end() && healthy(it->second) && taken.insert(n).second) out.push_back(n);
  }
  for (const auto& [id, node] : nodes_) {
    if (healthy(node) && !taken.count(id)) out.push_back(id);
  }
  return out;
}

Incident* JobMachine::OpenIncident() { return incident_open_ ? &incidents_.back() : nullptr; }

std::optional<TimePoint> JobMachine::NextDeadline() const {
  std::optional<TimePoint> next;
  auto consider = [&](std::optional<TimePoint> t) {
    if (t && (!next || *t < *next)) next = t;
  };
  if (phase_ == JobPhase::kRunning && !hang_held_) consider(hang_.NextDeadline());
  if (phase_ != JobPhase::kDone) consider(heartbeats_.NextDeadline());
  if (phase_ == JobPhase::kWaiting && wait_until_) consider(wait_until_);
  if (phase_ == JobPhase::kWaiting) consider(replacement_deadline_);
  if (phase_ == JobPhase::kTesting) consider(pairwise_deadline_);
  if (phase_ != JobPhase::kDone) {
    for (const ExternalFault& f : external_) {
      if (f.at && !fired_.count(f.id)) consider(start_ + *f.at);
    }
  }
  return next;
}

// Every input passes here. Those whose effect does not depend on the phase
// are handled by StepAnyPhase; the rest go to the handler of the phase the
// machine is in (after StepAnyPhase, which may have changed it: a tick that
// finds a node lost fails the generation, then the new phase's timers run).
std::vector<JobAction> JobMachine::Step(const JobEvent& event, TimePoint now) {
  if (const auto* steps = std::get_if<NodeStepsEnd>(&event)) {
    // The node's heartbeat (its agent sends none within a beat of a
    // report), then its ranks' reports one after another: one may change
    // the phase (a loss anomaly stops the generation), and the next is
    // judged in the new one, as when they came apart.
    std::vector<JobAction> out = Step(NodeHeartbeat{steps->node}, now);
    for (StepEnd e : steps->steps) {
      e.generation = steps->generation;
      for (JobAction& a : Step(e, now)) out.push_back(std::move(a));
    }
    return out;
  }
  std::vector<JobAction> out;
  if (phase_ == JobPhase::kDone) return out;
  if (const auto* c = std::get_if<Configure>(&event)) {
    if (!configured_) OnConfigure(*c);
    return out;
  }
  if (!configured_) return out;
  ledger_.Advance(now);
  if (StepAnyPhase(event, now, out)) return out;
  switch (phase_) {
    case JobPhase::kWaitingForNodes:
      StepWaitingForNodes(event, now, out);
      break;
    case JobPhase::kRunning:
      StepRunning(event, now, out);
      break;
    case JobPhase::kStopping:
      StepStopping(event, now, out);
      break;
    case JobPhase::kTesting:
      StepTesting(event, now, out);
      break;
    case JobPhase::kWaiting:
      StepWaiting(event, now, out);
      break;
    case JobPhase::kDone:
      break;
  }
  return out;
}

bool JobMachine::StepAnyPhase(const JobEvent& event, TimePoint now, std::vector<JobAction>& out) {
  if (const auto* e = std::get_if<NodeUp>(&event)) {
    nodes_[e->node] = Node{e->name, e->slots, true, e->refused};
    heartbeats_.Register(e->node, now);
    return false;

  } else if (const auto* e = std::get_if<NodeQuarantined>(&event)) {
    // No later generation uses it; the running one (if it is a member)
    // goes on until its next stop.
    auto it = nodes_.find(e->node);
    if (it != nodes_.end())
      it->second.refused =
          "quarantined: " + e->reason;  // the waiting phases start a generation if it completes one

  } else if (const auto* e = std::get_if<NodeHeartbeat>(&event)) {
    // A heartbeat from a node already declared lost changes nothing: its
    // loss was acted on when declared, and its stream is fenced by the shell.
    heartbeats_.OnHeartbeat(e->node, now);
    // Every member is heard again: what they did meanwhile arrives on
    // their streams in order, before the next tick judges progress.
    if (hang_held_ && !AnyMemberQuiet(now)) hang_held_ = false;

  } else if (const auto* e = std::get_if<NodeDown>(&event)) {
    heartbeats_.Remove(e->node);
    book_.OnNodeGone(NodeName(e->node));  // and its memory tiers with it
    OnNodeLost(e->node, e->reason, std::min(now, e->since.value_or(now)), now, out);

  } else if (const auto* e = std::get_if<FaultFiredEvent>(&event)) {
    fired_.insert(e->id);
    fired_events_.push_back({e->generation, *e});

  } else if (const auto* e = std::get_if<PersistFailedEvent>(&event)) {
    book_.OnPersistFailed();
    if (e->generation == generation_ && !persist_failure_reported_ && !incident_open_) {
      persist_failure_reported_ = true;
      Incident inc;
      inc.id = static_cast<int>(incidents_.size()) + 1;
      inc.generation = generation_;
      inc.cause = FixedCause(Cause::kPersistenceFailing);
      inc.rank = Rank{e->shard};
      inc.node = e->node;
      inc.node_name = NodeName(e->node);
      inc.fault_at = inc.detected_at = now;
      inc.failed_at_step = job_step_;
      inc.action = "continue";
      inc.reason = "writing step " + std::to_string(e->step.value) + " shard " +
                   std::to_string(e->shard) + " to durable storage failed (" + e->error +
                   "); training goes on, restorable from the memory tiers (T0/T1) only";
      incidents_.push_back(std::move(inc));
    }

  } else if (const auto* e = std::get_if<DurableListed>(&event)) {
    book_.OnListed(*e);

  } else if (const auto* e = std::get_if<ShardPersisted>(&event)) {
    for (BookAction& a : book_.OnShardPersisted(*e)) out.push_back(ToJobAction(std::move(a)));

  } else if (const auto* e = std::get_if<ManifestWritten>(&event)) {
    bool committed = false;
    for (BookAction& a : book_.OnManifestWritten(*e, &committed)) {
      out.push_back(ToJobAction(std::move(a)));
    }

  } else if (const auto* e = std::get_if<StepRemoved>(&event)) {
    book_.OnStepRemoved(*e);

  } else if (const auto* e = std::get_if<InventoryReported>(&event)) {
    book_.OnInventory(*e, NodeName(e->node));

  } else if (const auto* e = std::get_if<ShardRefused>(&event)) {
    book_.OnShardRefused(*e);

  } else if (const auto* e = std::get_if<RestoreChosen>(&event)) {
    std::string text = e->text;
    if (e->restored_step.value >= 0) {
      book_.OnRestored(e->generation, e->restored_step,
                       {{"T0", e->from_t0}, {"T1", e->from_t1}, {"T2", e->from_t2}});
      for (const std::string& note : rollback_notes_) text += "; " + note;
      rollback_notes_.clear();
    }
    for (auto it = incidents_.rbegin(); it != incidents_.rend(); ++it) {
      if (it->generation.Next() == e->generation && it->relaunched_at) {
        it->restore = text;
        break;
      }
    }

  } else if (std::holds_alternative<ControllerResumed>(event)) {
    heartbeats_.Resume(now);
    if (phase_ == JobPhase::kRunning) hang_.Resume(now);

  } else if (const auto* e = std::get_if<StackDumpEvent>(&event)) {
    if (e->generation == generation_) stacks_.push_back({e->rank, e->text});
    for (Incident& inc : incidents_) {
      if (inc.generation == e->generation && inc.cause.kind == Cause::kHang) {
        inc.stacks.push_back("rank " + std::to_string(e->rank.value) + ":\n" + e->text);
      }
    }

  } else if (std::holds_alternative<Tick>(event)) {
    FireDueFaults(now, out);
    // A frozen or partitioned agent: handled like a dead one (the recovery
    // policy's path for node_lost evicts it), which failed when it was last
    // heard from.
    for (const CrashReport& lost : heartbeats_.Check(now)) {
      OnNodeLost(lost.node, lost.reason, lost.last_seen.value_or(now), now, out);
    }
    return false;  // then the timers of the phase the machine is now in

  } else {
    return false;  // a message of a generation: the phase decides
  }
  return true;
}

void JobMachine::StepWaitingForNodes(const JobEvent& event, TimePoint now,
                                     std::vector<JobAction>& out) {
  // Nothing runs yet: only a registration can complete the first generation.
  if (std::holds_alternative<NodeUp>(event)) MaybeStart(now, out);
}

void JobMachine::StepRunning(const JobEvent& event, TimePoint now, std::vector<JobAction>& out) {
  // Messages of another generation, or of a rank outside this one's world,
  // are dropped.
  auto ours = [&](Generation generation, Rank rank) {
    return generation == generation_ && rank.valid() && rank.value < world_size();
  };
  if (const auto* e = std::get_if<WorkerReady>(&event)) {
    if (ours(e->generation, e->rank)) OnWorkerReady(*e, now);
  } else if (const auto* e = std::get_if<StepEnd>(&event)) {
    if (ours(e->generation, e->rank)) OnStepEnd(*e, now, out);
  } else if (const auto* e = std::get_if<WorkerExitEvent>(&event)) {
    if (ours(e->generation, e->rank)) OnWorkerExit(*e, now, out);
  } else if (const auto* e = std::get_if<PhaseChanged>(&event)) {
    if (ours(e->generation, e->rank)) {
      const Status recorded = hang_.OnPhase(e->rank.value, e->phase, now);
      ENDURE_CHECK(recorded.ok());  // a rank of the world the detector was started with
    }
  } else if (const auto* e = std::get_if<FingerprintReported>(&event)) {
    if (ours(e->generation, e->rank)) {
      if (std::optional<SdcVerdict> v = sdc_.OnFingerprint(e->rank, e->step, e->fingerprint)) {
        OnSdcVerdict(*v, now, out);
      }
    }
  } else if (std::holds_alternative<Tick>(event)) {
    CheckHang(now, out);
  }
}

void JobMachine::StepStopping(const JobEvent& event, TimePoint now, std::vector<JobAction>& out) {
  if (const auto* x = std::get_if<WorkerExitEvent>(&event)) {
    if (x->generation == generation_ && x->rank.valid() && x->rank.value < world_size()) {
      OnExitWhileStopping(*x);
    }
    return;
  }
  const auto* e = std::get_if<GenerationStoppedEvent>(&event);
  if (e == nullptr || e->generation != generation_) return;
  awaiting_stop_.erase(e->node);
  if (awaiting_stop_.empty()) Stopped(now, out);
}

void JobMachine::StepWaiting(const JobEvent& event, TimePoint now, std::vector<JobAction>& out) {
  // A node registered, the backoff ended or the replacement deadline passed.
  if (std::holds_alternative<NodeUp>(event) || std::holds_alternative<Tick>(event)) {
    MaybeStart(now, out);
  }
}

void JobMachine::Stopped(TimePoint now, std::vector<JobAction>& out) {
  if (Incident* inc = OpenIncident()) inc->stopped_at = now;
  if (Localize(now, out)) return;
  phase_ = JobPhase::kWaiting;
  MaybeStart(now, out);
}

void JobMachine::OnWorkerReady(const WorkerReady& e, TimePoint now) {
  if (!rank_ready_[e.rank.value]) ++ranks_ready_;
  rank_ready_[e.rank.value] = true;
  rank_rejoins_[e.rank.value] = e.rejoin;
  rank_from_tiers_[e.rank.value] = e.rejoin && e.rejoin_from_tiers;
  rank_deterministic_[e.rank.value] = e.deterministic;
  max_restore_s_ = std::max(max_restore_s_, e.restore_s);
  start_step_ = e.start_step;
  unannounced_ = unannounced_ || e.start_step_unknown;
  if (ranks_ready_ == world_size()) {
    all_ready_at_ = now;
    if (Incident* inc = OpenIncident()) {
      inc->ready_at = now;
      inc->restore_s = max_restore_s_;
    }
    if (unannounced_) {
      // The first step reported says (OnStepEnd).
      start_step_ = StepNumber{0};
      restore_unknown_ = true;
      return;
    }
    RestoredTo(e.start_step, now);
  }
}

void JobMachine::RestoredTo(StepNumber step, TimePoint now) {
  start_step_ = step;
  if (Incident* inc = OpenIncident()) inc->restored_step = step;
  loss_.RollBackTo(step);
  sdc_.RollBackTo(step);
  if (in_process_from_.value >= 0 && step < in_process_from_) ledger_.RollBack(now);
  in_process_from_ = StepNumber{-1};
  if (rollback_pending_) {
    // The program kept a copy of `step` that the ledger never heard of: the
    // time trained up to it survived (as of the newest step reported at or
    // before it), the rest is recompute.
    Duration at{0};
    if (auto it = rollback_pending_->upper_bound(step); it != rollback_pending_->begin()) {
      at = std::prev(it)->second;
    }
    ledger_.CopyTaken(step, now, at);
    ledger_.RollBack(now);
    rollback_pending_.reset();
  }
  // What the workers restored: copies taken after it were lost with it.
  ledger_.RestoredTo(step, now);
}

void JobMachine::OnStepEnd(const StepEnd& e, TimePoint now, std::vector<JobAction>& out) {
  StepNumber& rank_step = rank_step_[e.rank.value];
  if (restore_unknown_ && e.step.value >= 1) {
    // A program that did not say what it restored: its first step, less
    // one stride of its reports, is the step it resumed from. (A step 0,
    // a progress bar drawn before any step, says nothing.)
    first_reported_ = std::min(first_reported_.value_or(e.step), e.step);
    if (ranks_ready_ == world_size()) {
      restore_unknown_ = false;
      RestoredTo(
          StepNumber{std::max<int64_t>(0, first_reported_->value - step_stride_.value_or(1))}, now);
    }
  }
  if (e.rank == Rank{0} && productive_ && e.step > rank_step) {
    const int64_t advanced = e.step.value - rank_step.value;
    step_stride_ = std::min(step_stride_.value_or(advanced), advanced);
  }
  if (step_productive_.size() >= kMaxStepsWithoutCopy && !step_productive_.contains(e.step)) {
    step_productive_.erase(step_productive_.begin());  // the newest steps are the ones restored
  }
  step_productive_.try_emplace(e.step, ledger_.total(LedgerCategory::kProductive));
  if (e.step > rank_step) {
    auto at = ranks_at_step_.find(rank_step);
    if (--at->second == 0) ranks_at_step_.erase(at);
    ++ranks_at_step_[e.step];
    rank_step = e.step;
  }
  // The rank is in this generation's world (checked by the caller), which
  // the hang detector was started with: an error here is a bug.
  const Status recorded = hang_.OnStepEnd(e.rank.value, e.step, now);
  ENDURE_CHECK(recorded.ok());
  if (e.total_steps > 0 && e.step.value >= e.total_steps) {
    // Its last step: no next one is due. What a program does between its
    // last step and its exit (a final evaluation, a sample, a last save, the
    // teardown of its process group) is the phase "finish", judged by the
    // phase timeout: on a loaded machine it took longer than a step's.
    const Status finishing = hang_.OnPhase(e.rank.value, kFinishPhase, now);
    ENDURE_CHECK(finishing.ok());
  }
  const StepNumber job_step = ranks_at_step_.begin()->first;
  if (!productive_ && job_step > start_step_) {
    // Every rank finished its first step of this generation.
    productive_ = true;
    if (all_ready_at_) first_step_took_ = now - *all_ready_at_;
    ledger_.Enter(LedgerCategory::kProductive, now);
    if (Incident* inc = OpenIncident()) {
      inc->recovered_at = now;
      incident_open_ = false;
    }
  }
  if (productive_ && job_step > job_step_) {
    // The job's step time, for the straggler decision's costs.
    if (last_job_step_at_) {
      step_times_.push_back((now - *last_job_step_at_) / (job_step.value - job_step_.value));
      if (step_times_.size() > 21) step_times_.pop_front();
    }
    last_job_step_at_ = now;
  }
  if (productive_) job_step_ = job_step;
  if (e.total_steps > 0) total_steps_ = e.total_steps;
  if (e.rank == Rank{0} && !e.skipped) last_loss_ = e.loss;
  if (e.rank == Rank{0}) {
    if (productive_ && e.ckpt_stall_s > 0) {
      ledger_.Reclassify(FromSeconds(e.ckpt_stall_s), LedgerCategory::kCheckpointStall, now);
    }
    // The book's first event: a copy taken, which the productive time
    // before it survives.
    if (e.checkpoint_step.value >= 0 && book_.OnCopyTaken(e.checkpoint_step)) {
      std::optional<Duration> at_step;
      if (auto it = step_productive_.find(e.checkpoint_step); it != step_productive_.end()) {
        at_step = it->second;
      }
      ledger_.CopyTaken(e.checkpoint_step, now, at_step);
      step_productive_.erase(step_productive_.begin(),
                             step_productive_.upper_bound(e.checkpoint_step));
    }
  }
  if (!e.skipped) rank_loss_[e.rank.value] = {e.step, e.loss};
  // The step of an anomaly replayed for its verdict: the loss is judged by
  // the replay, not the detector.
  bool judged_by_replay = false;
  if (options_.detect_loss_anomalies && !e.skipped && anomaly_.replaying() == e.step) {
    std::optional<ReplayVerdict> v = anomaly_.ReplayedLoss(e.generation, e.rank, e.step, e.loss);
    judged_by_replay = e.generation > replay_generation_;
    if (v) {
      OnReplayVerdict(*v, now, out);
      if (phase_ != JobPhase::kRunning) return;
    }
  }
  if (options_.detect_loss_anomalies && !e.skipped && !judged_by_replay &&
      (e.rank == Rank{0} || !std::isfinite(e.loss))) {
    if (std::optional<LossAnomaly> a = loss_.Observe(e.step, e.loss)) {
      Failure f;
      f.cause = LossAnomalyCauseOf(a->kind);
      f.rank = e.rank;
      f.node = NodeOfRank(e.rank);
      f.fault_at = now;
      f.InjectedBy(LastFiredFault([&](const FaultFiredEvent& x) {
        return (x.kind == FaultKind::kNan || x.kind == FaultKind::kSpike) && x.rank == e.rank;
      }));
      f.anomaly = true;
      f.extra_reason = a->reason;
      f.loss_anomaly = *a;
      OnFailure(f, now, out);
      return;
    }
  }
  if (!e.skipped && e.compute_s > 0) {
    std::vector<StragglerFlag> flags = stragglers_.OnStepCompute(e.rank, e.step, e.compute_s);
    if (!flags.empty()) {
      OnStragglers(flags, now, out);
      if (phase_ != JobPhase::kRunning) return;
    }
  }
  FireDueFaults(now, out);
  // A step every rank completed: the moment for a shrunk job to grow back.
  if (e.step == job_step_) MaybeGrow(now, out);
}

void JobMachine::OnReplayVerdict(const ReplayVerdict& v, TimePoint now,
                                 std::vector<JobAction>& out) {
  Incident* inc = replay_incident_ > 0 && replay_incident_ <= static_cast<int>(incidents_.size())
                      ? &incidents_[replay_incident_ - 1]
                      : nullptr;
  if (v.decision.action == AnomalyAction::kContinue) {
    if (inc != nullptr) inc->reason += "; " + v.decision.reason;
    // A fault: the ranks whose loss changed are SDC suspects.
    for (Rank r : v.changed) {
      const NodeId node = NodeOfRank(r);
      Strike(node, "sdc_suspect", v.decision.reason, out);
      if (inc == nullptr || !node.valid()) continue;
      const std::string name = NodeName(node);
      if (std::find(inc->suspects.begin(), inc->suspects.end(), name) == inc->suspects.end()) {
        inc->suspects.push_back(name);
      }
    }
    if (inc != nullptr && !v.changed.empty()) {
      inc->rank = v.changed.front();
      inc->node = NodeOfRank(v.changed.front());
      inc->node_name = NodeName(inc->node);
    }
    return;
  }
  // The data's, and the job is to skip it or stop: a new incident, as for a
  // recurrence.
  Failure f;
  f.cause = LossAnomalyCauseOf(v.kind);
  f.rank = inc != nullptr ? inc->rank : Rank{0};
  f.node = NodeOfRank(f.rank);
  f.fault_at = now;
  f.anomaly = true;
  f.loss_anomaly = v.anomaly;
  f.anomaly_decision = v.decision;
  OnFailure(f, now, out);
}

std::string_view JobMachine::anomaly_mode() const {
  return !rank_deterministic_.empty() &&
                 std::all_of(rank_deterministic_.begin(), rank_deterministic_.end(),
                             [](bool b) { return b; })
             ? "replay"
             : "rollback";
}

void JobMachine::OnExitWhileStopping(const WorkerExitEvent& e) {
  // An exit the agent did not cause (not `stopped`) is a worker that died on
  // its own before the stop reached it.
  Incident* inc = OpenIncident();
  if (e.stopped || inc == nullptr || inc->generation != generation_ ||
      !IsCollectiveCause(inc->cause.name) || e.rank == inc->rank) {
    return;
  }
  if (IsCollectiveCause(e.log_cause)) {
    std::erase_if(stopping_collective_,
                  [&](const WorkerExitEvent& x) { return x.generation != generation_; });
    stopping_collective_.push_back(e);
  }
  // A collective fails for every rank when one of them dies, and the victim's
  // report may come first. A death that is no collective failure itself (a
  // signal nobody sent, a hardware log line) is the cause the collective
  // failure was the consequence of.
  WorkerExit exit;
  exit.node = e.node;
  exit.node_name = NodeName(e.node);
  exit.rank = e.rank.value;
  exit.exit_code = e.exit_code;
  exit.signal = e.signal;
  std::optional<CrashReport> crash = ClassifyWorkerExit(exit);
  if (!crash) return;
  const bool hardware_line = e.log_action == LogAction::kEvictNode;
  const bool signal_death =
      crash->kind == CrashKind::kSignal && (e.log_cause.empty() || !IsCollectiveCause(e.log_cause));
  if (!hardware_line && !signal_death) return;
  const std::string victim = inc->cause.name;
  const Rank victim_rank = inc->rank;
  inc->cause = !e.log_cause.empty() ? IncidentCause{Cause::kLogRule, e.log_cause}
                                    : IncidentCause{Cause::kSignal, crash->cause};
  inc->rank = e.rank;
  inc->node = e.node;
  inc->node_name = NodeName(e.node);
  if (!e.log_line.empty()) inc->log_line = e.log_line;
  inc->reason += "; then " + crash->reason +
                 (hardware_line ? " (log rule '" + e.log_rule + "': " + e.log_cause + ")" : "") +
                 ", reported while the generation stopped: the " + victim + " of rank " +
                 std::to_string(victim_rank.value) +
                 " was its consequence (a collective fails for every rank when one dies), so "
                 "the cause is rank " +
                 std::to_string(e.rank.value) + "'s";
}

void JobMachine::OnWorkerExit(const WorkerExitEvent& e, TimePoint now,
                              std::vector<JobAction>& out) {
  if (e.exit_code == 0) {
    rank_done_[e.rank.value] = true;
    // Done training: no step is to be expected from it any more.
    const Status watched = hang_.OnRankFinished(e.rank.value);
    ENDURE_CHECK(watched.ok());  // a rank of the world the detector was started with
    if (std::all_of(rank_done_.begin(), rank_done_.end(), [](bool b) { return b; })) {
      Finish(0, "training completed", now, out);
    }
    return;
  }
  WorkerExit exit;
  exit.node = e.node;
  exit.node_name = NodeName(e.node);
  exit.rank = e.rank.value;
  exit.exit_code = e.exit_code;
  exit.signal = e.signal;
  // The agent ended it (a node that dies kills its workers before its
  // agent goes; an agent shut down stops them): no failure of the rank's
  // own. What made the agent do it reaches the job as its own event (the
  // node's loss, the agent's goodbye).
  exit.stop_requested = e.stopped;
  std::optional<CrashReport> crash = ClassifyWorkerExit(exit);
  if (!crash) return;
  Failure f;
  if (!e.log_cause.empty()) {
    f.cause = IncidentCause{Cause::kLogRule, e.log_cause};
  } else {
    f.cause = IncidentCause{crash->kind == CrashKind::kSignal ? Cause::kSignal : Cause::kWorkerExit,
                            crash->cause};
  }
  f.rank = e.rank;
  f.node = e.node;
  f.fault_at = now;
  // Only faults that end a worker explain its exit (not, say, `slow`).
  f.InjectedBy(LastFiredFault([&](const FaultFiredEvent& x) {
    return x.rank == e.rank &&
           (x.kind == FaultKind::kKill || x.kind == FaultKind::kExit || x.kind == FaultKind::kLog);
  }));
  f.log_action = e.log_action;
  f.log_line = e.log_line;
  f.extra_reason = crash->reason;
  if (!e.log_rule.empty()) {
    const std::string_view action = e.log_action ? LogActionName(*e.log_action) : "";
    f.extra_reason += "; log rule '" + e.log_rule + "' (" + std::string(action) + ") matched";
  }
  OnFailure(f, now, out);
}

Duration JobMachine::QuietAfter() const {
  // Agents beat once a second: one and a half intervals without a beat, or
  // half the timeout when that is shorter. Before any hang floor passes.
  return std::min<Duration>(std::chrono::milliseconds(1500), options_.heartbeat.timeout / 2);
}

bool JobMachine::AnyMemberQuiet(TimePoint now) const {
  // The nodes heard from longest ago first: no walk over every member (it
  // is asked at every heartbeat while a hang is held).
  return heartbeats_.AnyHeardBy(now - QuietAfter(),
                                [&](NodeId n) { return member_set_.contains(n); });
}

void JobMachine::CheckHang(TimePoint now, std::vector<JobAction>& out) {
  if (hang_held_) return;
  const std::optional<TimePoint> deadline = hang_.NextDeadline();
  if (!deadline || now < *deadline) return;
  if (AnyMemberQuiet(now)) {
    hang_held_ = true;
    return;
  }
  std::optional<HangVerdict> v = hang_.Check(now);
  if (!v) return;
  Failure f;
  f.cause = FixedCause(Cause::kHang);
  f.rank = Rank{v->behind_ranks.empty() ? (v->stalled_ranks.empty() ? -1 : v->stalled_ranks[0])
                                        : v->behind_ranks[0]};
  f.fault_at = v->stalled_since;
  if (const FaultFiredEvent* fired =
          LastFiredFault([](const FaultFiredEvent& x) { return x.kind == FaultKind::kHang; })) {
    f.InjectedBy(fired);
    f.rank = fired->rank;
  }
  f.node = NodeOfRank(f.rank);
  f.extra_reason = v->reason;
  OnFailure(f, now, out);
}

// A node is lost (its stream dropped, or its heartbeats stopped) in any
// phase; what that means depends on the phase.
void JobMachine::OnNodeLost(NodeId node, const std::string& reason, TimePoint fault_at,
                            TimePoint now, std::vector<JobAction>& out) {
  auto it = nodes_.find(node);
  if (it == nodes_.end() || !it->second.up) return;
  it->second.up = false;
  auto member = std::find(members_.begin(), members_.end(), node);
  if (phase_ == JobPhase::kRunning && member != members_.end()) {
    // A member of the running generation: a failure.
    Failure f;
    f.cause = FixedCause(Cause::kNodeLost);
    f.node = node;
    f.rank = FirstRankOf(node);
    f.fault_at = fault_at;
    f.InjectedBy(LastFiredFault([&](const FaultFiredEvent& x) {
      return x.kind == FaultKind::kKillAgent && NodeOfRank(x.rank) == node;
    }));
    f.extra_reason = reason;
    OnFailure(f, now, out);
  } else if (phase_ == JobPhase::kStopping && member != members_.end()) {
    OnNodeLostWhileStopping(node, reason, out);
    // The node went away while stopping: its workers are gone with it.
    if (awaiting_stop_.erase(node) > 0 && awaiting_stop_.empty()) Stopped(now, out);
  }
  // Otherwise the node is merely no longer healthy: a start passes it over.
}

void JobMachine::OnNodeLostWhileStopping(NodeId node, const std::string& reason,
                                         std::vector<JobAction>& out) {
  // A node that dies takes its ranks' connections with it: its peers'
  // collectives fail at once, while its own loss is known only when its
  // stream's grace runs out (an agent killed with its node says no goodbye).
  // Its loss is then the cause the collective failure was the consequence of.
  Incident* inc = OpenIncident();
  if (inc == nullptr || inc->generation != generation_ || !IsCollectiveCause(inc->cause.name) ||
      inc->node == node) {
    return;
  }
  const std::string victim = inc->cause.name;
  const Rank victim_rank = inc->rank;
  inc->cause = FixedCause(Cause::kNodeLost);
  inc->rank = FirstRankOf(node);
  inc->node = node;
  inc->node_name = NodeName(node);
  // As OnFailure decides for a lost node: it leaves the job (it is gone
  // already), a strike in the node health ledger, and a spare or a repair.
  Strike(node, inc->cause.name, reason, out);
  inc->action = std::string(RecoveryActionName(SparesAvailable() > 0
                                                   ? RecoveryAction::kReplaceWithSpare
                                                   : RecoveryAction::kEvictAndWaitForRepair));
  inc->reason += "; then " + inc->node_name + " was lost (" + reason +
                 "), reported while the generation stopped: the " + victim + " of rank " +
                 std::to_string(victim_rank.value) +
                 " was its consequence (a collective fails for every rank when one node dies), "
                 "so the cause is " +
                 inc->node_name + "'s loss";
}

const FaultFiredEvent* JobMachine::LastFiredFault(
    const std::function<bool(const FaultFiredEvent&)>& matches) const {
  const FaultFiredEvent* last = nullptr;
  for (const auto& [gen, fired] : fired_events_) {
    if (gen == generation_ && matches(fired)) last = &fired;
  }
  return last;
}

void JobMachine::FireDueFaults(TimePoint now, std::vector<JobAction>& out) {
  if (phase_ != JobPhase::kRunning) return;
  for (const ExternalFault& f : external_) {
    if (fired_.count(f.id) || (!f.at && !productive_)) continue;
    // A step-keyed fault fires while its rank runs step `step`, i.e. once
    // step - 1 steps are complete.
    const bool due = f.at ? now - start_ >= *f.at
                          : (f.rank.valid() && f.rank.value < world_size() &&
                             rank_step_[f.rank.value].value >= f.step.value - 1);
    if (!due) continue;
    const Rank rank{std::clamp(f.rank.value, 0, world_size() - 1)};
    fired_.insert(f.id);
    FaultFiredEvent fired{
        generation_, rank, f.id, f.kind, StepNumber{rank_step_[rank.value].value + 1}, now};
    fired_events_.push_back({generation_, fired});
    out.push_back(InjectFaultAction{f, NodeOfRank(rank), generation_});
  }
}

int JobMachine::SparesAvailable(const std::vector<NodeId>& leaving) const {
  int spares = 0;
  for (NodeId n : HealthyNodes()) {
    if (std::find(members_.begin(), members_.end(), n) == members_.end() &&
        std::find(leaving.begin(), leaving.end(), n) == leaving.end()) {
      ++spares;
    }
  }
  return spares;
}

Rank JobMachine::FirstRankOf(NodeId member) const {
  const auto it = std::find(members_.begin(), members_.end(), member);
  ENDURE_CHECK(it != members_.end());
  return Rank{static_cast<int32_t>(it - members_.begin()) * options_.ranks_per_node};
}

bool JobMachine::ConfirmsItsRecurrence(const Failure& failure) const {
  // The generation right after an incident of the same cause is the
  // restart that was to confirm it; anything in between starts afresh.
  return failure.log_action == LogAction::kStopIfRepeated && !incidents_.empty() &&
         incidents_.back().cause.name == failure.cause.name &&
         incidents_.back().generation.value + 1 == generation_.value;
}

void JobMachine::OnFailure(const Failure& failure, TimePoint now, std::vector<JobAction>& out) {
  if (phase_ != JobPhase::kRunning) return;
  // Time between the fault and now was not productive: it was detection.
  // Nor was a stall before it: when no step completed for longer than a
  // step takes, the training stopped then, whatever the failure's own time
  // says (a collective that timed out on a dead peer, a node whose loss the
  // heartbeat declared later).
  if (productive_) {
    const TimePoint stopped = std::min(failure.fault_at, StalledSince().value_or(now));
    ledger_.Reclassify(std::max(Duration(0), now - stopped), LedgerCategory::kDetection, now);
  }
  ledger_.Enter(LedgerCategory::kRecovery, now);

  Incident inc;
  inc.id = static_cast<int>(incidents_.size()) + 1;
  inc.generation = generation_;
  inc.cause = failure.cause;
  inc.rank = failure.rank;
  inc.node = failure.node;
  inc.node_name = NodeName(failure.node);
  inc.injected_at = failure.injected_at;
  inc.fault_at = failure.fault_at;
  inc.detected_at = now;
  inc.failed_at_step = ranks_at_step_.empty() ? StepNumber{0} : ranks_at_step_.rbegin()->first;
  if (failure.loss_anomaly) {
    // The anomalous step and what was computed on top of it are in question,
    // not lost work: the newest step that is not.
    inc.failed_at_step = std::min(
        inc.failed_at_step, StepNumber{std::max<int64_t>(0, failure.loss_anomaly->step.value - 1)});
  }
  inc.log_line = failure.log_line;
  inc.suspects = failure.suspects;

  std::string reason = failure.extra_reason;
  bool stop = false;
  int exit_code = 3;
  std::vector<NodeId> evict;
  Duration delay{0};
  std::optional<RouteDecision> route;
  // A detector's own policy decided (a straggler's move, an SDC's or a loss
  // anomaly's rollback), not DecideFailure.
  const bool failure_decided = failure.decided_action.has_value() || failure.anomaly;
  if (failure.decided_action) {
    // The detector's own policy decided (its reason says why).
    inc.action = *failure.decided_action;
    evict = failure.evict_nodes;
    if (failure.rollback_to) {
      // The newest checkpoint at or before it, whichever run wrote it; the
      // later ones hold the abandoned timeline.
      restore_step_ = *failure.rollback_to;
      abandoned_from_ = StepNumber{failure.rollback_to->value + 1};
      skip_steps_.clear();
      RollBackCheckpoints(out);
      sdc_.RollBackTo(*failure.rollback_to);
    } else {
      restore_step_ = StepNumber{-1};
      abandoned_from_ = StepNumber{-1};
    }
  } else if (failure.anomaly) {
    // What this run reported and what the tiers held before it: a job
    // resumed from an earlier run's checkpoint rolls back to it, not to 0.
    const std::vector<StepNumber> ckpts = book_.Restorable();
    const bool replay = anomaly_mode() == "replay";
    std::vector<RankLoss> losses;
    for (int r = 0; r < world_size(); ++r) {
      if (rank_loss_[r].first == failure.loss_anomaly->step) {
        losses.push_back(RankLoss{Rank{r}, rank_loss_[r].second});
      }
    }
    AnomalyDecision d = failure.anomaly_decision ? *failure.anomaly_decision
                                                 : anomaly_.Decide(*failure.loss_anomaly, ckpts,
                                                                   replay, losses, generation_);
    if (anomaly_.replaying() == failure.loss_anomaly->step && !failure.anomaly_decision) {
      replay_incident_ = inc.id;
      replay_world_ = world_size();
      replay_generation_ = generation_;
    }
    inc.action = std::string(AnomalyActionName(d.action));
    reason = d.reason;  // it restates the anomaly itself
    if (d.action == AnomalyAction::kStop) {
      stop = true;
    } else {
      // The restore is asked as "the newest at or before the step before
      // the anomaly": the tiers, not this list, say which checkpoints exist
      // and verify. Checkpoints of the anomalous step and later hold its
      // update: they are the abandoned timeline.
      const StepNumber anomalous = failure.loss_anomaly->step;
      restore_step_ = StepNumber{std::max<int64_t>(0, anomalous.value - 1)};
      abandoned_from_ = anomalous;
      skip_steps_ = d.skip_steps;
      RollBackCheckpoints(out);
    }
  } else {
    // The failure policies, combined once (core::DecideFailure, which the
    // simulator calls too).
    FailureFacts facts;
    const std::string node_name = NodeName(failure.node);
    facts.event.node = failure.node;
    facts.event.node_name = node_name;
    facts.event.cause = failure.cause.name;
    facts.event.step = inc.failed_at_step;
    // Before this generation completed a step: a start-up failure.
    facts.event.during_recovery = !productive_;
    facts.event.spares_available = SparesAvailable();
    facts.log_action = failure.log_action;
    if (ConfirmsItsRecurrence(failure)) facts.confirms_incident = incidents_.back().id;
    const FailureDecision d =
        DecideFailure(recovery_, facts, now, [&](RecoveryAction action, bool node_leaves) {
          // The controller waits for a component's repair with the node out
          // of the job: it comes back when it registers again.
          if (failure.node.valid() && (node_leaves || action == RecoveryAction::kWaitForRepair)) {
            evict.push_back(failure.node);
          }
          return FactsFor(failure, action, evict);
        });
    inc.action = std::string(RecoveryActionName(d.action));
    reason += "; " + d.reason;
    stop = d.stops();
    if ((failure.log_action == LogAction::kStop || facts.confirms_incident > 0) &&
        !failure.log_line.empty()) {
      // A deterministic error: the verdict says so, and what the worker said.
      reason += " (\"" + failure.log_line.substr(0, 200) +
                (failure.log_line.size() > 200 ? "...\")" : "\")");
    }
    delay = d.delay;
    if (d.strike) Strike(failure.node, failure.cause.name, failure.extra_reason, out);
    if (d.route) {
      inc.route = d.route->route;
      inc.route_reason = d.route->reason;
      route = d.route;
    }
    // A crash restart resumes from the newest checkpoint that verifies: a
    // rollback removed the abandoned timeline's, so all that remain are of
    // this one, and a bound from this run's reports could only go back
    // further (a commit whose report was lost) and make the trainer drop it.
    restore_step_ = StepNumber{-1};
    abandoned_from_ = StepNumber{-1};
  }
  // How the job gets back to training, when a detector decided.
  if (!stop && failure_decided) {
    RecoveryAction action =
        evict.empty() ? RecoveryAction::kRestartInPlace : RecoveryAction::kReplaceWithSpare;
    RouteFacts facts = FactsFor(failure, action, evict);
    route = ChooseRoute(facts);
    inc.route = route->route;
    inc.route_reason = route->reason;
  }
  inc.reason = reason;
  incidents_.push_back(std::move(inc));
  incident_open_ = true;

  if (route && route->route != RecoveryRoute::kFullRestart) {
    // In process: the ranks that kept their state lose nothing but the step
    // in flight; the failed ones take the state from them. What they trained
    // since the last checkpoint stays at risk (uncommitted) until the next
    // one: a later failure that restores it makes that time recompute, and
    // so do ranks that come back at an older step than they had
    // (OnWorkerReady).
    in_process_from_ = job_step_;
    std::vector<NodeId> next = members_;
    std::vector<NodeId> spares;
    for (NodeId n : HealthyNodes()) {
      if (std::find(members_.begin(), members_.end(), n) == members_.end()) spares.push_back(n);
    }
    for (NodeId n : evict) EvictNode(n, incidents_.back().reason, out);
    for (NodeId& n : next) {
      if (nodes_[n].up) continue;
      if (spares.empty()) {
        // ChooseRoute shrinks only down to min_nodes, and moves to a spare
        // only with one.
        ENDURE_CHECK(route->route == RecoveryRoute::kShrink);
        n = NodeId{};
        continue;
      }
      n = spares.front();
      spares.erase(spares.begin());
    }
    std::erase_if(next, [](NodeId n) { return !n.valid(); });
    incidents_.back().stopped_at = now;  // nothing to stop
    StartGeneration(std::move(next), /*rejoin=*/true, now, out);
    return;
  }
  if ((unannounced_ || rollback_pending_) && !stop) {
    // The program keeps its own checkpoints, which the ledger does not hear
    // of: what survived is known when the next generation's first step says
    // what it restored (RestoredTo). A generation that reported no step
    // (or died before its ranks were ready) leaves the earlier one's steps
    // pending.
    if (!rollback_pending_) rollback_pending_ = std::move(step_productive_);
  } else {
    rollback_pending_.reset();
    ledger_.RollBack(now);
  }

  out.push_back(StopGenerationAction{generation_, failure.cause.kind == Cause::kHang});
  awaiting_stop_.clear();
  for (NodeId n : members_) {
    if (nodes_[n].up && std::find(evict.begin(), evict.end(), n) == evict.end()) {
      awaiting_stop_.insert(n);
    }
  }
  for (NodeId n : evict) EvictNode(n, incidents_.back().reason, out);
  if (stop) {
    incident_open_ = false;
    phase_ = JobPhase::kStopping;  // the stop above is the generation's: Finish sends none
    Finish(exit_code,
           "gave up after incident " + std::to_string(incidents_.back().id) + " (" +
               failure.cause.name + "): " + reason,
           now, out);
    return;
  }
  phase_ = JobPhase::kStopping;
  wait_until_ = delay > Duration(0) ? std::optional<TimePoint>(now + delay) : std::nullopt;
  if (awaiting_stop_.empty()) Stopped(now, out);
}

void JobMachine::MaybeStart(TimePoint now, std::vector<JobAction>& out) {
  if (phase_ != JobPhase::kWaitingForNodes && phase_ != JobPhase::kWaiting) return;
  if (wait_until_ && now < *wait_until_) return;
  std::vector<NodeId> nodes = HealthyNodes();
  // A restart of an elastic job goes on with the nodes it has, down to
  // min_nodes, and grows back later; its first generation waits for all.
  const int needed =
      phase_ == JobPhase::kWaiting && options_.min_nodes > 0 ? options_.min_nodes : options_.nodes;
  if (static_cast<int>(nodes.size()) < needed) {
    // Waiting for a replacement node (or the first registrations: a job
    // that never had its nodes has lost nothing yet and waits as long as
    // the scheduler makes it).
    if (phase_ != JobPhase::kWaiting) return;
    ledger_.Enter(LedgerCategory::kOther, now);
    if (options_.replacement_timeout <= Duration(0)) return;
    if (!replacement_deadline_) replacement_deadline_ = now + options_.replacement_timeout;
    if (now < *replacement_deadline_) return;
    std::string have;
    for (NodeId n : nodes) have += (have.empty() ? "" : ", ") + NodeName(n);
    Finish(3,
           "no replacement node within " + FormatDuration(options_.replacement_timeout) + ": " +
               std::to_string(nodes.size()) + " of the " + std::to_string(options_.nodes) +
               " nodes a generation needs are healthy (" + (have.empty() ? "none" : have) +
               "); start another agent, or give [recovery] replacement_timeout more time",
           now, out);
    return;
  }
  nodes.resize(std::min<size_t>(nodes.size(), options_.nodes));
  StartGeneration(std::move(nodes), /*rejoin=*/false, now, out);
}

void JobMachine::MaybeGrow(TimePoint now, std::vector<JobAction>& out) {
  const int have = static_cast<int>(members_.size());
  if (phase_ != JobPhase::kRunning || !productive_ || have >= options_.nodes) return;
  if (!options_.in_process || incident_open_) return;
  // Every rank must keep its process and state across the change.
  for (int r = 0; r < world_size(); ++r) {
    if (!rank_ready_[r] || !rank_rejoins_[r] || rank_done_[r]) return;
  }
  std::vector<NodeId> next = members_;
  std::string added;
  for (NodeId n : HealthyNodes()) {
    if (static_cast<int>(next.size()) >= options_.nodes) break;
    if (std::find(members_.begin(), members_.end(), n) != members_.end()) continue;
    next.push_back(n);
    added += (added.empty() ? "" : ", ") + NodeName(n);
  }
  if (static_cast<int>(next.size()) == have) return;
  const int to = static_cast<int>(next.size());
  const bool from_tiers =
      std::find(rank_from_tiers_.begin(), rank_from_tiers_.end(), true) != rank_from_tiers_.end();
  resizes_.push_back(Resize{
      generation_.Next(), now, have, to, job_step_,
      "grew from " + std::to_string(have) + " to " + std::to_string(to) + " of " +
          std::to_string(options_.nodes) + " nodes in process at step " +
          std::to_string(job_step_.value) + ": " + added +
          (from_tiers ? " joined, and every rank restored its part of the (sharded) state from "
                        "the tiers"
                      : " joined and took the state from a peer")});
  in_process_from_ = job_step_;
  StartGeneration(std::move(next), /*rejoin=*/true, now, out);
}

RouteFacts JobMachine::FactsFor(const Failure& failure, RecoveryAction action,
                                const std::vector<NodeId>& evict) const {
  RouteFacts f;
  f.in_process_enabled = options_.in_process;
  f.action = action;
  f.rollback = failure.anomaly || failure.rollback_to.has_value();
  f.hang = failure.cause.kind == Cause::kHang;
  // As Localize decides after the stop.
  f.localize = IsCollectiveCause(failure.cause.name) && options_.isolation.pairwise_test &&
               members_.size() >= 2;
  f.productive = productive_;
  f.world_size = world_size();
  f.nodes = static_cast<int>(members_.size());
  f.min_nodes = options_.min_nodes;
  auto leaves = [&](NodeId node) {
    auto it = nodes_.find(node);
    return std::find(evict.begin(), evict.end(), node) != evict.end() || it == nodes_.end() ||
           !it->second.up;
  };
  for (NodeId n : members_) f.nodes_to_replace += leaves(n) ? 1 : 0;
  for (int r = 0; r < world_size(); ++r) {
    const bool failed = Rank{r} == failure.rank || leaves(members_[r / options_.ranks_per_node]);
    if (failed) {
      ++f.failed_ranks;
    } else if (rank_ready_[r] && rank_rejoins_[r]) {
      ++f.survivors_rejoining;
      f.from_tiers = f.from_tiers || rank_from_tiers_[r];
    } else if (f.first_not_rejoining < 0) {
      f.first_not_rejoining = r;
    }
  }
  f.spares_available = SparesAvailable(evict);
  return f;
}

void JobMachine::StartGeneration(std::vector<NodeId> nodes, bool rejoin, TimePoint now,
                                 std::vector<JobAction>& out) {
  wait_until_.reset();
  replacement_deadline_.reset();
  // The ranks that keep their processes run the program that said so.
  const bool from_tiers = rejoin && std::find(rank_from_tiers_.begin(), rank_from_tiers_.end(),
                                              true) != rank_from_tiers_.end();
  generation_ = generation_.Next();
  members_ = std::move(nodes);
  member_set_ = std::set<NodeId>(members_.begin(), members_.end());
  rank_step_.assign(world_size(), StepNumber{0});
  ranks_at_step_ = {{StepNumber{0}, world_size()}};
  start_step_ = StepNumber{0};
  unannounced_ = false;
  restore_unknown_ = false;
  first_reported_.reset();
  rank_ready_.assign(world_size(), false);
  ranks_ready_ = 0;
  step_productive_.clear();
  rank_rejoins_.assign(world_size(), false);
  rank_from_tiers_.assign(world_size(), false);
  rank_deterministic_.assign(world_size(), false);
  rank_loss_.assign(world_size(), {StepNumber{-1}, 0.0});
  // A replay compares each rank's loss with its own: not across world sizes.
  if (anomaly_.replaying() && world_size() != replay_world_) anomaly_.ForgetReplay();
  rank_done_.assign(world_size(), false);
  max_restore_s_ = 0;
  productive_ = false;
  const bool first = generation_ == options_.first_generation;
  if (!first) ledger_.Enter(LedgerCategory::kRecovery, now);
  hang_.OnGenerationStart(generation_.value, world_size(), now);
  hang_held_ = false;
  stragglers_.OnGenerationStart(world_size());
  sdc_.OnGenerationStart(world_size());
  stacks_.clear();
  last_job_step_at_.reset();
  all_ready_at_.reset();
  if (Incident* inc = OpenIncident()) inc->relaunched_at = now;
  phase_ = JobPhase::kRunning;
  out.push_back(StartGenerationAction{
      generation_, members_, first || rejoin ? StepNumber{-1} : restore_step_,
      first || rejoin ? StepNumber{-1} : abandoned_from_, skip_steps_, fired_, rejoin, from_tiers});
  // Removed with this start; a later restart abandons nothing more unless a
  // new anomaly says so.
  abandoned_from_ = StepNumber{-1};
}

void JobMachine::Finish(int code, std::string reason, TimePoint now, std::vector<JobAction>& out) {
  ledger_.Advance(now);
  if (code != 0 && phase_ == JobPhase::kRunning) {
    out.push_back(StopGenerationAction{generation_, false});
  }
  phase_ = JobPhase::kDone;
  out.push_back(FinishAction{code, std::move(reason)});
}

// ---- Implicit failures and isolation ----

std::optional<TimePoint> JobMachine::StalledSince() const {
  if (!productive_ || !last_job_step_at_ || hang_.AnyRankInOtherPhase()) return std::nullopt;
  // Before the job has measured its steps, the generation's first step
  // (from every rank ready to its end) is the estimate.
  Duration step = MedianStepTime();
  if (step <= Duration(0) && first_step_took_) step = *first_step_took_;
  if (step <= Duration(0)) return std::nullopt;
  return *last_job_step_at_ + step;
}

Duration JobMachine::MedianStepTime() const {
  if (step_times_.empty()) return hang_.P99StepDuration().value_or(Duration(0));
  std::vector<Duration> sorted(step_times_.begin(), step_times_.end());
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  return sorted[sorted.size() / 2];
}

StepNumber JobMachine::NewestCheckpoint() const { return book_.Newest(); }

void JobMachine::RollBackCheckpoints(std::vector<JobAction>& out) {
  for (BookAction& a : book_.OnRollback(restore_step_, abandoned_from_, &rollback_notes_)) {
    out.push_back(ToJobAction(std::move(a)));
  }
}

checkpoint::RestorePlan JobMachine::PlanRestore(const StartGenerationAction& start) const {
  std::map<std::string, std::vector<int>> node_ranks;
  for (size_t i = 0; i < start.nodes.size(); ++i) {
    std::vector<int>& ranks = node_ranks[NodeName(start.nodes[i])];
    for (int l = 0; l < options_.ranks_per_node; ++l) {
      ranks.push_back(static_cast<int>(i) * options_.ranks_per_node + l);
    }
  }
  return book_.Plan(node_ranks, start.restore_step);
}

void JobMachine::EvictNode(NodeId node, const std::string& reason, std::vector<JobAction>& out) {
  auto it = nodes_.find(node);
  if (it != nodes_.end()) it->second.up = false;
  out.push_back(EvictNodeAction{node, reason});
}

void JobMachine::Strike(NodeId node, std::string_view cause, std::string detail,
                        std::vector<JobAction>& out) {
  if (!node.valid()) return;
  const bool hard = StrikeClassOf(cause) == StrikeClass::kHard;
  out.push_back(
      StrikeNodeAction{node, NodeName(node), std::string(cause), hard, std::move(detail)});
}

// A rank computes slower than its peers: weigh what keeping it costs over
// the job's remaining time against what moving costs, and act on the
// cheaper (Guard: a node 2% slow costs every step of a synchronous job).
void JobMachine::OnStragglers(const std::vector<StragglerFlag>& flags, TimePoint now,
                              std::vector<JobAction>& out) {
  for (const StragglerFlag& flag : flags) {
    const NodeId node = NodeOfRank(flag.rank);
    const Duration step = MedianStepTime();
    StragglerCosts c;
    c.step_time = step;
    // The job waits for the straggler at every allreduce: its extra compute
    // is the job's extra step time.
    const double step_s = Seconds(step);
    const double extra_s = std::max(0.0, flag.rank_compute_s - flag.peers_compute_s);
    c.slowdown = step_s > extra_s ? step_s / (step_s - extra_s) : flag.slowdown;
    // What the workers said they will train (nothing is left at the last
    // step), else the configured horizon.
    c.remaining = total_steps_ > 0
                      ? std::chrono::duration_cast<Duration>(
                            step * std::max<int64_t>(0, total_steps_ - job_step_.value))
                      : options_.isolation.straggler_horizon;
    // The job's own last recovery, when it had one, else the estimate.
    c.restart_cost = options_.isolation.restart_cost;
    for (auto it = incidents_.rbegin(); it != incidents_.rend(); ++it) {
      if (it->recovered_at) {
        c.restart_cost = *it->recovered_at - it->detected_at;
        break;
      }
    }
    const StepNumber ckpt = NewestCheckpoint();
    c.lost_work = std::chrono::duration_cast<Duration>(
        step * std::max<int64_t>(0, job_step_.value - std::max<int64_t>(ckpt.value, 0)));
    c.spares = std::max<int>(0, static_cast<int>(HealthyNodes().size()) - options_.nodes);
    c.replacement_wait = options_.isolation.replacement_wait;
    const StragglerDecision d = DecideStraggler(c);
    Strike(node, CauseName(Cause::kStraggler), flag.reason, out);
    const std::string reason = "rank " + std::to_string(flag.rank.value) + " on " + NodeName(node) +
                               ": " + flag.reason + "; " + d.reason;
    if (d.move == StragglerMove::kKeep) {
      // Keep running and report: nothing stops, so no incident.
      stragglers_kept_.push_back(StragglerReport{generation_, flag.rank, node, NodeName(node),
                                                 job_step_, now, flag.slowdown, reason});
      continue;
    }
    Failure f;
    f.cause = FixedCause(Cause::kStraggler);
    f.rank = flag.rank;
    f.node = node;
    // It was slow since about the start of its window.
    f.fault_at = now - std::chrono::duration_cast<Duration>(step * flag.window);
    f.InjectedBy(LastFiredFault([&](const FaultFiredEvent& x) {
      return x.kind == FaultKind::kSlow && x.rank == flag.rank;
    }));
    f.decided_action = std::string(StragglerMoveName(d.move));
    f.evict_nodes = {node};
    f.extra_reason = reason;
    f.suspects = {NodeName(node)};
    OnFailure(f, now, out);
    return;  // the generation stops
  }
}

// Replicas disagree: roll back to the newest checkpoint whose fingerprints
// agreed. A strict minority of three or more replicas is the corruption:
// its nodes are struck hard (quarantined) and leave the job. With two
// replicas, or no strict majority, every replica is a suspect: each gets a
// soft strike, and the multi-strike rule decides if it happens again.
void JobMachine::OnSdcVerdict(const SdcVerdict& v, TimePoint now, std::vector<JobAction>& out) {
  if (v.agreed) {
    // The recomputation without the node swapped out agreed: it was the
    // corrupt one.
    if (sdc_recompute_ && generation_ > sdc_recompute_->generation) {
      Strike(sdc_recompute_->swapped, CauseName(Cause::kSdc),
             "the replicas agreed at step " + std::to_string(v.step.value) +
                 " once it was swapped out after " + sdc_recompute_->reason,
             out);
      sdc_recompute_.reset();
    }
    return;
  }
  std::vector<NodeId> nodes;
  std::vector<std::string> names;
  for (Rank r : v.suspects) {
    const NodeId n = NodeOfRank(r);
    if (n.valid() && std::find(nodes.begin(), nodes.end(), n) == nodes.end()) {
      nodes.push_back(n);
      names.push_back(NodeName(n));
    }
  }
  Failure f;
  f.cause = FixedCause(Cause::kSdc);
  f.rank = v.suspects.empty() ? Rank{-1} : v.suspects.front();
  f.node = nodes.empty() ? NodeId{} : nodes.front();
  f.fault_at = now;
  f.InjectedBy(
      LastFiredFault([&](const FaultFiredEvent& x) { return x.kind == FaultKind::kBitflip; }));
  const StepNumber agreed = sdc_.last_agreed();
  f.rollback_to = StepNumber{std::max<int64_t>(0, agreed.value)};
  std::string where = agreed.value >= 0
                          ? "the newest checkpoint at or before step " +
                                std::to_string(agreed.value) + ", the last check that agreed"
                          : "a fresh start: no check agreed yet";
  std::string joined;
  for (const std::string& n : names) joined += (joined.empty() ? "" : ", ") + n;
  f.suspects = names;
  // Two replicas (or no majority): a recomputation decides. The first time,
  // one suspect node is swapped for a spare and the steps are recomputed;
  // if the replicas then agree, the node swapped out was the corrupt one,
  // and if they disagree again, the one that stayed is.
  if (!v.decided && sdc_recompute_ && generation_ > sdc_recompute_->generation &&
      std::find(nodes.begin(), nodes.end(), sdc_recompute_->kept) != nodes.end()) {
    const NodeId culprit = sdc_recompute_->kept;
    const std::string name = NodeName(culprit);
    sdc_recompute_.reset();
    Strike(culprit, CauseName(Cause::kSdc), v.reason, out);
    f.decided_action = "rollback_and_evict";
    f.evict_nodes = {culprit};
    f.node = culprit;
    f.suspects = {name};
    f.extra_reason =
        v.reason + "; again after the recomputation without the other suspect: " + name +
        " is the corrupt replica, struck (sdc, hard) and evicted; rolling " + "back to " + where;
    OnFailure(f, now, out);
    return;
  }
  const int spares = std::max<int>(0, static_cast<int>(HealthyNodes().size()) - options_.nodes);
  if (!v.decided && nodes.size() == 2 && spares > 0) {
    sdc_recompute_ = SdcRecompute{generation_, nodes[0], nodes[1], v.reason};
    for (NodeId n : nodes) Strike(n, "sdc_suspect", v.reason, out);
    f.decided_action = "rollback_and_recompute";
    f.evict_nodes = {nodes[1]};
    f.extra_reason = v.reason + "; suspects " + joined + " (sdc_suspect, soft); rolling back to " +
                     where + " and recomputing with " + names[1] +
                     " swapped for a spare: whichever the replicas then disagree with is corrupt";
    OnFailure(f, now, out);
    return;
  }
  // Evicting every node would leave no replica to trust.
  const bool evict = v.decided && nodes.size() < members_.size();
  f.decided_action = evict ? "rollback_and_evict" : "rollback";
  if (evict) f.evict_nodes = nodes;
  for (NodeId n : nodes) {
    Strike(n, evict ? "sdc" : "sdc_suspect", v.reason, out);
  }
  f.extra_reason = v.reason + "; rolling back to " + where +
                   (evict ? "; " + joined + " struck (sdc, hard) and evicted"
                          : "; suspects " + joined +
                                " struck (sdc_suspect, soft): with no spare to recompute "
                                "on, a repeat decides");
  OnFailure(f, now, out);
}

bool JobMachine::Localize(TimePoint now, std::vector<JobAction>& out) {
  Incident* inc = OpenIncident();
  if (inc == nullptr) return false;
  const bool hang = inc->cause.kind == Cause::kHang;
  if (!hang && !IsCollectiveCause(inc->cause.name)) return false;
  if (hang && !stacks_.empty()) {
    // ByteRobust §5.1: the ranks whose stacks differ from the majority's
    // are the suspects.
    const StackGroups g = GroupStacks(stacks_);
    inc->reason += "; stacks: " + g.reason;
    if (g.resolved) {
      std::vector<NodeId> nodes;
      for (Rank r : g.suspects) {
        const NodeId n = NodeOfRank(r);
        if (n.valid() && std::find(nodes.begin(), nodes.end(), n) == nodes.end()) {
          nodes.push_back(n);
        }
      }
      inc->suspects.clear();
      for (NodeId n : nodes) {
        inc->suspects.push_back(NodeName(n));
        Strike(n, "hang_suspect", g.reason, out);
      }
      if (options_.isolation.over_evict && nodes.size() < members_.size()) {
        // Evict the suspects' whole group rather than search further
        // (over-eviction: a false positive costs one node's swap).
        inc->action = "evict_suspects";
        inc->reason += "; [isolation] over_evict: evicting the suspects' nodes";
        for (NodeId n : nodes) EvictNode(n, inc->reason, out);
      }
      return false;
    }
  }
  // Ambiguous: who failed the collective? Ask the network, pair by pair.
  if (!options_.isolation.pairwise_test) return false;
  std::vector<NodeId> nodes;
  for (NodeId n : members_) {
    auto it = nodes_.find(n);
    if (it != nodes_.end() && it->second.up) nodes.push_back(n);
  }
  if (nodes.size() < 2) return false;
  std::map<NodeId, std::string> names;
  for (NodeId n : nodes) names[n] = NodeName(n);
  pairwise_.emplace(nodes, options_.isolation.pairwise, std::move(names));
  pairs_asked_ = pairwise_->FirstRound();
  pair_results_.clear();
  pairwise_deadline_ = now + options_.isolation.pairwise_timeout;
  phase_ = JobPhase::kTesting;
  out.push_back(RunPairTestAction{++pair_tests_, pairwise_->round(), pairs_asked_});
  return true;
}

void JobMachine::StepTesting(const JobEvent& event, TimePoint now, std::vector<JobAction>& out) {
  if (const auto* e = std::get_if<PairTestResult>(&event)) {
    if (e->test != pair_tests_ || e->round != pairwise_->round()) return;
    const bool asked = std::find(pairs_asked_.begin(), pairs_asked_.end(), std::pair{e->a, e->b}) !=
                       pairs_asked_.end();
    const bool seen = std::any_of(pair_results_.begin(), pair_results_.end(),
                                  [&](const PairResult& r) { return r.a == e->a && r.b == e->b; });
    if (!asked || seen) return;
    pair_results_.push_back(PairResult{e->a, e->b, e->ok, e->seconds, e->error});
    if (pair_results_.size() == pairs_asked_.size()) EndPairwiseRound(now, out);
  } else if (std::holds_alternative<Tick>(event)) {
    // Pairs that did not answer in time count as failed.
    if (pairwise_deadline_ && now >= *pairwise_deadline_) EndPairwiseRound(now, out);
  }
}

void JobMachine::BlameTheFaultyNode(Incident& inc, NodeId faulty) {
  // Every rank's collective fails when one rank's link does, and whichever
  // report came first opened the incident. The culprit's own report, on the
  // node the pairwise test names, is the cause; its node stopped after it
  // (one stream, in order), so it arrived before the test began.
  if (inc.node == faulty) return;
  for (const WorkerExitEvent& e : stopping_collective_) {
    if (e.generation != inc.generation || e.node != faulty) continue;
    inc.reason += "; the first report, rank " + std::to_string(inc.rank.value) + "'s " +
                  inc.cause.name + ", was a victim's: the cause is rank " +
                  std::to_string(e.rank.value) + "'s " + e.log_cause + " on " + NodeName(faulty);
    inc.cause = IncidentCause{Cause::kLogRule, e.log_cause};
    inc.rank = e.rank;
    inc.node = faulty;
    inc.node_name = NodeName(faulty);
    if (!e.log_line.empty()) inc.log_line = e.log_line;
    return;
  }
}

void JobMachine::EndPairwiseRound(TimePoint now, std::vector<JobAction>& out) {
  auto next = pairwise_->OnResults(pair_results_);
  pair_results_.clear();
  if (auto* pairs = std::get_if<std::vector<std::pair<NodeId, NodeId>>>(&next)) {
    pairs_asked_ = *pairs;
    pairwise_deadline_ = now + options_.isolation.pairwise_timeout;
    out.push_back(RunPairTestAction{pair_tests_, pairwise_->round(), pairs_asked_});
    return;
  }
  const PairwiseVerdict& v = std::get<PairwiseVerdict>(next);
  if (Incident* inc = OpenIncident()) {
    inc->reason += "; pairwise test: " + v.reason;
    if (v.resolved && v.faulty.size() == 1) BlameTheFaultyNode(*inc, v.faulty[0]);
    if (v.resolved) {
      inc->suspects.clear();
      std::vector<NodeId> bad = v.faulty;
      bad.insert(bad.end(), v.slow.begin(), v.slow.end());
      for (NodeId n : bad) {
        inc->suspects.push_back(NodeName(n));
        const bool slow = std::find(v.slow.begin(), v.slow.end(), n) != v.slow.end();
        Strike(n, slow ? "pairwise_slow" : "pairwise_failed", v.reason, out);
      }
      if (!bad.empty() && bad.size() < members_.size()) {
        inc->action = "evict_suspects";
        for (NodeId n : bad) EvictNode(n, inc->reason, out);
      }
    }
  }
  pairwise_.reset();
  pairs_asked_.clear();
  pairwise_deadline_.reset();
  phase_ = JobPhase::kWaiting;
  MaybeStart(now, out);
}

}  // namespace endure::core
