// Corpus: byte-level training data from text files, and the deterministic
// batch plan. The batch of global step s is a pure function of (seed, s):
// sequence i of the global batch starts at an offset drawn from a counter-
// based generator keyed by (seed, s, i), so any world size sees the same
// global batch and rank r of W takes sequences [r*B/W, (r+1)*B/W).
// No libtorch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace endure::trainer {

struct Corpus {
  std::string train;
  std::string val;
  int files = 0;
};

// Reads every text file under `paths` (directories are walked recursively,
// symlinks to files already read are skipped, binary files — a NUL byte in
// their first 4 KiB, such as fortune's .dat indexes — are skipped), in sorted
// path order. Every 1/val_fraction-th 4 KiB block goes to validation.
// kInvalidArgument when a path is missing or no usable text is found, with
// the path in the message.
Result<Corpus> LoadCorpus(const std::vector<std::string>& paths, double val_fraction);

// A 64-bit mix of (seed, a, b) (splitmix64 rounds): the project's one
// counter-based random function for data order.
uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b);

// Start offsets into a text of `text_size` bytes for the sequences
// [first, first + count) of step `step`, each of `context + 1` bytes (inputs
// plus the next-token targets).
std::vector<int64_t> SequenceOffsets(uint64_t seed, int64_t step, int first, int count, int context,
                                     size_t text_size);

}  // namespace endure::trainer
