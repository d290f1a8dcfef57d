// A torchrun command line as a job spec; see launch.h.
#include "tools/endure/launch.h"

#include <toml++/toml.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "controller/job_spec.h"

namespace endure::cli {
namespace {

// A whole number in [1, max], or nullopt.
std::optional<int> Count(std::string_view text, int max) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1 || value > max) {
    return std::nullopt;
  }
  return value;
}

// The job's name from the script's: "train_gpt.py" -> "train_gpt"; what
// a name may not hold ([A-Za-z0-9_.-]) becomes '_'.
std::string NameOf(const std::string& script) {
  std::string name = std::filesystem::path(script).stem().string();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') c = '_';
  }
  return name.empty() ? "job" : name;
}

}  // namespace

Result<std::string> LaunchSpec(const LaunchFlags& f, const LaunchHost& host) {
  if (f.command.empty()) {
    return InvalidArgument(
        "no script: endure run --nproc-per-node N script.py [ARGS...] (or endure run JOB.toml)");
  }
  const std::string& script = f.command.front();
  if (script.size() > 1 && script[0] == '-') {
    return InvalidArgument("unknown flag " + script +
                           " (endure run takes --nproc-per-node, --nnodes, --max-restarts, "
                           "--run-id, --state-dir, --standalone, -m, --no-python, --quiet before "
                           "the script; see endure run --help)");
  }
  if (f.module && f.no_python) return InvalidArgument("-m and --no-python: choose one");

  int per_node = 0;
  if (f.nproc_per_node == "cpu") {
    per_node = host.cpus;
  } else if (f.nproc_per_node == "gpu" || f.nproc_per_node == "auto") {
    per_node = host.gpus > 0 ? host.gpus : (f.nproc_per_node == "auto" ? host.cpus : 0);
    if (per_node == 0) {
      return InvalidArgument("--nproc-per-node gpu: this machine has no GPU (/dev/nvidiaN)");
    }
  } else if (std::optional<int> n = Count(f.nproc_per_node, controller::kMaxEmbeddedWorldSize)) {
    per_node = *n;
  } else {
    return InvalidArgument(
        "--nproc-per-node: '" + f.nproc_per_node + "' is not a number of processes (1.." +
        std::to_string(controller::kMaxEmbeddedWorldSize) + ") nor cpu, gpu or auto");
  }

  const std::string nodes_usage = "--nnodes: '" + f.nnodes +
                                  "' is not M nor MIN:MAX nodes (1 <= MIN <= MAX <= " +
                                  std::to_string(controller::kMaxEmbeddedNodes) + ")";
  int nodes = 0, min_nodes = 0;
  const size_t colon = f.nnodes.find(':');
  if (colon == std::string::npos) {
    std::optional<int> n = Count(f.nnodes, controller::kMaxEmbeddedNodes);
    if (!n) return InvalidArgument(nodes_usage);
    nodes = *n;
  } else {
    std::optional<int> lo =
        Count(std::string_view(f.nnodes).substr(0, colon), controller::kMaxEmbeddedNodes);
    std::optional<int> hi =
        Count(std::string_view(f.nnodes).substr(colon + 1), controller::kMaxEmbeddedNodes);
    if (!lo || !hi || *lo > *hi) return InvalidArgument(nodes_usage);
    nodes = *hi;
    min_nodes = *lo < *hi ? *lo : 0;
  }
  if (f.max_restarts == 0 || f.max_restarts < -1) {
    // torchrun's 0 is "never restart"; Endure's [recovery] max_restarts 0 is
    // "no limit", and restarting is what it is for.
    return InvalidArgument("--max-restarts: must be 1 or more, got " +
                           std::to_string(f.max_restarts) +
                           " (Endure recovers a failed job; a job spec's [recovery] says more)");
  }

  const std::string name = f.run_id.empty() ? NameOf(script) : f.run_id;
  toml::array command;
  if (!f.no_python) {
    // As torchrun runs it: the interpreter, unbuffered.
    command.push_back("python3");
    command.push_back("-u");
    if (f.module) command.push_back("-m");
  }
  for (const std::string& arg : f.command) command.push_back(arg);
  toml::table job{{"name", name},
                  {"command", command},
                  {"nodes", nodes},
                  {"ranks_per_node", per_node},
                  {"state_dir", f.state_dir.empty() ? "endure-" + name : f.state_dir}};
  if (min_nodes > 0) job.insert("min_nodes", min_nodes);
  if (per_node > 1 && !host.omp_num_threads_set) {
    job.insert("env", toml::table{{"OMP_NUM_THREADS", "1"}});
  }
  toml::table spec{{"job", job}};
  // An unmodified script's first step may come after it loaded a large
  // checkpoint of its own, or after a rendezvous that waits for slow nodes:
  // before it, as much time as torch.distributed's own default rendezvous
  // timeout (30 min), not a job spec's 60 s.
  spec.insert("detection", toml::table{{"startup_timeout", "30m"}});
  if (f.max_restarts >= 0) {
    spec.insert("recovery", toml::table{{"max_restarts", f.max_restarts}});
  }
  std::ostringstream text;
  text << spec << "\n";
  return text.str();
}

LaunchHost ThisHost() {
  LaunchHost host;
  host.cpus = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 0; i < 64 && std::filesystem::exists("/dev/nvidia" + std::to_string(i)); ++i) {
    host.gpus = i + 1;
  }
  host.omp_num_threads_set = std::getenv("OMP_NUM_THREADS") != nullptr;
  return host;
}

}  // namespace endure::cli
