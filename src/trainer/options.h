// TrainerOptions: every knob of the reference trainer, with the defaults that
// Endure is benchmarked with, and Validate() that turns a bad combination into
// a message saying which flag to change. No libtorch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace endure::trainer {

struct ModelConfig {
  int layers = 4;
  int d_model = 128;
  int heads = 4;
  int context = 128;
  int vocab = 256;  // byte-level tokens

  bool operator==(const ModelConfig&) const = default;
};

struct TrainerOptions {
  ModelConfig model;
  std::vector<std::string> data = {"/usr/share/games/fortunes"};
  double val_fraction = 0.05;

  int64_t steps = 200;
  int global_batch = 32;  // sequences per optimizer step, whatever the world size
  int micro_batch = 16;   // sequences per forward/backward on one rank
  double lr = 2e-3;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  int64_t warmup_steps = 20;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  uint64_t seed = 1234;

  std::string ckpt_dir;  // empty: no checkpoints
  int64_t ckpt_every = 0;
  int ckpt_keep = 3;
  bool resume = false;

  int64_t log_every = 10;
  std::string metrics_file;
  int eval_batches = 8;
  // Every eval_every-th step (0: never), eval_steps forward passes on held-
  // out batches in the client phase "eval", without touching the parameters
  // or the training data order.
  int64_t eval_every = 0;
  int eval_steps = 0;
  // Test devices for data anomalies, both deterministic, so that every replay
  // of the step sees them again: the batch of step corrupt_batch_step (1-based;
  // 0: none) is seeded random bytes, as from a corrupt shard of the corpus;
  // the loss of step nan_batch_step is NaN, as from a batch that overflows.
  int64_t corrupt_batch_step = 0;
  int64_t nan_batch_step = 0;
  // Test device for a full disk: from the checkpoint of step disk_full_step
  // (1-based; 0: none) on, every write of this program's own checkpoints
  // fails with ENOSPC, in every run of it, as on a file system that stays full.
  int64_t disk_full_step = 0;
  int sample_tokens = 200;
  std::string sample_prompt = "The ";

  int threads = 0;         // intra-op threads per rank; 0: cores / local world size
  double bucket_mb = 1.0;  // gradient allreduce bucket size
  int collective_timeout_s = 300;

  // Checks ranges and the batch arithmetic for `world_size` ranks.
  Status Validate(int world_size) const;
  // The micro-batches (slots) of a step's global batch, whatever the world
  // size: each rank runs its share of them (gradient accumulation; a world
  // that does not divide them gives some ranks one more: exact_sum.h).
  int Slots() const { return global_batch / micro_batch; }
};

}  // namespace endure::trainer
