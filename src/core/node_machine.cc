#include "core/node_machine.h"

#include <algorithm>
#include <csignal>
#include <utility>

#include "common/names.h"
#include "common/secret.h"
#include "common/status.h"
#include "core/incident_match.h"
#include "proto/wire_enums.h"

namespace endure::core {
namespace {

// A command for a generation older than the newest one started on this
// stream crossed a newer Start on the wire: carried out, it would stop (or
// dump, or start again) the current generation while its reply names the old
// one, which the controller drops. Shutdown and faults belong to no
// generation. A stop for a generation this node never ran (newer) is
// answered: the controller waits for every node's. Judged per stream: a
// controller that restarted without its state numbers generations anew.
bool IsStale(const proto::AgentCommand& cmd, int64_t current) {
  switch (cmd.command_case()) {
    case proto::AgentCommand::kShutdown:
    case proto::AgentCommand::kInject:
    case proto::AgentCommand::kPrepare:
      return false;
    case proto::AgentCommand::kStart:
      return cmd.generation() <= current;
    default:
      return cmd.generation() < current;
  }
}

// The fingerprint a trainer printed in its last words: the first
// "param_fingerprint=" followed by 16 lowercase hex digits.
std::string FindFingerprint(std::string_view tail) {
  constexpr std::string_view kKey = "param_fingerprint=";
  for (size_t pos = tail.find(kKey); pos != std::string_view::npos;
       pos = tail.find(kKey, pos + 1)) {
    const std::string_view hex = tail.substr(pos + kKey.size(), 16);
    if (hex.size() == 16 && hex.find_first_not_of("0123456789abcdef") == std::string_view::npos) {
      return std::string(hex);
    }
  }
  return "";
}

// What a worker's datagram becomes for the controller; nullopt: nothing
// (a heartbeat: the worker's liveness is its process, progress its steps).
std::optional<proto::AgentEvent> Translate(const contract::Datagram& d) {
  proto::AgentEvent e;
  if (const auto* m = std::get_if<contract::StepMessage>(&d.message)) {
    auto* s = e.mutable_step();
    s->set_rank(d.rank);
    s->set_step(m->step);
    // A step without a loss (null: the program does not know it) is
    // progress with nothing to judge, like a skipped one.
    const bool no_loss = m->skipped || !m->loss.has_value();
    s->set_skipped(no_loss);
    s->set_tokens(m->tokens);
    s->set_total_steps(m->total_steps);
    s->set_loss(no_loss ? 0.0 : *m->loss);
    s->set_compute_s(m->compute_s);
    s->set_comm_s(m->comm_s);
    s->set_ckpt_stall_s(m->ckpt_stall_s);
    s->set_checkpoint_step(m->checkpoint_step);
  } else if (const auto* m = std::get_if<contract::PhaseMessage>(&d.message)) {
    auto* p = e.mutable_phase();
    p->set_rank(d.rank);
    p->set_phase(m->name);
    p->set_step(m->step);
  } else if (const auto* m = std::get_if<contract::FingerprintMessage>(&d.message)) {
    auto* f = e.mutable_fingerprint();
    f->set_rank(d.rank);
    f->set_step(m->step);
    f->set_fingerprint(m->fingerprint);
  } else if (const auto* m = std::get_if<contract::ReadyMessage>(&d.message)) {
    auto* r = e.mutable_worker_ready();
    r->set_rank(d.rank);
    r->set_start_step(m->start_step);
    r->set_restore_s(m->restore_s);
    r->set_init_s(m->init_s);
    r->set_rejoin(m->rejoin);
    r->set_rejoin_from_tiers(m->rejoin_from_tiers);
    r->set_deterministic(m->deterministic);
    r->set_start_step_unknown(m->start_step_unknown);
  } else if (const auto* m = std::get_if<contract::FaultMessage>(&d.message)) {
    auto* f = e.mutable_fault_fired();
    f->set_rank(d.rank);
    f->set_fault_id(m->id);
    f->set_kind(wire::ToWire(m->kind));
    f->set_step(m->step);
  } else {
    return std::nullopt;
  }
  return e;
}

}  // namespace

RestoreRoute RestoreRouteOf(bool rejoin, bool kept_alive, bool has_plan) {
  if (rejoin) return kept_alive ? RestoreRoute::kKeepsItsState : RestoreRoute::kFromPeers;
  return has_plan ? RestoreRoute::kFromPlan : RestoreRoute::kFromScratch;
}

std::string_view RestoreRouteName(RestoreRoute route) {
  switch (route) {
    case RestoreRoute::kKeepsItsState:
      return "keeps_its_state";
    case RestoreRoute::kFromPeers:
      return "from_peers";
    case RestoreRoute::kFromPlan:
      return "from_plan";
    case RestoreRoute::kFromScratch:
      return "from_scratch";
  }
  return "?";
}

NodeMachine::NodeMachine(NodeMachineOptions options, LogClassifier classifier,
                         contract::DatagramContext datagram_context)
    : o_(std::move(options)),
      classifier_(std::move(classifier)),
      datagram_context_(std::move(datagram_context)),
      outage_(o_.outage_capacity),
      refusal_log_(o_.refusal_log_burst, o_.refusal_log_interval) {}

int64_t NodeMachine::last_step(int rank) const {
  auto it = last_steps_.find(rank);
  return it == last_steps_.end() ? 0 : it->second;
}

std::map<int, int> NodeMachine::stack_signals(int64_t generation) const {
  return generation == gate_.generation ? stack_signals_ : std::map<int, int>{};
}

double NodeMachine::comm_slow_factor(const std::string& fault_id) const {
  auto it = comm_slow_factors_.find(fault_id);
  return it == comm_slow_factors_.end() ? 3.0 : it->second;
}

std::vector<NodeAction> NodeMachine::Step(const NodeInput& input, NodeTime time) {
  std::vector<NodeAction> out;
  now_ = time.now;
  std::visit(
      [&](const auto& in) {
        using T = std::decay_t<decltype(in)>;
        if constexpr (std::is_same_v<T, StreamOpened>) {
          OnStreamOpened(in, time, &out);
        } else if constexpr (std::is_same_v<T, StreamLost>) {
          if (link_ == Link::kOpen) link_ = Link::kOutage;
        } else if constexpr (std::is_same_v<T, StreamClosed>) {
          link_ = Link::kNone;
        } else if constexpr (std::is_same_v<T, TransmitFailed>) {
          // The stream broke under these writes: the outage starts here, and
          // they are the first the next stream carries.
          if (link_ != Link::kNone) {
            link_ = Link::kOutage;
            for (const proto::AgentEvent& e : in.unsent) {
              if (!e.has_register_()) outage_.Push(e);
            }
          }
        } else if constexpr (std::is_same_v<T, CommandArrived>) {
          ENDURE_CHECK(in.command != nullptr);
          OnCommand(*in.command, &out);
        } else if constexpr (std::is_same_v<T, GenerationStarted>) {
          OnGenerationStarted(in, time, &out);
        } else if constexpr (std::is_same_v<T, StandbysWanted>) {
          if (o_.standby && !member_ && !in.program.argv.empty()) {
            KeepStandbys(in.program, std::clamp(in.count, 0, o_.slots), /*fill_now=*/true, &out);
          }
        } else if constexpr (std::is_same_v<T, StandbysDiscarded>) {
          standby_count_ = 0;
          refill_pending_ = false;
        } else if constexpr (std::is_same_v<T, DatagramArrived>) {
          OnDatagram(in.bytes, in.size, time, &out);
        } else if constexpr (std::is_same_v<T, OutputLine>) {
          OnOutputLine(in, time, &out);
        } else if constexpr (std::is_same_v<T, WorkerExited>) {
          OnWorkerExited(in, time, &out);
        } else if constexpr (std::is_same_v<T, Report>) {
          if (in.event.has_heartbeat()) {
            // The node's report of its ranks' steps says it is alive too:
            // a heartbeat within a beat of one is not sent.
            FlushSteps(&out);
            if (last_report_at_ && now_ - *last_report_at_ < kReportIsHeartbeat) return;
          }
          proto::AgentEvent e = in.event;
          Stamp(&e, in.generation < 0 ? gate_.generation : in.generation, time.wall_s);
          Route(std::move(e), &out);
        }
      },
      input);
  return out;
}

void NodeMachine::Stamp(proto::AgentEvent* event, int64_t generation, double wall_s) const {
  event->set_token(o_.token);
  event->set_generation(generation);
  event->set_time_s(wall_s);
}

void NodeMachine::Route(proto::AgentEvent event, std::vector<NodeAction>* out) {
  if (event.has_step()) {
    HoldStep(std::move(event), out);
    return;
  }
  // What a node says after its ranks' steps comes after them.
  FlushSteps(out);
  Send(std::move(event), out);
}

void NodeMachine::HoldStep(proto::AgentEvent event, std::vector<NodeAction>* out) {
  if (held_steps_) {
    const auto& ranks = held_steps_->node_steps().ranks();
    const bool again = std::any_of(ranks.begin(), ranks.end(), [&](const proto::StepProgress& s) {
      return s.rank() == event.step().rank();
    });
    if (again || held_steps_->generation() != event.generation()) FlushSteps(out);
  }
  if (!held_steps_) {
    held_steps_.emplace();
    held_steps_->set_token(event.token());
    held_steps_->set_generation(event.generation());
  }
  held_steps_->set_time_s(std::max(held_steps_->time_s(), event.time_s()));  // its newest
  *held_steps_->mutable_node_steps()->add_ranks() = std::move(*event.mutable_step());
  // Every rank this node runs in the generation has reported: the report
  // goes. (A rank that does not report holds the others until the node
  // says anything else: its heartbeat, within a second.)
  const size_t ranks_here =
      held_steps_->generation() == gate_.generation ? gate_.local_ranks.size() : 1;
  if (static_cast<size_t>(held_steps_->node_steps().ranks_size()) >=
      std::max<size_t>(1, ranks_here)) {
    FlushSteps(out);
  }
}

void NodeMachine::FlushSteps(std::vector<NodeAction>* out) {
  if (!held_steps_) return;
  proto::AgentEvent report = std::move(*held_steps_);
  held_steps_.reset();
  if (link_ == Link::kOpen) last_report_at_ = now_;
  Send(std::move(report), out);
}

void NodeMachine::Send(proto::AgentEvent event, std::vector<NodeAction>* out) {
  switch (link_) {
    case Link::kOpen:
      out->push_back(Transmit{std::move(event)});
      return;
    case Link::kOutage:
      outage_.Push(std::move(event));
      return;
    case Link::kNone:
      return;  // before the first stream and after the last
  }
}

void NodeMachine::Refuse(const std::string& why, NodeTime time, std::vector<NodeAction>* out) {
  ++refused_;
  int64_t held_back = 0;
  if (!refusal_log_.Allow(time.now, &held_back)) return;
  std::string line = "refused a datagram (" + std::to_string(refused_) + " so far";
  if (held_back > 0) line += ", " + std::to_string(held_back) + " not shown";
  line += "): " + QuoteForLog(why, 300);
  out->push_back(LogLine{std::move(line)});
}

void NodeMachine::OnStreamOpened(const StreamOpened& in, NodeTime time,
                                 std::vector<NodeAction>* out) {
  started_on_stream_ = -1;
  link_ = Link::kOpen;
  proto::AgentEvent hello = in.hello;
  if (!in.resuming) {
    out->push_back(Transmit{std::move(hello)});  // registration is the first word
    return;
  }
  // The resuming hello first, then what happened meanwhile, in order, then
  // the ranks' last words of this generation again.
  hello.mutable_register_()->set_events_dropped(outage_.dropped());
  out->push_back(Transmit{std::move(hello)});
  for (; !outage_.empty(); outage_.PopFront()) out->push_back(Transmit{outage_.front()});
  for (const auto& [rank, events] : last_words_) {
    for (proto::AgentEvent e : events) {
      Stamp(&e, gate_.generation, time.wall_s);
      out->push_back(Transmit{std::move(e)});
    }
  }
}

void NodeMachine::OnCommand(const proto::AgentCommand& cmd, std::vector<NodeAction>* out) {
  if (!ConstantTimeEquals(cmd.token(), o_.token)) return;
  if (IsStale(cmd, started_on_stream_)) {
    out->push_back(LogLine{"dropped a command of generation " + std::to_string(cmd.generation()) +
                           ": generation " + std::to_string(started_on_stream_) +
                           " started since"});
    return;
  }
  if (cmd.command_case() == proto::AgentCommand::kStart) started_on_stream_ = cmd.generation();
  out->push_back(CarryOut{});
}

void NodeMachine::OnGenerationStarted(const GenerationStarted& in, NodeTime time,
                                      std::vector<NodeAction>* out) {
  member_ = true;
  // The new generation's gate and a clean slate of reports, at once: a
  // datagram the new gate admits is never cleared after it.
  gate_.generation = in.generation;
  gate_.credential = in.credential;
  gate_.local_ranks = in.ranks;
  started_ = time.now;
  if (!in.rejoin) stack_signals_.clear();  // a worker that rejoins announced its own once
  last_steps_.clear();
  last_words_.clear();
  output_.reset();
  first_output_at_.reset();
  unmatched_warned_ = false;
  for (const auto& [id, factor] : in.comm_slow_factors) comm_slow_factors_[id] = factor;
  persist_every_steps_ = in.persist_every_steps;
  if (!in.progress_pattern.empty()) {
    // The controller validated it (job_spec.cc); a refusal here means the
    // two disagree, and training goes on without it.
    Result<ProgressPattern> p = ProgressPattern::Compile(in.progress_pattern);
    if (p.ok()) {
      output_.emplace(std::move(p).value(), std::clamp(in.world_size, 0, 1 << 20));
    } else {
      out->push_back(LogLine{"progress_pattern ignored: " + p.status().message()});
    }
  }
  if (o_.standby && !in.standby.argv.empty()) {
    KeepStandbys(in.standby, static_cast<int>(in.ranks.size()), /*fill_now=*/false, out);
  }
}

void NodeMachine::KeepStandbys(const StandbyProgram& program, int count, bool fill_now,
                               std::vector<NodeAction>* out) {
  // Standbys of another program (a changed command or environment) are of no use.
  out->push_back(DiscardOtherStandbys{program});
  standby_ = program;
  standby_count_ = std::max(0, count);
  refill_pending_ = true;
  if (fill_now) Stepped(out);
}

void NodeMachine::Stepped(std::vector<NodeAction>* out) {
  if (!refill_pending_) return;
  refill_pending_ = false;
  if (standby_count_ > 0) out->push_back(RefillStandbys{standby_, standby_count_});
}

void NodeMachine::OnDatagram(std::string_view bytes, size_t size, NodeTime time,
                             std::vector<NodeAction>* out) {
  size = std::max(size, bytes.size());
  if (size > contract::kMaxDatagramBytes) {
    Refuse("a datagram of " + std::to_string(size) + " bytes; the limit is " +
               std::to_string(contract::kMaxDatagramBytes),
           time, out);
    return;
  }
  Result<contract::Datagram> parsed = contract::ParseDatagram(bytes, datagram_context_);
  if (!parsed.ok()) {
    Refuse(parsed.status().message(), time, out);
    return;
  }
  const contract::Datagram& d = *parsed;
  const DatagramGate::Verdict verdict = gate_.Admit(d);
  if (verdict == DatagramGate::Verdict::kStale) return;  // a straggler's, late
  if (verdict != DatagramGate::Verdict::kAccept) {
    Refuse("a \"" + std::string(contract::DatagramType(d)) + "\" datagram from rank " +
               std::to_string(d.rank) + " of generation " + std::to_string(d.generation) + ": " +
               std::string(VerdictName(verdict)),
           time, out);
    return;
  }
  if (const auto* stacks = std::get_if<contract::StacksMessage>(&d.message)) {
    if (!contract::IsStackSignal(stacks->signal)) {
      Refuse("ignored a \"stacks\" datagram from rank " + std::to_string(d.rank) + ": signal " +
                 std::to_string(stacks->signal) +
                 ": only SIGUSR1, SIGUSR2 or a real-time signal may be used",
             time, out);
      return;
    }
    stack_signals_[d.rank] = static_cast<int>(stacks->signal);
    return;  // nothing for the controller
  }
  if (output_) output_->OnDatagram(d.rank, contract::DatagramType(d));
  if (const auto* m = std::get_if<contract::SnapshotMessage>(&d.message)) {
    out->push_back(NotifySnapshot{d.rank, m->step, m->shards, m->path,
                                  DurableStepDue(m->step, persist_every_steps_)});
    return;
  }
  if (const auto* m = std::get_if<contract::StepMessage>(&d.message)) {
    int64_t& last = last_steps_[d.rank];
    last = std::max(last, m->step);
    if (!m->skipped) Stepped(out);
  }
  if (const auto* m = std::get_if<contract::FaultMessage>(&d.message)) {
    // The node's network is what the fault breaks: its pairwise tests fail
    // (or crawl) from now on, as its collectives do.
    if (m->kind == faults::FaultKind::kCommFail) out->push_back(BreakPairTests{true, 1});
    if (m->kind == faults::FaultKind::kCommSlow) {
      out->push_back(BreakPairTests{false, comm_slow_factor(m->id)});
    }
  }
  if (const auto* m = std::get_if<contract::ReadyMessage>(&d.message); m && m->rejoin) {
    out->push_back(ForgetLastWords{d.rank});
  }
  std::optional<proto::AgentEvent> e = Translate(d);
  if (!e) return;
  // The worker's own clock says when it happened (a fault fires just before
  // its process dies); the controller maps it onto its own clock.
  Stamp(&*e, d.generation, d.time_s.value_or(time.wall_s));
  Route(std::move(*e), out);
}

void NodeMachine::OnOutputLine(const OutputLine& in, NodeTime time, std::vector<NodeAction>* out) {
  if (in.generation != gate_.generation || !output_) return;
  const double init_s = Seconds(time.now - started_);
  bool stepped = false;
  for (const OutputReport& r : output_->OnLine(in.rank, in.line)) {
    proto::AgentEvent e;
    if (r.kind == OutputReport::Kind::kReady) {
      auto* w = e.mutable_worker_ready();
      w->set_rank(r.rank);
      w->set_start_step_unknown(true);  // an unmodified program: its first step says
      w->set_init_s(init_s);
    } else {
      auto* s = e.mutable_step();
      s->set_rank(r.rank);
      s->set_step(r.step);
      s->set_checkpoint_step(-1);
      // Without a loss there is nothing to judge (the loss detector would
      // take a missing one for NaN).
      s->set_skipped(!r.loss.has_value());
      s->set_loss(r.loss.value_or(0.0));
      int64_t& last = last_steps_[r.rank];
      last = std::max(last, r.step);
      stepped = true;
    }
    Stamp(&e, in.generation, time.wall_s);
    Route(std::move(e), out);
  }
  if (stepped) Stepped(out);
  WarnIfUnmatched(in.generation, time, out);
}

void NodeMachine::WarnIfUnmatched(int64_t generation, NodeTime time, std::vector<NodeAction>* out) {
  if (!first_output_at_) first_output_at_ = time.now;
  if (unmatched_warned_ || output_->matched() ||
      output_->unmatched_lines() < kUnmatchedLinesToWarn ||
      time.now - *first_output_at_ < kUnmatchedForToWarn) {
    return;
  }
  unmatched_warned_ = true;
  const double seconds = Seconds(time.now - *first_output_at_);
  char what[160];
  std::snprintf(what, sizeof what,
                "progress_pattern has matched none of the %lld lines the workers printed over "
                "%.1fs: no step is counted",
                static_cast<long long>(output_->unmatched_lines()), seconds);
  out->push_back(LogLine{std::string(what) + " (the last: '" + output_->last_unmatched() + "')"});
  proto::AgentEvent e;
  auto* u = e.mutable_progress_unmatched();
  u->set_lines(output_->unmatched_lines());
  u->set_seconds(seconds);
  u->set_last_line(output_->last_unmatched());
  Stamp(&e, generation, time.wall_s);
  Route(std::move(e), out);
}

void NodeMachine::OnWorkerExited(const WorkerExited& in, NodeTime time,
                                 std::vector<NodeAction>* out) {
  const bool success = in.exited && in.exit_code == 0;
  std::vector<proto::AgentEvent> words;
  if (!success) {
    // What the worker said last, and the node's kernel records of this
    // generation (an Xid the worker only saw as a CUDA error): classified as
    // one excerpt, and kept by the controller with the incident, matched or
    // not, to recognize the failure when it recurs.
    const std::string evidence = in.tail + in.kernel_records;
    proto::AgentEvent e;
    auto* lm = e.mutable_log_match();
    lm->set_rank(in.rank);
    lm->set_excerpt(BoundedExcerpt(evidence));
    if (std::optional<LogMatch> m = classifier_.Classify(evidence)) {
      lm->set_cause(m->cause);
      lm->set_action(wire::ToWire(m->action));
      lm->set_rule(m->rule);
      lm->set_line(m->line);
    }
    words.push_back(std::move(e));
  }
  proto::AgentEvent e;
  auto* x = e.mutable_worker_exited();
  x->set_rank(in.rank);
  x->set_exited(in.exited);
  x->set_exit_code(in.exit_code);
  x->set_signal(in.signal);
  x->set_param_fingerprint(FindFingerprint(in.tail));
  x->set_stopped(in.stopped);
  words.push_back(std::move(e));
  if (in.generation == gate_.generation) last_words_[in.rank] = words;
  for (proto::AgentEvent& w : words) {
    Stamp(&w, in.generation, time.wall_s);
    Route(std::move(w), out);
  }
}

}  // namespace endure::core
