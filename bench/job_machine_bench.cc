// The controller's decision core under a large job's steady load (issue 24):
// core::JobMachine at N nodes x 8 ranks, every rank reporting every step
// (1 s steps), every node heartbeating every second, a tick every second,
// and NextDeadline() asked after every input as the controller's loop asks
// it. Prints the CPU time per input of each kind and per NextDeadline call,
// and what one simulated second of the job costs the core.
//
//   job_machine_bench [SECONDS_PER_SIZE]   (default 3: the budget of CPU per size)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

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
  Cost step_end, heartbeat, tick, next_deadline;
  int64_t steps = 0;
  size_t incidents = 0;
};

template <typename F>
void Time(Cost& cost, F&& f) {
  const auto t0 = Clock::now();
  f();
  cost.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  ++cost.calls;
}

Figures Run(int nodes, int ranks_per_node, double budget_s) {
  Figures f;
  endure::core::JobMachineOptions o;
  o.nodes = nodes;
  o.ranks_per_node = ranks_per_node;
  o.isolation.pairwise_test = false;
  JobMachine m(o, {}, At(std::chrono::seconds(0)));
  double now_s = 0;
  auto now = [&] {
    return At(std::chrono::duration_cast<endure::Duration>(std::chrono::duration<double>(now_s)));
  };
  auto next = [&] { Time(f.next_deadline, [&] { m.NextDeadline(); }); };
  for (int n = 0; n < nodes; ++n) {
    m.Step(endure::core::NodeUp{NodeId{n}, "node" + std::to_string(n), ranks_per_node}, now());
  }
  const int world = nodes * ranks_per_node;
  now_s += 1;
  for (int r = 0; r < world; ++r) {
    m.Step(endure::core::WorkerReady{m.generation(), r, 0, 0.1}, now());
  }
  const auto start = Clock::now();
  auto spent = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  for (int64_t step = 1; spent() < budget_s; ++step) {
    // One second: the ranks' reports of the step spread over it, each
    // node's heartbeat, then a tick. A size too slow for the budget stops
    // within a step (its figures are per input all the same).
    for (int r = 0; r < world; ++r) {
      if (spent() > budget_s) return f;
      const double at = now_s + 0.5 * r / world;
      endure::core::StepEnd e{m.generation(), r, step, 2.0, 0, -1};
      e.compute_s = 0.9;
      Time(f.step_end, [&] {
        m.Step(e,
               At(std::chrono::duration_cast<endure::Duration>(std::chrono::duration<double>(at))));
      });
      next();
    }
    now_s += 0.5;
    for (int n = 0; n < nodes; ++n) {
      Time(f.heartbeat, [&] { m.Step(endure::core::NodeHeartbeat{NodeId{n}}, now()); });
      next();
    }
    now_s += 0.5;
    Time(f.tick, [&] { m.Step(endure::core::Tick{}, now()); });
    next();
    f.steps = step;
    f.incidents = m.incidents().size();
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const double budget = argc > 1 ? std::atof(argv[1]) : 3.0;
  std::printf(
      "JobMachine::Step under a steady job: CPU per input (us), 1 s steps, 8 ranks per node\n");
  std::printf("%7s %8s %6s %10s %10s %10s %13s %14s %9s\n", "nodes", "ranks", "steps", "step_end",
              "heartbeat", "tick", "next_deadline", "core_per_s_ms", "incidents");
  for (int nodes : {128, 1024, 4096, 12500}) {
    const Figures f = Run(nodes, 8, budget);
    const int world = nodes * 8;
    // One second of the job: every rank's report, every node's heartbeat, a
    // tick, and a NextDeadline after each.
    const double per_s_ms = (world * f.step_end.Micros() + nodes * f.heartbeat.Micros() +
                             f.tick.Micros() + (world + nodes + 1) * f.next_deadline.Micros()) /
                            1000;
    std::printf("%7d %8d %6lld %10.2f %10.2f %10.2f %13.2f %14.1f %9zu\n", nodes, world,
                static_cast<long long>(f.steps), f.step_end.Micros(), f.heartbeat.Micros(),
                f.tick.Micros(), f.next_deadline.Micros(), per_s_ms, f.incidents);
    std::fflush(stdout);
  }
  return 0;
}
