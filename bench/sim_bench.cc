// Speed and memory of the cluster simulator. The target (issue 5): a job of
// 12,500 nodes x 8 GPUs (100,000 GPUs) for 30 days at 6.5 failures per 1000
// node-days simulates in under 2 s on one core, with memory proportional to
// nodes. Prints events per second, and the peak heap of one run at 10x and
// 100x the nodes, counted by replacing the global operator new.
//
//   build-sim/bin/sim_bench [runs]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "sim/scenario.h"
#include "sim/simulator.h"

namespace {

std::atomic<int64_t> live_bytes{0};
std::atomic<int64_t> peak_bytes{0};

void Track(int64_t delta) {
  int64_t now = live_bytes.fetch_add(delta) + delta;
  int64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

// Each block carries its size in a 16-byte header so that delete can count it.
void* operator new(size_t n) {
  auto* p = static_cast<size_t*>(std::malloc(n + 16));
  if (p == nullptr) throw std::bad_alloc();
  *p = n;
  Track(static_cast<int64_t>(n));
  return reinterpret_cast<char*>(p) + 16;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  auto* base = reinterpret_cast<size_t*>(static_cast<char*>(p) - 16);
  Track(-static_cast<int64_t>(*base));
  std::free(base);
}
void operator delete(void* p, size_t) noexcept { operator delete(p); }

namespace {

using endure::sim::SimConfig;

SimConfig Config(int64_t nodes, double failure_rate) {
  SimConfig c;
  c.nodes = nodes;
  c.gpus_per_node = 8;
  c.failure_rate = failure_rate;
  c.duration = std::chrono::hours(24 * 30);
  c.ckpt_interval = std::chrono::minutes(30);
  c.ckpt_write = std::chrono::seconds(10);
  c.restart = std::chrono::minutes(5);
  c.detect = std::chrono::seconds(30);
  c.seed = 1;
  endure::Status s = endure::sim::Finalize(c);
  if (!s.ok()) {
    std::fprintf(stderr, "sim_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::atoi(argv[1]) : 5;
  if (runs < 1) runs = 1;

  SimConfig c = Config(12500, 6.5);
  int64_t events = 0, failures = 0;
  double worst = 0;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    endure::sim::RunResult r = endure::sim::SimulateRun(c, endure::sim::RunSeed(c.seed, i));
    worst = std::max(worst,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    events += r.events;
    failures += r.failures;
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "sim_bench: 12500 nodes x 8 GPUs = 100000 GPUs, 30 days, 6.5 failures/1000 node-days\n");
  std::printf("  %d runs: %.1f failures and %.0f events per run\n", runs,
              static_cast<double>(failures) / runs, static_cast<double>(events) / runs);
  std::printf("  %.4f s per run (slowest %.4f s; target < 2 s): %s\n", total / runs, worst,
              worst < 2.0 ? "PASS" : "FAIL");
  std::printf("  %.3g events/s on one core\n", static_cast<double>(events) / total);

  // The failure rate shrinks as the nodes grow so that every size sees about
  // the same failures per day and only the per-node state differs.
  std::printf("  peak heap of one run, same failures per day (memory proportional to nodes):\n");
  for (int64_t nodes : {12500, 125000, 1250000}) {
    SimConfig big = Config(nodes, 6.5 * 12500.0 / static_cast<double>(nodes));
    int64_t before = live_bytes.load();
    peak_bytes.store(before);
    auto t0 = std::chrono::steady_clock::now();
    endure::sim::RunResult r = endure::sim::SimulateRun(big, 1);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t peak = peak_bytes.load() - before;
    std::printf("    %8lld nodes: %8.2f MB (%5.1f bytes/node), %7lld failures, %.3f s\n",
                static_cast<long long>(nodes), peak / 1e6, static_cast<double>(peak) / nodes,
                static_cast<long long>(r.failures), s);
  }
  return 0;
}
