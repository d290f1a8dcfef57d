// The node health check an agent runs before its node joins or rejoins a job
// (Aurora's and MegaScale's self-tests): a known-answer matrix product, a
// memory pattern test, a disk write that must survive fsync and read back,
// and a two-party allreduce over loopback TCP. Each probe is short (the
// whole check well under a second on a CPU machine) and says what failed, so
// that the controller can refuse the node with a reason an operator can act
// on. Faults can be injected per probe (ENDURE_HEALTH_FAULT); an injected
// failure goes through the probe's own check (a perturbed product, a flipped
// bit, a corrupted write, a collective that fails), so the test exercises
// the path a real failure takes.
#pragma once

#include <cstddef>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace endure::agent {

enum class HealthProbe { kMatmul, kMemory, kDisk, kLoopback };

// "matmul", "memory", "disk", "loopback".
std::string_view HealthProbeName(HealthProbe probe);
// The inverse of HealthProbeName; kInvalidArgument listing the valid names.
Result<HealthProbe> ParseHealthProbe(std::string_view name);
// ENDURE_HEALTH_FAULT: probe names separated by commas ("matmul,disk"),
// spaces around them ignored; "" is no fault. kInvalidArgument naming the
// bad entry and listing the valid names.
Result<std::set<HealthProbe>> ParseHealthFault(std::string_view text);

// The part of an ENDURE_HEALTH_FAULT value for node `node`: the whole value
// when it names no node ("matmul,disk"), else the probes after "NODE=" in
// "node1=matmul;node2=disk" ("" when `node` is not named). For tests that
// run every agent from one environment (`endure run`).
std::string HealthFaultFor(std::string_view value, std::string_view node);

struct HealthCheckOptions {
  // Where the disk probe writes its file: the node's checkpoint root or work
  // dir. Must be an existing, writable directory ("" fails the probe).
  std::string disk_dir;
  // How much memory the memory probe allocates and pattern-tests; 0 skips it.
  size_t memory_bytes = 64 << 20;
  // Probes forced to fail (fault injection).
  std::set<HealthProbe> fail;
};

struct ProbeResult {
  HealthProbe probe = HealthProbe::kMatmul;
  bool ok = false;
  double seconds = 0;
  // Empty when it passed; otherwise what failed, e.g. "open /x/.endure-health-1234-...:
  // Permission denied". An injected failure's detail starts with "injected:".
  std::string detail;
};

struct HealthReport {
  bool ok = false;                  // every probe passed
  std::vector<ProbeResult> probes;  // in HealthProbe order
  // One line: "matmul ok 3ms, memory ok 40ms, disk FAILED: stat /x: No such
  // file or directory, loopback ok 2ms".
  std::string summary;
};

// Runs every probe, in HealthProbe order, on the calling thread (the
// loopback probe starts and joins one more). Never throws or aborts on a
// failing machine; a failure is a probe with ok = false.
HealthReport RunHealthCheck(const HealthCheckOptions& options);

// The probes on their own, for tests and for an agent that runs one again.

// The matrix product under test: C = A x B for n x n row-major matrices.
using MatmulKernel = std::function<void(const float* a, const float* b, float* c, int n)>;
// The CPU's plain triple loop: the default kernel.
void ReferenceMatmul(const float* a, const float* b, float* c, int n);
// Multiplies two fixed 128 x 128 matrices of small integers with `kernel`
// and checks every row and column sum of the product against the ones the
// inputs imply (Huang-Abraham checksums, exact in float for these values),
// so that any wrong element fails it with its row and column named.
// `inject`: one element of the product is perturbed before the check.
ProbeResult RunMatmulProbe(const MatmulKernel& kernel = ReferenceMatmul, bool inject = false);
// Writes and reads back three patterns over `bytes` (an address-derived
// pattern, its complement, and walking ones); `inject`: one bit of the
// buffer is flipped between a write and its read-back.
ProbeResult RunMemoryProbe(size_t bytes, bool inject = false);
// Creates a 1 MiB file in `dir`, writes it, fsyncs it, reads it back and
// compares, then unlinks it; `inject`: one byte is written wrong.
ProbeResult RunDiskProbe(const std::string& dir, bool inject = false);
// A PairTestServer on 127.0.0.1:0 and a pair test of a 1 MiB float buffer
// against it from this thread (agent/pair_test.h); `inject`: the client side
// runs with the comm-fail fault.
ProbeResult RunLoopbackProbe(bool inject = false);

}  // namespace endure::agent
