// The implicit-failure detectors of issue 12, printed as figures:
//  1. straggler detection latency in steps against the slowdown of one rank
//     (1.05x .. 3x), in worlds of 8 and 64 ranks whose compute times carry
//     natural jitter, with core::StragglerDetector at its default options and
//     at a lower threshold;
//  2. false positives per 10,000 clean steps, of the straggler detector at
//     both thresholds and of core::HangDetector at its defaults;
//  3. the SDC check's cost: endure::Fingerprint over parameter sets of 1 MiB
//     to 512 MiB, amortized over sdc_check_every steps, and the bytes of the
//     "fingerprint" datagram.
// Everything but part 3's timings is simulated with a fixed seed per run, so
// the figures reproduce exactly.
//
//   build/bin/implicit_bench
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/hang_detector.h"
#include "core/ids.h"
#include "core/straggler.h"
#include "endure/client.h"

namespace {

using namespace endure;
using Clock = std::chrono::steady_clock;

// The natural jitter of a rank's compute time in a step: lognormal with
// sigma 5%, and a 2% chance of a 2x spike (a page fault, a collection).
// Each rank and step draws independently.
constexpr double kSigma = 0.05;
constexpr double kSpikeChance = 0.02;
constexpr double kSpikeFactor = 2.0;
// Compute per step without jitter: well above min_compute_s (5 ms).
constexpr double kBaseComputeS = 1.0;

constexpr int kRuns = 50;               // seeded runs per detection row
constexpr int64_t kWarmupSteps = 40;    // clean steps before the onset (2 x window)
constexpr int64_t kHorizonSteps = 500;  // slow steps watched after the onset
constexpr int64_t kCleanSteps = 10'000;
constexpr int kCleanRuns = 20;

// mt19937_64 is specified bit for bit by the standard, std::*_distribution
// are not: drawing normals here keeps the figures equal on every library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}

  double Uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }

  // Box-Muller; both values of a pair are used.
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = Uniform();
    while (u1 <= 0) u1 = Uniform();
    const double a = 2 * std::numbers::pi * Uniform();
    const double r = std::sqrt(-2 * std::log(u1));
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  std::mt19937_64 gen_;
  double spare_ = 0;
  bool has_spare_ = false;
};

double JitteredCompute(Rng& rng, double base_s) {
  double t = base_s * std::exp(kSigma * rng.Normal());
  if (rng.Uniform() < kSpikeChance) t *= kSpikeFactor;
  return t;
}

uint64_t Seed(int world, int run) { return static_cast<uint64_t>(world) * 1000 + run; }

// ---- 1. Detection latency ----

struct DetectionRun {
  std::optional<int64_t> latency;  // slow steps up to and including the flag
  int false_flags = 0;             // other ranks, or the target before the onset
};

// One rank (run % world) computes `slowdown` x slower from step
// kWarmupSteps + 1 on, for kHorizonSteps steps.
DetectionRun RunDetection(int world, double theta, double slowdown, int run) {
  core::StragglerOptions options;
  options.theta = theta;
  core::StragglerDetector detector(options);
  detector.OnGenerationStart(world);
  Rng rng(Seed(world, run));
  const int target = run % world;
  const int64_t onset = kWarmupSteps + 1;
  DetectionRun out;
  for (int64_t step = 1; step < onset + kHorizonSteps; ++step) {
    bool target_flagged_early = false;
    for (int r = 0; r < world; ++r) {
      double compute_s = JitteredCompute(rng, kBaseComputeS);
      if (r == target && step >= onset) compute_s *= slowdown;
      for (const core::StragglerFlag& f :
           detector.OnStepCompute(core::Rank{r}, core::StepNumber{step}, compute_s)) {
        if (f.rank.value == target && step >= onset) {
          out.latency = step - onset + 1;
          return out;
        }
        ++out.false_flags;
        target_flagged_early = target_flagged_early || f.rank.value == target;
      }
    }
    // A rank is flagged once per generation: a false flag of the target
    // before the onset would hide the real one. A swap would start a new
    // generation too.
    if (target_flagged_early) detector.OnGenerationStart(world);
  }
  return out;
}

// Nearest-rank quantile over all runs, the undetected ones counting as
// later than any; nullopt when it falls on one of those.
std::optional<int64_t> Quantile(std::vector<int64_t> sorted_latencies, double q) {
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(kRuns))) - 1;
  if (i >= sorted_latencies.size()) return std::nullopt;
  return sorted_latencies[i];
}

std::string Steps(std::optional<int64_t> steps, bool any_detected) {
  if (!any_detected) return "not detected";
  if (!steps) return ">" + std::to_string(kHorizonSteps);
  return std::to_string(*steps);
}

void DetectionLatency() {
  std::printf(
      "== straggler detection latency: steps from the onset of one rank's slowdown to its flag\n"
      "   core::StragglerDetector, window 20, min_slow 12; compute 1 s x lognormal(sigma 5%%),\n"
      "   2%% chance of a 2x spike per rank and step; %lld clean steps, then %lld slow ones\n"
      "   watched; %d runs per row (seed world*1000+run, slow rank run %% world).\n"
      "   latency: slow steps judged up to and including the flagging one: min_slow, less the\n"
      "   steps the jitter had already made slow in the window at the onset. median and p95\n"
      "   are nearest-rank over all %d runs, an undetected run counting as later than any\n"
      "   (\">%lld\"). false_flags: flags of other ranks, or of the slow rank before the onset,\n"
      "   summed over the runs. A slowdown below 1 + theta is by design not flagged: the\n"
      "   jitter makes such a rank slow in some steps, only rarely in 12 of 20.\n",
      static_cast<long long>(kWarmupSteps), static_cast<long long>(kHorizonSteps), kRuns, kRuns,
      static_cast<long long>(kHorizonSteps));
  std::printf("%6s %6s %9s %9s %13s %13s %12s\n", "world", "theta", "slowdown", "detected",
              "median_steps", "p95_steps", "false_flags");
  for (double theta : {0.10, 0.03}) {
    for (int world : {8, 64}) {
      for (double slowdown : {1.05, 1.1, 1.5, 2.0, 3.0}) {
        std::vector<int64_t> latencies;
        int false_flags = 0;
        for (int run = 0; run < kRuns; ++run) {
          const DetectionRun r = RunDetection(world, theta, slowdown, run);
          if (r.latency) latencies.push_back(*r.latency);
          false_flags += r.false_flags;
        }
        std::sort(latencies.begin(), latencies.end());
        const bool any = !latencies.empty();
        const std::string detected = std::to_string(latencies.size()) + "/" + std::to_string(kRuns);
        std::printf("%6d %6.2f %9.2f %9s %13s %13s %12d\n", world, theta, slowdown,
                    detected.c_str(), Steps(Quantile(latencies, 0.5), any).c_str(),
                    Steps(Quantile(latencies, 0.95), any).c_str(), false_flags);
      }
    }
  }
  std::printf("\n");
}

// ---- 2. False positives ----

// Flags raised in a clean job of `steps` steps. After each, a new
// generation starts (as a swap would), so that every rank can be flagged
// again: a rank is flagged at most once per generation.
int64_t StragglerFalseFlags(int world, double theta, int run) {
  core::StragglerOptions options;
  options.theta = theta;
  core::StragglerDetector detector(options);
  detector.OnGenerationStart(world);
  Rng rng(Seed(world, run) + 500);
  int64_t flags = 0;
  for (int64_t step = 1; step <= kCleanSteps; ++step) {
    bool flagged = false;
    for (int r = 0; r < world; ++r) {
      const size_t n = detector
                           .OnStepCompute(core::Rank{r}, core::StepNumber{step},
                                          JitteredCompute(rng, kBaseComputeS))
                           .size();
      flags += static_cast<int64_t>(n);
      flagged = flagged || n > 0;
    }
    if (flagged) detector.OnGenerationStart(world);
  }
  return flags;
}

// Verdicts in a clean synchronous job: every rank ends a step when the
// slowest one's compute and a 50 ms allreduce are done (ranks report 10 us
// apart), after a 5 s start-up. Returns the verdicts; `timeout` gets the
// step timeout learned by the end.
int64_t HangFalseVerdicts(int world, double base_s, int run, Duration* timeout) {
  core::HangDetector detector{core::HangDetectorOptions{}};
  detector.OnGenerationStart(0, world, core::At(Duration(0)));
  Rng rng(Seed(world, run) + 700);
  int64_t verdicts = 0;
  double t = 5.0;
  for (int64_t step = 1; step <= kCleanSteps; ++step) {
    double slowest = 0;
    for (int r = 0; r < world; ++r) slowest = std::max(slowest, JitteredCompute(rng, base_s));
    t += slowest + 0.05;
    // Any deadline passed since the previous reports has passed by now.
    if (detector.Check(core::At(FromSeconds(t)))) ++verdicts;
    for (int r = 0; r < world; ++r) {
      const Status s =
          detector.OnStepEnd(r, core::StepNumber{step}, core::At(FromSeconds(t + r * 1e-5)));
      if (!s.ok()) {
        std::fprintf(stderr, "implicit_bench: HangDetector refused a step end\n");
        std::exit(1);
      }
    }
  }
  *timeout = detector.StepTimeout();
  return verdicts;
}

void FalsePositives() {
  std::printf(
      "== false positives per 10,000 clean steps (same jitter, no slow rank; %d runs of %lld\n"
      "   steps each, seed world*1000+run+500). A new generation starts after each flag.\n"
      "   per_10k_steps: flags of any rank of the job; per_10k_rank_steps: per rank. None in\n"
      "   %.0f steps bounds the rate below %.2f per 10,000 steps (95%%, rule of three).\n",
      kCleanRuns, static_cast<long long>(kCleanSteps),
      static_cast<double>(kCleanSteps) * kCleanRuns,
      3e4 / (static_cast<double>(kCleanSteps) * kCleanRuns));
  std::printf("%6s %6s %10s %8s %14s %19s\n", "world", "theta", "steps", "flags", "per_10k_steps",
              "per_10k_rank_steps");
  for (double theta : {0.10, 0.03}) {
    for (int world : {8, 64}) {
      int64_t flags = 0;
      for (int run = 0; run < kCleanRuns; ++run) flags += StragglerFalseFlags(world, theta, run);
      const double steps = static_cast<double>(kCleanSteps) * kCleanRuns;
      std::printf("%6d %6.2f %10.0f %8lld %14.2f %19.3f\n", world, theta, steps,
                  static_cast<long long>(flags), 1e4 * static_cast<double>(flags) / steps,
                  1e4 * static_cast<double>(flags) / (steps * world));
    }
  }
  std::printf(
      "\n   core::HangDetector, default options (floor 2 s, k 3, window 100): the job's step\n"
      "   is the slowest rank's compute (base x the same jitter) + 50 ms allreduce;\n"
      "   seed world*1000+run+700. timeout: the learned step timeout at the end (run 0).\n");
  std::printf("%6s %8s %10s %9s %14s %10s\n", "world", "base_s", "steps", "verdicts",
              "per_10k_steps", "timeout");
  for (double base_s : {1.0, 0.1}) {
    for (int world : {8, 64}) {
      int64_t verdicts = 0;
      Duration first_timeout{0};
      for (int run = 0; run < kCleanRuns; ++run) {
        Duration timeout{0};
        verdicts += HangFalseVerdicts(world, base_s, run, &timeout);
        if (run == 0) first_timeout = timeout;
      }
      const double steps = static_cast<double>(kCleanSteps) * kCleanRuns;
      std::printf("%6d %8.1f %10.0f %9lld %14.2f %10s\n", world, base_s, steps,
                  static_cast<long long>(verdicts), 1e4 * static_cast<double>(verdicts) / steps,
                  FormatDuration(first_timeout).c_str());
    }
  }
  std::printf("\n");
}

// ---- 3. The SDC check's cost ----

void SdcCost() {
  constexpr size_t kMiB = size_t{1} << 20;
  constexpr size_t kMaxBytes = 512 * kMiB;
  // Parameters as a model holds them: tensors of up to 4 MiB each.
  constexpr size_t kTensorBytes = 4 * kMiB;
  std::vector<float> params(kMaxBytes / sizeof(float));
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] = static_cast<float>(i % 4093) * 1e-3f - 2.0f;
  }

  std::printf(
      "== SDC check: endure::Fingerprint (XXH3-64 over names and bytes) of float32 parameters\n"
      "   in host memory, one thread, tensors of up to 4 MiB; median of the repetitions.\n"
      "   GB/s in 1e9 bytes; the cost per step amortized at sdc_check_every = 1, 10, 100 as a\n"
      "   percentage of a 1 s step.\n");
  std::printf("%8s %8s %5s %10s %8s %9s %9s %9s  %s\n", "size_MiB", "tensors", "reps", "median_ms",
              "GB/s", "every_1", "every_10", "every_100", "fingerprint");
  for (size_t mib : {1, 16, 128, 512}) {
    const size_t bytes = mib * kMiB;
    std::vector<TensorRef> tensors;
    for (size_t off = 0; off < bytes; off += kTensorBytes) {
      const size_t n = std::min(kTensorBytes, bytes - off);
      tensors.push_back({"model/blocks." + std::to_string(tensors.size()) + ".weight",
                         "float32",
                         {static_cast<int64_t>(n / sizeof(float))},
                         reinterpret_cast<const char*>(params.data()) + off,
                         n});
    }
    const int reps = static_cast<int>(std::clamp<size_t>(2048 / mib, 5, 50));
    std::string fingerprint = Fingerprint(tensors);  // warms the caches as a trainer's would be
    std::vector<double> seconds;
    for (int i = 0; i < reps; ++i) {
      const Clock::time_point start = Clock::now();
      const std::string fp = Fingerprint(tensors);
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      if (fp != fingerprint) {
        std::fprintf(stderr, "implicit_bench: Fingerprint is not deterministic\n");
        std::exit(1);
      }
    }
    std::sort(seconds.begin(), seconds.end());
    const double s = seconds[seconds.size() / 2];
    std::printf("%8zu %8zu %5d %10.3f %8.2f %8.3f%% %8.3f%% %8.4f%%  %s\n", mib, tensors.size(),
                reps, 1e3 * s, static_cast<double>(bytes) / s / 1e9, 100 * s, 100 * s / 10,
                100 * s / 100, fingerprint.c_str());
  }

  // The datagram as the client builds it (Session::ReportFingerprint): a
  // 32-hex-digit token, wall-clock seconds as a double.
  const nlohmann::json j = {{"type", "fingerprint"},
                            {"token", "0123456789abcdef0123456789abcdef"},
                            {"generation", 3},
                            {"rank", 63},
                            {"t", 1767225600.123456},
                            {"step", 120000},
                            {"fingerprint", "0123456789abcdef"}};
  const std::string line = j.dump();
  std::printf(
      "\n   the \"fingerprint\" datagram, per rank and check (a byte more or less with the\n"
      "   digits of generation, rank, step and t): %zu bytes\n   %s\n",
      line.size(), line.c_str());
}

}  // namespace

int main() {
  std::printf("implicit_bench: build/bin/implicit_bench\n\n");
  DetectionLatency();
  FalsePositives();
  SdcCost();
  return 0;
}
