// `endure run --nproc-per-node N [--nnodes M] script.py ARGS...`: a torchrun
// command line, without a job spec. LaunchSpec turns the flags into the
// TOML text of the job spec they stand for (parsed and checked as any spec
// is), so that the launcher and a spec file are one path, and a spec stays
// the way to say more.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace endure::cli {

struct LaunchFlags {
  std::string nproc_per_node = "1";  // N, or "cpu", "gpu", "auto" (as torchrun)
  std::string nnodes = "1";          // M, or MIN:MAX (elastic: down to MIN nodes)
  int max_restarts = -1;             // -1: Endure's default ([recovery] max_restarts, per window)
  std::string run_id;                // the job's name; empty: the script's
  std::string state_dir;             // empty: endure-NAME in the current directory
  bool module = false;               // -m: the script is a module (python -m)
  bool no_python = false;            // the script is a program, not Python
  // The script (or module, or program) and its arguments, as given.
  std::vector<std::string> command;
};

// What LaunchSpec needs to know of this machine.
struct LaunchHost {
  int cpus = 1;
  int gpus = 0;
  bool omp_num_threads_set = false;  // OMP_NUM_THREADS is in the environment
};

// The TOML text of the job: [job] name, command ("python3 -u SCRIPT ARGS",
// as torchrun runs it), nodes, ranks_per_node, min_nodes, state_dir, and
// OMP_NUM_THREADS = 1 for the workers when more than one runs per node and
// the environment does not set it (torchrun's default); [recovery]
// max_restarts when given. A flag that cannot be is an InvalidArgument that
// names it and says what it takes.
Result<std::string> LaunchSpec(const LaunchFlags& flags, const LaunchHost& host);

// This machine's CPUs and GPUs (/dev/nvidiaN), and whether OMP_NUM_THREADS
// is set.
LaunchHost ThisHost();

}  // namespace endure::cli
