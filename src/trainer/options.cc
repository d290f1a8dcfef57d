// TrainerOptions validation.
#include "trainer/options.h"

namespace endure::trainer {
namespace {

Status Need(bool ok, const std::string& message) {
  return ok ? Status::Ok() : InvalidArgument(message);
}

}  // namespace

Status TrainerOptions::Validate(int world_size) const {
  ENDURE_RETURN_IF_ERROR(Need(model.layers >= 1, "--layers must be at least 1"));
  ENDURE_RETURN_IF_ERROR(Need(model.heads >= 1, "--heads must be at least 1"));
  ENDURE_RETURN_IF_ERROR(Need(model.d_model >= 1 && model.d_model % model.heads == 0,
                              "--d-model must be a positive multiple of --heads"));
  ENDURE_RETURN_IF_ERROR(Need(model.context >= 2, "--context must be at least 2"));
  ENDURE_RETURN_IF_ERROR(Need(steps >= 1, "--steps must be at least 1"));
  ENDURE_RETURN_IF_ERROR(Need(micro_batch >= 1, "--micro-batch must be at least 1"));
  ENDURE_RETURN_IF_ERROR(Need(global_batch >= 1, "--global-batch must be at least 1"));
  ENDURE_RETURN_IF_ERROR(
      Need(global_batch % micro_batch == 0, "--global-batch " + std::to_string(global_batch) +
                                                " must be a multiple of --micro-batch " +
                                                std::to_string(micro_batch)));
  ENDURE_RETURN_IF_ERROR(Need(
      Slots() >= world_size,
      "--global-batch " + std::to_string(global_batch) + " is " + std::to_string(Slots()) +
          " micro-batches of --micro-batch " + std::to_string(micro_batch) + ", fewer than the " +
          std::to_string(world_size) + " ranks (WORLD_SIZE): each rank needs at least one"));
  ENDURE_RETURN_IF_ERROR(Need(lr > 0, "--lr must be positive"));
  ENDURE_RETURN_IF_ERROR(
      Need(min_lr_ratio >= 0 && min_lr_ratio <= 1, "--min-lr-ratio must be in [0, 1]"));
  ENDURE_RETURN_IF_ERROR(Need(warmup_steps >= 0, "--warmup-steps must not be negative"));
  ENDURE_RETURN_IF_ERROR(Need(grad_clip >= 0, "--grad-clip must not be negative"));
  ENDURE_RETURN_IF_ERROR(
      Need(val_fraction > 0 && val_fraction < 0.5, "--val-fraction must be in (0, 0.5)"));
  ENDURE_RETURN_IF_ERROR(Need(ckpt_every >= 0, "--ckpt-every must not be negative"));
  ENDURE_RETURN_IF_ERROR(Need(ckpt_keep >= 1, "--ckpt-keep must be at least 1"));
  ENDURE_RETURN_IF_ERROR(Need(ckpt_every == 0 || !ckpt_dir.empty(),
                              "--ckpt-every needs --ckpt-dir (where to write checkpoints)"));
  ENDURE_RETURN_IF_ERROR(Need(!resume || !ckpt_dir.empty(),
                              "--resume needs --ckpt-dir (where to look for checkpoints)"));
  ENDURE_RETURN_IF_ERROR(Need(log_every >= 1, "--log-every must be at least 1"));
  ENDURE_RETURN_IF_ERROR(Need(eval_batches >= 0, "--eval-batches must not be negative"));
  ENDURE_RETURN_IF_ERROR(Need(eval_every >= 0, "--eval-every must not be negative"));
  ENDURE_RETURN_IF_ERROR(Need(eval_steps >= 0, "--eval-steps must not be negative"));
  ENDURE_RETURN_IF_ERROR(Need(eval_every == 0 || eval_steps >= 1,
                              "--eval-every needs --eval-steps K >= 1 (forward passes per "
                              "evaluation)"));
  ENDURE_RETURN_IF_ERROR(Need(eval_steps == 0 || eval_every >= 1,
                              "--eval-steps needs --eval-every N >= 1 (steps between "
                              "evaluations)"));
  ENDURE_RETURN_IF_ERROR(Need(sample_tokens >= 0, "--sample-tokens must not be negative"));
  ENDURE_RETURN_IF_ERROR(Need(threads >= 0, "--threads must not be negative"));
  ENDURE_RETURN_IF_ERROR(Need(bucket_mb > 0, "--bucket-mb must be positive"));
  ENDURE_RETURN_IF_ERROR(
      Need(collective_timeout_s >= 1, "--collective-timeout must be at least 1 second"));
  return Status::Ok();
}

}  // namespace endure::trainer
