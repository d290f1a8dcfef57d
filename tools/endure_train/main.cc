// endure-train: the reference GPT trainer. `endure-train [flags]` trains
// (data-parallel when started with torchrun's variables); `endure-train
// sample` generates from a checkpoint. Started by an Endure agent, it reports
// to it through the client library (ENDURE_* variables, include/endure/
// client.h). Exit codes: 0 success, 2 usage or configuration error
// (including a malformed ENDURE_* variable), 1 failure.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "contract/worker_contract.h"
#include "endure/client.h"
#include "trainer/trainer.h"

namespace {

using endure::StatusCode;
using endure::trainer::SampleOptions;
using endure::trainer::TrainerOptions;

int ExitCodeFor(const endure::Status& st) {
  std::fprintf(stderr, "endure-train: %s\n", st.message().c_str());
  return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  TrainerOptions o;
  CLI::App app{"endure-train: reference GPT trainer (libtorch + c10d Gloo)", "endure-train"};
  app.option_defaults()->always_capture_default();
  app.get_formatter()->column_width(34);
  app.add_option("--layers", o.model.layers, "Transformer blocks");
  app.add_option("--d-model", o.model.d_model, "Model width");
  app.add_option("--heads", o.model.heads, "Attention heads (must divide --d-model)");
  app.add_option("--context", o.model.context, "Context length in bytes");
  app.add_option("--data", o.data, "Text files or directories (recursed)");
  app.add_option("--val-fraction", o.val_fraction, "Share of the corpus held out for validation");
  app.add_option("--steps", o.steps, "Optimizer steps in total");
  app.add_option("--global-batch", o.global_batch, "Sequences per step, whatever the world size");
  app.add_option("--micro-batch", o.micro_batch, "Sequences per forward/backward on one rank");
  app.add_option("--lr", o.lr, "Peak learning rate (AdamW)");
  app.add_option("--min-lr-ratio", o.min_lr_ratio, "Cosine decays to lr x this");
  app.add_option("--warmup-steps", o.warmup_steps, "Linear warm-up steps");
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (matrices only)");
  app.add_option("--grad-clip", o.grad_clip, "Gradient norm clip (0: off)");
  app.add_option("--seed", o.seed, "Seed of initialisation and data order");
  app.add_option("--ckpt-dir", o.ckpt_dir, "Checkpoint directory (empty: none)");
  app.add_option("--ckpt-every", o.ckpt_every, "Checkpoint every N steps (0: only at the end)");
  app.add_option("--ckpt-keep", o.ckpt_keep, "Committed checkpoints to keep");
  app.add_flag("--resume", o.resume, "Resume from the newest checkpoint that verifies");
  app.add_option("--log-every", o.log_every, "Progress line every N steps");
  app.add_option("--metrics-file", o.metrics_file, "Append progress as JSON lines to this file");
  app.add_option("--eval-batches", o.eval_batches, "Validation micro-batches at the end");
  app.add_option("--eval-every", o.eval_every,
                 "Evaluate every N steps, in the client phase \"eval\" (0: never)");
  app.add_option("--eval-steps", o.eval_steps, "Forward passes on held-out batches per evaluation");
  app.add_option("--corrupt-batch-step", o.corrupt_batch_step,
                 "Test device: the batch of this step (1-based) is seeded random bytes, on every "
                 "replay of it (a corrupt shard of the data)");
  app.add_option("--nan-batch-step", o.nan_batch_step,
                 "Test device: the loss of this step (1-based) is NaN, on every replay of it");
  app.add_option("--disk-full-step", o.disk_full_step,
                 "Test device: from the checkpoint of this step (1-based) on, writing this "
                 "program's own checkpoints fails with ENOSPC, in every run (a full disk)");
  app.add_option("--sample-tokens", o.sample_tokens, "Bytes of text generated at the end");
  app.add_option("--sample-prompt", o.sample_prompt, "Prompt of the final sample");
  app.add_option("--threads", o.threads, "Threads per rank (0: OMP_NUM_THREADS, else 1)");
  app.add_option("--bucket-mb", o.bucket_mb, "Gradient allreduce bucket size in MiB");
  app.add_option("--collective-timeout", o.collective_timeout_s,
                 "Seconds before a blocked rendezvous or allreduce fails");

  SampleOptions s;
  CLI::App* sample = app.add_subcommand("sample", "Generate text from a checkpoint");
  sample->add_option("--ckpt-dir", s.ckpt_dir, "Checkpoint directory")->required();
  sample->add_option("--prompt", s.prompt, "Text to continue");
  sample->add_option("--tokens", s.tokens, "Bytes to generate")->check(CLI::NonNegativeNumber);
  sample->add_option("--temperature", s.temperature, "Sampling temperature")
      ->check(CLI::PositiveNumber);
  sample->add_option("--seed", s.seed, "Sampling seed");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "endure-train: %s (see endure-train --help)\n", e.what());
    return 2;
  }

  if (sample->parsed()) {
    endure::Result<std::string> text = endure::trainer::SampleFromCheckpoint(s);
    if (!text.ok()) return ExitCodeFor(text.status());
    std::printf("%s\n", text->c_str());
    return 0;
  }
  // A warm standby waits here, libtorch loaded and warmed up, for its rank
  // and rendezvous.
  if (const char* standby = std::getenv(endure::worker_env::kStandby); standby && *standby == '1') {
    endure::trainer::WarmUp(o);
  }
  endure::AwaitStandbyAssignment();
  endure::Result<endure::trainer::DistEnv> dist = endure::trainer::DistEnvFromEnvironment();
  if (!dist.ok()) return ExitCodeFor(dist.status());
  endure::Result<std::unique_ptr<endure::Session>> session = endure::Session::FromEnvironment();
  if (!session.ok()) return ExitCodeFor(session.status());
  // On a hang the agent asks for this thread's stack (the training loop's):
  // in milliseconds, where gdb takes seconds to attach to libtorch.
  if (endure::Status st = (*session)->DumpStacksOnSignal(SIGUSR2); !st.ok()) {
    std::fprintf(stderr, "endure-train: no stack dump on a hang (gdb instead): %s\n",
                 st.message().c_str());
  }
  endure::Result<endure::trainer::TrainSummary> summary =
      endure::trainer::Train(o, *dist, session->get());
  if ((*session)->dropped() > 0) {
    std::fprintf(stderr, "endure-train: %lld reports to the agent were dropped\n",
                 static_cast<long long>((*session)->dropped()));
  }
  if (!summary.ok()) return ExitCodeFor(summary.status());
  return 0;
}
