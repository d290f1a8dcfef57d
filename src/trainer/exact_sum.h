// Gradient sums that do not depend on the world size (elastic data
// parallelism: a job that shrinks to fewer ranks, or grows back, trains the
// same parameters bit for bit).
//
// The global batch is a fixed number of micro-batches, its slots; rank r of
// W computes the contiguous slots SlotsOfRank(r, W, slots). Float addition
// is not associative, so a sum of per-rank partial sums changes with the
// partition. Fixed point is: every slot's gradient is rounded once to a
// 64-bit integer at a scale 2^s shared by all ranks (from the largest
// magnitude of any slot, an exact MAX reduction), and integers add exactly
// in any order and grouping, so the ranks' partial sums and the allreduce's
// ring order cannot change the result. The scale leaves room for `slots`
// terms below 2^62 and keeps 61 bits below the largest magnitude: far more
// than a float's 24, so the sum is also more accurate than float addition.
#pragma once

#include <cstddef>
#include <cstdint>

namespace endure::trainer {

struct SlotRange {
  int first = 0;
  int count = 0;
};

// The slots of rank `rank` of `world`: [floor(r*V/W), floor((r+1)*V/W)).
// Every slot belongs to exactly one rank; counts differ by at most one.
// Requires 0 <= rank < world <= slots.
SlotRange SlotsOfRank(int rank, int world, int slots);

// max(running, |x[i]|); +infinity when any x[i] is not finite (a NaN must
// reach every rank's result, whatever the order of the comparisons).
float MaxAbs(const float* x, size_t n, float running);

// The exponent s for summing `terms` values of magnitude at most `max_abs`
// as round(x * 2^s) in int64 without overflow (0 when max_abs is 0).
// Requires a finite max_abs >= 0 and terms >= 1.
int FixedPointExponent(float max_abs, int terms);

// acc[i] += round-to-nearest-even(x[i] * 2^exponent).
void AccumulateFixed(const float* x, size_t n, int exponent, int64_t* acc);
// out[i] = acc[i] * 2^-exponent, rounded to float.
void FromFixed(const int64_t* acc, size_t n, int exponent, float* out);

}  // namespace endure::trainer
