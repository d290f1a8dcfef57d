#include "trainer/exact_sum.h"

#include <cmath>
#include <limits>

#include "common/status.h"

namespace endure::trainer {

SlotRange SlotsOfRank(int rank, int world, int slots) {
  ENDURE_CHECK(world >= 1 && rank >= 0 && rank < world && slots >= world);
  const auto bound = [&](int r) { return static_cast<int>(int64_t{r} * slots / world); };
  return {bound(rank), bound(rank + 1) - bound(rank)};
}

float MaxAbs(const float* x, size_t n, float running) {
  float m = running;
  bool finite = std::isfinite(running);
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    finite &= std::isfinite(a);
    m = a > m ? a : m;
  }
  return finite ? m : std::numeric_limits<float>::infinity();
}

int FixedPointExponent(float max_abs, int terms) {
  ENDURE_CHECK(std::isfinite(max_abs) && max_abs >= 0 && terms >= 1);
  if (max_abs == 0) return 0;
  int e = 0;
  std::frexp(max_abs, &e);  // max_abs < 2^e
  int t = 0;                // terms <= 2^t
  while ((int64_t{1} << t) < terms) ++t;
  // Each rounded term is at most 2^(e+s), their sum at most 2^(e+s+t) = 2^61.
  return 61 - e - t;
}

void AccumulateFixed(const float* x, size_t n, int exponent, int64_t* acc) {
  // A power of two times a float is exact in a double (no float's exponent
  // and no exponent chosen above leaves the double's range), so llrint does
  // the only rounding.
  const double scale = std::ldexp(1.0, exponent);
  for (size_t i = 0; i < n; ++i) acc[i] += std::llrint(static_cast<double>(x[i]) * scale);
}

void FromFixed(const int64_t* acc, size_t n, int exponent, float* out) {
  const double scale = std::ldexp(1.0, -exponent);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(acc[i]) * scale);
}

}  // namespace endure::trainer
