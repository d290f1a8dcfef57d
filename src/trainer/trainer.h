// The reference trainer's entry points, free of libtorch types so that mains
// and tests include them cheaply. Train() runs data-parallel training of the
// GPT over c10d Gloo when the torchrun environment names a world, or as one
// process without it. Every libtorch exception is caught inside and returned
// as a Status: kInvalidArgument for something the user must fix (exit code 2),
// anything else for a failure (exit code 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/options.h"

namespace endure {
class Session;  // include/endure/client.h
}

namespace endure::trainer {

// Where this process sits in the job, read from torchrun's variables.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT. Without WORLD_SIZE: a single process. A world without a
// master address, or a non-numeric value, is kInvalidArgument.
Result<DistEnv> DistEnvFromEnvironment();

struct TrainSummary {
  int64_t start_step = 0;  // > 0 when resumed
  int64_t steps = 0;
  double final_loss = 0;
  double val_loss = 0;
  std::string fingerprint;  // XXH3 over all parameters, 16 hex digits
  std::string sample;       // generated text (rank 0 only)
};

// Prepares this process for training with `options` without training: sets
// the memory and thread policy and runs one forward and backward pass of a
// throw-away model on a random micro-batch, so that the first real step does
// not pay for first-touch memory and BLAS set-up (here 1.08 s instead of
// 0.40 s), and reads the corpus, which Train then takes instead of reading
// it again. For warm standby workers; it leaves no trace in the results.
void WarmUp(const TrainerOptions& options);

// Trains as configured; progress and the summary go to stdout on rank 0.
// `session` (may be null: none) reports to the Endure agent and carries its
// instructions, which take precedence over `options`: ENDURE_CKPT_DIR and
// ENDURE_CKPT_EVERY replace --ckpt-dir and --ckpt-every; ENDURE_RESTORE_STEP
// replaces --resume (-1: newest checkpoint that verifies, 0: fresh start, N:
// newest that verifies at or before step N); ENDURE_SKIP_STEPS names steps
// whose data and update are skipped. Injected faults fire inside the steps.
Result<TrainSummary> Train(const TrainerOptions& options, const DistEnv& dist,
                           Session* session = nullptr);

struct SampleOptions {
  std::string ckpt_dir;
  std::string prompt = "\n";
  int tokens = 200;
  double temperature = 0.8;
  uint64_t seed = 1234;
};

// Generates text from the newest checkpoint in `options.ckpt_dir` that verifies.
Result<std::string> SampleFromCheckpoint(const SampleOptions& options);

}  // namespace endure::trainer
