// Warm-up plus cosine learning rate.
#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace endure::trainer {

double LearningRate(const TrainerOptions& options, int64_t step) {
  if (step < options.warmup_steps) {
    return options.lr * static_cast<double>(step + 1) / static_cast<double>(options.warmup_steps);
  }
  const double decay_steps =
      static_cast<double>(std::max<int64_t>(1, options.steps - options.warmup_steps));
  const double progress =
      std::min(1.0, static_cast<double>(step - options.warmup_steps) / decay_steps);
  const double min_lr = options.lr * options.min_lr_ratio;
  return min_lr + 0.5 * (options.lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace endure::trainer
