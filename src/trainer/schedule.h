// The learning-rate schedule: linear warm-up to `lr`, then cosine decay to
// lr * min_lr_ratio at the last step. A pure function of the step.
#pragma once

#include <cstdint>

#include "trainer/options.h"

namespace endure::trainer {

double LearningRate(const TrainerOptions& options, int64_t step);

}  // namespace endure::trainer
