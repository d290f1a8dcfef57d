// endure_simtest: runs the deterministic cluster simulation (sim/cluster_sim.h)
// over many seeds and prints the first that breaks an invariant, with the
// command that reproduces it.
//
//   endure_simtest [--seeds N] [--first S] [--seed S --trace] [--bug NAME]
//                  [--nodes N] [--ranks R] [--spares S] [--faults F] [--steps T]
//                  [--no-in-process]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "sim/cluster_sim.h"

namespace {

int Usage(const char* why) {
  std::fprintf(stderr,
               "endure_simtest: %s\n"
               "usage: endure_simtest [--seeds N] [--first S] [--seed S [--trace]]\n"
               "                      [--bug none|retention|restore] [--nodes N] [--ranks R]\n"
               "                      [--spares S] [--faults F] [--steps T] [--no-in-process]\n",
               why);
  return 2;
}

bool ParseCount(const char* text, uint64_t* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (*end != '\0' || text[0] == '-') return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using endure::sim::ClusterSimOptions;
  using endure::sim::PlantedBug;
  uint64_t seeds = 200, first = 1;
  bool one = false, trace = false;
  ClusterSimOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--seeds" || a == "--first" || a == "--seed") {
      uint64_t n = 0;
      if (!ParseCount(v, &n)) return Usage((a + " takes a non-negative integer").c_str());
      ++i;
      if (a == "--seeds") seeds = n;
      if (a == "--first") first = n;
      if (a == "--seed") first = n, seeds = 1, one = true;
    } else if (a == "--nodes" || a == "--ranks" || a == "--spares" || a == "--faults" ||
               a == "--steps") {
      uint64_t n = 0;
      if (!ParseCount(v, &n) || n > 100000) {
        return Usage((a + " takes an integer from 0 to 100000").c_str());
      }
      ++i;
      if (a == "--nodes") options.nodes = static_cast<int>(n);
      if (a == "--ranks") options.ranks_per_node = static_cast<int>(n);
      if (a == "--spares") options.spares = static_cast<int>(n);
      if (a == "--faults") options.max_faults = static_cast<int>(n);
      if (a == "--steps") options.total_steps = static_cast<int64_t>(n);
    } else if (a == "--no-in-process") {
      options.in_process = false;
    } else if (a == "--trace") {
      trace = true;
    } else if (a == "--bug") {
      const std::string b = v ? v : "";
      ++i;
      if (b == "none")
        options.bug = PlantedBug::kNone;
      else if (b == "retention")
        options.bug = PlantedBug::kRetentionDropsNewest;
      else if (b == "restore")
        options.bug = PlantedBug::kRestoreSkipsAStep;
      else
        return Usage("--bug takes none, retention or restore");
    } else {
      return Usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (options.nodes < 1 || options.ranks_per_node < 1 || options.total_steps < 2) {
    return Usage("--nodes and --ranks must be at least 1, --steps at least 2");
  }
  int64_t faults = 0, restarts = 0;
  for (uint64_t seed = first; seed < first + seeds; ++seed) {
    const endure::sim::ClusterSimResult r = endure::sim::RunClusterSim(seed, options);
    faults += r.faults;
    restarts += r.controller_restarts;
    if (trace) {
      for (const std::string& line : r.trace) std::printf("%s\n", line.c_str());
    }
    if (!r.violation.empty()) {
      std::printf(
          "seed %llu breaks an invariant: %s\nreproduce: endure_simtest --seed %llu --trace\n",
          static_cast<unsigned long long>(seed), r.violation.c_str(),
          static_cast<unsigned long long>(seed));
      return 1;
    }
    if (one) {
      std::printf(
          "seed %llu: every invariant held (%lld inputs, %d faults, %d generations, "
          "ETTR %.3f)\n",
          static_cast<unsigned long long>(seed), static_cast<long long>(r.inputs), r.faults,
          r.generations, r.ettr);
    }
  }
  std::printf(
      "%llu seeds from %llu: every invariant held (%lld faults, %lld controller "
      "restarts)\n",
      static_cast<unsigned long long>(seeds), static_cast<unsigned long long>(first),
      static_cast<long long>(faults), static_cast<long long>(restarts));
  return 0;
}
