// Reading an agent's event into the core's; see agent_events.h.
#include "core/agent_events.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common/duration.h"
#include "common/utf8.h"
#include "contract/worker_contract.h"
#include "proto/wire_enums.h"

namespace endure::core {

namespace {

StepEnd StepEndOf(const proto::StepProgress& s, int generation) {
  StepEnd step{generation,          s.rank(),   s.step(), s.loss(), s.ckpt_stall_s(),
               s.checkpoint_step(), s.skipped()};
  // Hostile until checked, by the worker contract's bounds: a negative or
  // non-finite compute time, or a step count beyond what a double holds, is
  // none.
  if (contract::IsSeconds(s.compute_s()) && s.compute_s() > 0) step.compute_s = s.compute_s();
  if (s.total_steps() > 0 && s.total_steps() <= contract::kMaxCount) {
    step.total_steps = s.total_steps();
  }
  return step;
}

}  // namespace

AgentEventRead ReadAgentEvent(const proto::AgentEvent& e, NodeId node,
                              const AgentEventContext& context) {
  const int gen = static_cast<int>(e.generation());
  AgentEventRead q;
  switch (e.event_case()) {
    case proto::AgentEvent::kWorkerReady:
      q.event = WorkerReady{gen,
                            e.worker_ready().rank(),
                            e.worker_ready().start_step(),
                            e.worker_ready().restore_s(),
                            e.worker_ready().rejoin(),
                            e.worker_ready().deterministic(),
                            e.worker_ready().start_step_unknown(),
                            e.worker_ready().rejoin_from_tiers()};
      break;
    case proto::AgentEvent::kStep:
      q.event = StepEndOf(e.step(), gen);
      q.tokens = e.step().tokens();
      break;
    case proto::AgentEvent::kNodeSteps: {
      // One entry per rank, at most a node's ranks: a report beyond that
      // is damaged, and makes no event.
      const auto& ranks = e.node_steps().ranks();
      if (ranks.empty() || ranks.size() > kMaxNodeStepsRanks) break;
      NodeStepsEnd steps{node, Generation{gen}, {}};
      std::set<int32_t> seen;
      for (const proto::StepProgress& s : ranks) {
        if (!seen.insert(s.rank()).second) return q;  // a rank twice
        steps.steps.push_back(StepEndOf(s, gen));
        if (s.rank() == 0) q.tokens = s.tokens();
      }
      q.event = std::move(steps);
      break;
    }
    case proto::AgentEvent::kPhase: {
      const std::string& phase = e.phase().phase();
      if (!contract::IsPhaseName(phase)) break;  // the agent checks it; a damaged one is dropped
      q.event = PhaseChanged{gen, e.phase().rank(), phase};
      break;
    }
    case proto::AgentEvent::kFingerprint: {
      const auto& f = e.fingerprint();
      if (!contract::IsFingerprint(f.fingerprint())) break;
      q.event = FingerprintReported{gen, f.rank(), f.step(), f.fingerprint()};
      break;
    }
    case proto::AgentEvent::kPairTest: {
      const auto& t = e.pair_test();
      const std::optional<NodeId> peer =
          context.node_named ? context.node_named(t.peer_node()) : std::nullopt;
      if (!peer) break;
      q.event = PairTestResult{t.test(),
                               t.round(),
                               node,
                               *peer,
                               t.ok(),
                               std::isfinite(t.seconds()) ? t.seconds() : 0,
                               SanitizeUtf8(t.error().substr(0, 512))};
      break;
    }
    case proto::AgentEvent::kLogMatch:
      q.log_match = e.log_match();
      break;
    case proto::AgentEvent::kProgressUnmatched:
      q.progress_unmatched = e.progress_unmatched();
      break;
    case proto::AgentEvent::kWorkerExited: {
      const auto& x = e.worker_exited();
      WorkerExitEvent exit;
      exit.generation = Generation{gen};
      exit.rank = Rank{x.rank()};
      exit.node = node;
      exit.stopped = x.stopped();
      if (x.exited()) {
        exit.exit_code = x.exit_code();
      } else {
        exit.signal = x.signal();
      }
      q.event = exit;
      q.fingerprint = x.param_fingerprint();
      break;
    }
    case proto::AgentEvent::kStackDump:
      q.event = StackDumpEvent{gen, e.stack_dump().rank(), SanitizeUtf8(e.stack_dump().text())};
      break;
    case proto::AgentEvent::kFaultFired: {
      const auto& f = e.fault_fired();
      // Only the spec's faults are remembered: any other id would grow the
      // set of fired faults handed to every later generation.
      if (context.fault_ids == nullptr || !context.fault_ids->count(f.fault_id())) break;
      const std::optional<faults::FaultKind> kind = wire::FromWire(f.kind());
      if (!kind) break;
      // The worker's wall clock says when; map it onto the steady clock.
      const double ago = std::max(0.0, context.wall_now_s - e.time_s());
      q.event = FaultFiredEvent{gen,   f.rank(), f.fault_id(),
                                *kind, f.step(), context.now - FromSeconds(ago)};
      break;
    }
    case proto::AgentEvent::kStopped:
      q.event = GenerationStoppedEvent{gen, node};
      q.stopped = e.stopped();
      break;
    case proto::AgentEvent::kPersisted: {
      const auto& p = e.persisted();
      if (!p.error().empty()) {
        q.event = PersistFailedEvent{gen, p.shard(), p.step(), node, p.error()};
      } else {
        // Its ranges are the book's to check (it ignores a shard out of them).
        q.event = ShardPersisted{gen,
                                 node,
                                 StepNumber{p.step()},
                                 p.shard(),
                                 p.shards(),
                                 p.bytes(),
                                 std::strtoull(p.xxh3().c_str(), nullptr, 16),
                                 p.t0_bytes(),
                                 p.t1_bytes()};
      }
      break;
    }
    case proto::AgentEvent::kHeartbeat:
      q.event = NodeHeartbeat{node};
      break;
    default:
      break;
  }
  return q;
}

bool MissedItsStart(int64_t resumed, int64_t current, JobPhase phase, bool member) {
  return member && phase == JobPhase::kRunning && resumed < current;
}

}  // namespace endure::core
