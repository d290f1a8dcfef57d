// The controller's decision core under a large job's steady load (issue 24):
// core::JobMachine at N nodes x 8 ranks, every rank reporting every step
// (1 s steps), every node heartbeating every second, a tick every second,
// and NextDeadline() asked after every input as the controller's loop asks
// it. Prints the CPU time of the start-up (every node's registration and
// every rank's ready, with a NextDeadline after each), per input of each
// kind and per NextDeadline call, and what one simulated second of the job
// costs the core.
//
// Then, at each size, the machine's snapshot as the controller takes it
// (JobMachine::Snapshot: its size and CPU time), its restore
// (FromSnapshot), the replay of one journaled input (DecodeEvent and Step,
// of the steady load's mix) and what a restart costs at most: the restore
// and the replay of the journal the snapshot rule lets accumulate (as
// large as the snapshot, at least ControllerOptions::snapshot_after_bytes),
// however long the job has run.
//
// Last, a simulated day of each size: 1,440 steps of 60 s, each node
// reporting its ranks' steps and compute times together (NodeStepsEnd, its
// heartbeat too),
// rank 0 a copy in node memory every 10 steps, and the incidents a day brings
// at Llama 3's rate (419 unexpected interruptions in 54 days on 16,384
// GPUs: 47 a day at 100,000 GPUs), each a rank's exit at an even spacing,
// the stop and the next generation from the newest copy. What the day adds
// to the snapshot, and what a restart after it costs at most.
//
//   job_machine_bench [SECONDS_PER_SIZE]   (default 3: the budget of CPU per size)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "controller/controller.h"
#include "core/job_codec.h"
#include "core/job_machine.h"

namespace {

using endure::core::At;
using endure::core::JobMachine;
using endure::core::NodeId;
using endure::core::TimePoint;
using Clock = std::chrono::steady_clock;

struct Cost {
  double seconds = 0;
  int64_t calls = 0;
  double Micros() const { return calls ? 1e6 * seconds / static_cast<double>(calls) : 0; }
};

struct Figures {
  Cost step_end, phase, heartbeat, tick, next_deadline;
  Cost startup;  // every registration and every rank's ready: one call
  int64_t steps = 0;
  size_t incidents = 0;
  // The snapshot at the end, its restore, and the replay of the last
  // step's inputs as the journal holds them.
  Cost snapshot, restore, replay;
  size_t snapshot_bytes = 0;
  double journal_bytes_per_input = 0;
};

// The job every run here simulates: N nodes x R ranks, no pairwise test.
endure::core::JobMachineOptions BenchOptions(int nodes, int ranks_per_node) {
  endure::core::JobMachineOptions o;
  o.nodes = nodes;
  o.ranks_per_node = ranks_per_node;
  o.isolation.pairwise_test = false;
  return o;
}

TimePoint AtSeconds(double s) {
  return At(std::chrono::duration_cast<endure::Duration>(std::chrono::duration<double>(s)));
}

template <typename F>
void Time(Cost& cost, F&& f) {
  const auto t0 = Clock::now();
  f();
  cost.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  ++cost.calls;
}

// `phases`: every rank also enters the phase "checkpoint" and goes back to
// "train" before each step's end, as endure-train does around a save.
Figures Run(int nodes, int ranks_per_node, bool phases, double budget_s) {
  Figures f;
  // The last whole step's inputs, and the machine before them.
  std::vector<std::pair<endure::core::JobEvent, TimePoint>> last_step, this_step;
  auto record = [&](const endure::core::JobEvent& e, TimePoint at) {
    if (!phases) this_step.emplace_back(e, at);
  };
  JobMachine m(BenchOptions(nodes, ranks_per_node), {}, At(std::chrono::seconds(0)));
  double now_s = 0;
  auto now = [&] { return AtSeconds(now_s); };
  auto next = [&] { Time(f.next_deadline, [&] { m.NextDeadline(); }); };
  const int world = nodes * ranks_per_node;
  Time(f.startup, [&] {
    for (int n = 0; n < nodes; ++n) {
      m.Step(endure::core::NodeUp{NodeId{n}, "node" + std::to_string(n), ranks_per_node}, now());
      m.NextDeadline();
    }
    now_s += 1;
    for (int r = 0; r < world; ++r) {
      m.Step(endure::core::WorkerReady{m.generation(), r, 0, 0.1}, now());
      m.NextDeadline();
    }
  });
  const auto start = Clock::now();
  auto spent = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  std::optional<JobMachine> before_last_step, before_this_step;
  for (int64_t step = 1; spent() < budget_s; ++step) {
    if (!phases) {
      before_this_step = m;
      this_step.clear();
    }
    // One second: the ranks' reports of the step spread over it, each
    // node's heartbeat, then a tick. A size too slow for the budget stops
    // within a step (its figures are per input all the same).
    // Each rank's inputs of the step, in time order: with phases, it
    // enters "checkpoint" (a 2 ms copy), goes back to "train", and ends
    // its step 1 ms later; the ranks' reports spread over 0.4 s.
    struct Input {
      double at;
      int rank;
      int kind;  // 0 checkpoint, 1 train, 2 step end
    };
    std::vector<Input> inputs;
    for (int r = 0; r < world; ++r) {
      const double a = now_s + 0.4 * r / world;
      if (phases) {
        inputs.push_back({a, r, 0});
        inputs.push_back({a + 0.002, r, 1});
      }
      inputs.push_back({a + 0.003, r, 2});
    }
    std::stable_sort(inputs.begin(), inputs.end(),
                     [](const Input& x, const Input& y) { return x.at < y.at; });
    for (const Input& in : inputs) {
      if (spent() > budget_s) break;
      const TimePoint at = AtSeconds(in.at);
      if (in.kind < 2) {
        const char* phase = in.kind == 0 ? "checkpoint" : "train";
        Time(f.phase, [&] {
          m.Step(endure::core::PhaseChanged{m.generation(), in.rank, phase}, at);
        });
      } else {
        endure::core::StepEnd e{m.generation(), in.rank, step, 2.0, 0, -1};
        e.compute_s = 0.9;
        record(e, at);
        Time(f.step_end, [&] { m.Step(e, at); });
      }
      next();
    }
    if (spent() > budget_s) break;
    now_s += 0.5;
    for (int n = 0; n < nodes; ++n) {
      record(endure::core::NodeHeartbeat{NodeId{n}}, now());
      Time(f.heartbeat, [&] { m.Step(endure::core::NodeHeartbeat{NodeId{n}}, now()); });
      next();
    }
    now_s += 0.5;
    record(endure::core::Tick{}, now());
    Time(f.tick, [&] { m.Step(endure::core::Tick{}, now()); });
    next();
    f.steps = step;
    f.incidents = m.incidents().size();
    if (!phases) {
      before_last_step = std::move(before_this_step);
      last_step = std::move(this_step);
    }
  }
  if (phases || !before_last_step) return f;
  // The controller's snapshot of the machine before the last step, its
  // restore on another clock, and the last step's inputs replayed into it.
  std::string snapshot;
  Time(f.snapshot, [&] { snapshot = before_last_step->Snapshot(); });
  f.snapshot_bytes = snapshot.size();
  std::optional<JobMachine> restored;
  Time(f.restore, [&] {
    endure::Result<JobMachine> r = JobMachine::FromSnapshot(snapshot, At(std::chrono::hours(1)));
    if (r.ok()) restored.emplace(std::move(*r));
  });
  if (!restored) {
    std::fprintf(stderr, "job_machine_bench: the snapshot did not restore\n");
    std::exit(1);
  }
  double bytes = 0;
  for (const auto& [event, at] : last_step) {
    const std::string line = endure::core::EncodeEvent(event);
    bytes += static_cast<double>(line.size());
    Time(f.replay, [&, at = at] {
      endure::Result<endure::core::JobEvent> e = endure::core::DecodeEvent(line);
      restored->Step(*e, at + std::chrono::hours(1));
    });
  }
  f.journal_bytes_per_input = last_step.empty() ? 0 : bytes / static_cast<double>(last_step.size());
  return f;
}

// Incidents a day at Llama 3's rate, for `gpus` GPUs (at least one).
int IncidentsPerDay(int gpus) {
  return std::max(1, static_cast<int>(std::ceil(419.0 / 54.0 / 16384.0 * gpus)));
}

struct DayFigures {
  int incidents = 0;
  int64_t steps = 0;                         // the job's step at the day's end
  size_t before_bytes = 0, after_bytes = 0;  // snapshot after 30 steps, after the day
  Cost restore;                              // of the snapshot after the day
};

// A job of `nodes` x `ranks_per_node` through a day's incidents (see the
// top): agents answer every stop and start at once.
DayFigures Day(int nodes, int ranks_per_node) {
  DayFigures f;
  JobMachine m(BenchOptions(nodes, ranks_per_node), {}, At(std::chrono::seconds(0)));
  double now_s = 0;
  int64_t step = 0;
  auto now = [&] { return AtSeconds(now_s); };
  const int world = nodes * ranks_per_node;
  // Carries out what the machine asks of the agents: a stop ends at once on
  // every member, a start is every rank ready from the step it restores.
  auto act = [&](std::vector<endure::core::JobAction> actions) {
    while (!actions.empty()) {
      std::vector<endure::core::JobAction> next;
      for (const endure::core::JobAction& a : actions) {
        auto more = [&](std::vector<endure::core::JobAction> v) {
          next.insert(next.end(), v.begin(), v.end());
        };
        if (const auto* stop = std::get_if<endure::core::StopGenerationAction>(&a)) {
          for (NodeId n : m.members()) {
            more(m.Step(endure::core::GenerationStoppedEvent{stop->generation, n}, now()));
          }
        } else if (const auto* start = std::get_if<endure::core::StartGenerationAction>(&a)) {
          // -1: the newest copy (none: from the start).
          const endure::core::StepNumber from =
              start->restore_step.value >= 0 ? start->restore_step : m.checkpoints().Newest();
          step = std::max<int64_t>(from.value, 0);
          for (int r = 0; r < world; ++r) {
            more(m.Step(endure::core::WorkerReady{start->generation, r, step, 0.1}, now()));
          }
        }
      }
      actions = std::move(next);
    }
  };
  // One step of 60 s: every node's report of its ranks' steps (each rank
  // 0's with a copy every 10 steps), then a tick. A job that is not running
  // (stopping, waiting out a backoff) only ticks.
  constexpr double kStepS = 60;
  auto train = [&] {
    now_s += kStepS;
    if (m.phase() == endure::core::JobPhase::kRunning) {
      ++step;
      for (int n = 0; n < nodes; ++n) {
        endure::core::NodeStepsEnd report{NodeId{n}, m.generation(), {}};
        for (int l = 0; l < ranks_per_node; ++l) {
          const int r = n * ranks_per_node + l;
          const int64_t copy = r == 0 && step % 10 == 0 ? step : -1;
          endure::core::StepEnd e{m.generation(), r, step, 2.0, 0, copy};
          e.compute_s = 50;  // of the 60 s: the straggler detector's windows fill
          report.steps.push_back(e);
        }
        act(m.Step(report, now()));
      }
    }
    act(m.Step(endure::core::Tick{}, now()));
  };
  for (int n = 0; n < nodes; ++n) {
    act(m.Step(endure::core::NodeUp{NodeId{n}, "node" + std::to_string(n), ranks_per_node}, now()));
  }
  constexpr int kSteps = 24 * 60;  // a day of 60 s steps
  const int incidents = IncidentsPerDay(world);
  std::mt19937_64 pick(nodes);
  for (int i = 1; i <= kSteps; ++i) {
    train();
    if (i == 30) f.before_bytes = m.Snapshot().size();
    // The incidents at an even spacing, each a rank's exit while it runs.
    if (i % (kSteps / (incidents + 1)) == 0 && m.phase() == endure::core::JobPhase::kRunning &&
        static_cast<int>(m.incidents().size()) < incidents) {
      const endure::core::Rank rank{static_cast<int32_t>(pick() % static_cast<uint64_t>(world))};
      act(m.Step(
          endure::core::WorkerExitEvent{m.generation(), rank, m.NodeOfRank(rank), 1, std::nullopt},
          now()));
    }
  }
  f.incidents = static_cast<int>(m.incidents().size());
  f.steps = m.step().value;
  const std::string snapshot = m.Snapshot();
  f.after_bytes = snapshot.size();
  Time(f.restore, [&] {
    if (!JobMachine::FromSnapshot(snapshot, At(std::chrono::hours(1))).ok()) {
      std::fprintf(stderr, "job_machine_bench: the day's snapshot did not restore\n");
      std::exit(1);
    }
  });
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const double budget = argc > 1 ? std::atof(argv[1]) : 3.0;
  std::vector<std::pair<int, Figures>> snapshots;
  for (bool phases : {false, true}) {
    std::printf(
        "JobMachine::Step under a steady job: CPU per input (us), 1 s steps, 8 ranks per "
        "node%s\n",
        phases ? ", each rank in phase \"checkpoint\" and back before each step's end" : "");
    std::printf("%7s %8s %9s %6s %10s %10s %10s %10s %13s %14s %9s\n", "nodes", "ranks", "start_ms",
                "steps", "step_end", "phase", "heartbeat", "tick", "next_deadline", "core_per_s_ms",
                "incidents");
    for (int nodes : {128, 1024, 4096, 12500}) {
      const Figures f = Run(nodes, 8, phases, budget);
      const int world = nodes * 8;
      const int phase_inputs = phases ? 2 * world : 0;
      // One second of the job: every rank's report (and phases), every
      // node's heartbeat, a tick, and a NextDeadline after each.
      const double per_s_ms = (world * f.step_end.Micros() + phase_inputs * f.phase.Micros() +
                               nodes * f.heartbeat.Micros() + f.tick.Micros() +
                               (world + phase_inputs + nodes + 1) * f.next_deadline.Micros()) /
                              1000;
      std::printf("%7d %8d %9.1f %6lld %10.2f %10.2f %10.2f %10.2f %13.2f %14.1f %9zu\n", nodes,
                  world, 1000 * f.startup.seconds, static_cast<long long>(f.steps),
                  f.step_end.Micros(), f.phase.Micros(), f.heartbeat.Micros(), f.tick.Micros(),
                  f.next_deadline.Micros(), per_s_ms, f.incidents);
      std::fflush(stdout);
      if (!phases) snapshots.push_back({nodes, f});
    }
  }
  // What a restart costs at most, however long the job ran: the restore,
  // and the replay of as much journal as the snapshot rule lets build up.
  const double after_bytes =
      static_cast<double>(endure::controller::ControllerOptions{}.snapshot_after_bytes);
  std::printf(
      "\nThe controller's snapshot of JobMachine (the steady job above) and a restart from it\n");
  std::printf("%7s %8s %12s %12s %11s %11s %12s %14s %14s\n", "nodes", "ranks", "snapshot_mb",
              "snapshot_ms", "restore_ms", "replay_us", "bytes/input", "journal_max_mb",
              "restart_max_s");
  for (const auto& [nodes, f] : snapshots) {
    const double journal = std::max(after_bytes, static_cast<double>(f.snapshot_bytes));
    const double inputs = f.journal_bytes_per_input > 0 ? journal / f.journal_bytes_per_input : 0;
    const double restart_s = f.restore.seconds + inputs * f.replay.Micros() / 1e6;
    std::printf("%7d %8d %12.2f %12.1f %11.1f %11.2f %12.0f %14.2f %14.2f\n", nodes, nodes * 8,
                static_cast<double>(f.snapshot_bytes) / (1 << 20), 1000 * f.snapshot.seconds,
                1000 * f.restore.seconds, f.replay.Micros(), f.journal_bytes_per_input,
                journal / (1 << 20), restart_s);
  }
  std::printf(
      "\nA simulated day (60 s steps): its incidents at Llama 3's rate, each a rank's exit and a "
      "restart, and a restart after it\n");
  std::printf("%7s %8s %10s %7s %14s %12s %11s %14s\n", "nodes", "ranks", "incidents", "steps",
              "30_steps_mb", "day_mb", "restore_ms", "restart_max_s");
  for (const auto& [nodes, f] : snapshots) {
    const DayFigures d = Day(nodes, 8);
    const double journal = std::max(after_bytes, static_cast<double>(d.after_bytes));
    const double inputs = f.journal_bytes_per_input > 0 ? journal / f.journal_bytes_per_input : 0;
    std::printf("%7d %8d %10d %7lld %14.2f %12.2f %11.1f %14.2f\n", nodes, nodes * 8, d.incidents,
                static_cast<long long>(d.steps), static_cast<double>(d.before_bytes) / (1 << 20),
                static_cast<double>(d.after_bytes) / (1 << 20), 1000 * d.restore.seconds,
                d.restore.seconds + inputs * f.replay.Micros() / 1e6);
    std::fflush(stdout);
  }
  return 0;
}
