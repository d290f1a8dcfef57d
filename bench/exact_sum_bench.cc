// The CPU cost of the exact, world-size-independent gradient sums
// (trainer/exact_sum.h) per element and per step of the demo model: the
// MAX pass, the fixed-point accumulation of each slot, and the conversion
// back. (The allreduce itself moves int64: twice the bytes of float.)
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "trainer/exact_sum.h"

int main() {
  using endure::trainer::AccumulateFixed;
  using endure::trainer::FixedPointExponent;
  using endure::trainer::FromFixed;
  using endure::trainer::MaxAbs;
  constexpr size_t kN = 4'000'000;
  constexpr int kRounds = 10;
  std::vector<float> grad(kN), out(kN);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 1e-3f);
  for (float& g : grad) g = normal(rng);
  std::vector<int64_t> acc(kN, 0);
  using Clock = std::chrono::steady_clock;
  auto per_element_ns = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::nano>(b - a).count() / (double(kRounds) * kN);
  };
  float max_abs = 0;
  const auto t0 = Clock::now();
  for (int r = 0; r < kRounds; ++r) max_abs = MaxAbs(grad.data(), kN, 0);
  const auto t1 = Clock::now();
  const int exponent = FixedPointExponent(max_abs, 2);
  for (int r = 0; r < kRounds; ++r) AccumulateFixed(grad.data(), kN, exponent, acc.data());
  const auto t2 = Clock::now();
  for (int r = 0; r < kRounds; ++r) FromFixed(acc.data(), kN, exponent, out.data());
  const auto t3 = Clock::now();
  const double max_ns = per_element_ns(t0, t1), acc_ns = per_element_ns(t1, t2),
               back_ns = per_element_ns(t2, t3);
  std::printf("per element: MaxAbs %.2f ns, AccumulateFixed %.2f ns, FromFixed %.2f ns\n", max_ns,
              acc_ns, back_ns);
  // The demo model (endure-train's defaults): about 0.87 M parameters; one
  // slot per rank at two ranks, both slots on the one rank of a shrunk job.
  constexpr double kDemoParams = 870000;
  for (int slots : {1, 2}) {
    const double ms = kDemoParams * (slots * (max_ns + acc_ns) + back_ns) / 1e6;
    std::printf("demo model, %d slot(s) on a rank: %.2f ms per step (checksum %g)\n", slots, ms,
                double(out[kN / 2]));
  }
  return 0;
}
