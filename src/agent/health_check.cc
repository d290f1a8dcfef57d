// The health check's probes. Each one checks its result against an answer
// known without trusting the thing under test (checksums implied by the
// inputs, patterns regenerated from the address, the bytes written), and
// each injected fault perturbs the data the check then judges.
#include "agent/health_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "agent/pair_test.h"
#include "common/duration.h"
#include "common/names.h"
#include "common/secret.h"

namespace endure::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr HealthProbe kAllProbes[] = {HealthProbe::kMatmul, HealthProbe::kMemory,
                                      HealthProbe::kDisk, HealthProbe::kLoopback};
constexpr int kMatmulN = 128;
// The element an injected matmul fault perturbs.
constexpr int kInjectRow = 37;
constexpr int kInjectColumn = 91;
constexpr size_t kDiskFileBytes = 1 << 20;
constexpr uint64_t kLoopbackBytes = 1 << 20;
constexpr auto kLoopbackTimeout = std::chrono::seconds(5);

std::string ValidNames() { return "matmul, memory, disk, loopback"; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string ErrnoText(const std::string& call) { return call + ": " + std::strerror(errno); }

// Times `body`, which fills in ok and detail.
template <typename Body>
ProbeResult Timed(HealthProbe probe, Body body) {
  const Clock::time_point start = Clock::now();
  ProbeResult r;
  r.probe = probe;
  body(r);
  r.seconds = Seconds(Clock::now() - start);
  return r;
}

// The inputs: small integers, so that every product and sum below is exact
// in float (|C[i][j]| <= 128 x 3 x 2) and in double (the checksums).
float InputA(int i, int k) { return static_cast<float>((i + 2 * k) % 7 - 3); }
float InputB(int k, int j) { return static_cast<float>((3 * k + j) % 5 - 2); }

// The memory probe's patterns, regenerated from the word's index when read
// back, so that nothing but the buffer under test holds them.
enum class Pattern { kAddress, kComplement, kWalkingOnes };
uint64_t PatternWord(Pattern p, size_t i) {
  const uint64_t mixed = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;
  switch (p) {
    case Pattern::kAddress:
      return mixed;
    case Pattern::kComplement:
      return ~mixed;
    case Pattern::kWalkingOnes:
      break;
  }
  return uint64_t{1} << (i % 64);
}
const char* PatternName(Pattern p) {
  switch (p) {
    case Pattern::kAddress:
      return "address";
    case Pattern::kComplement:
      return "complement";
    case Pattern::kWalkingOnes:
      break;
  }
  return "walking ones";
}

// Keeps the compiler from folding a pattern's writes into its read-back.
inline void MemoryBarrier() { asm volatile("" ::: "memory"); }

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes it now, for close()'s own error (NFS reports write errors there).
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

// The disk probe's steps after the directory was checked; `path` is
// unlinked by the caller whatever happens once it was created.
std::string WriteAndReadBack(const std::string& path, bool inject, bool& created) {
  std::string data(kDiskFileBytes, '\0');
  uint32_t x = 0x2545F491u;
  for (char& c : data) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  std::string written = data;
  constexpr size_t kInjectAt = 12345;
  if (inject) written[kInjectAt] = static_cast<char>(written[kInjectAt] ^ 0x01);
  {
    Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() < 0) return ErrnoText("open " + path);
    created = true;
    size_t done = 0;
    while (done < written.size()) {
      const ssize_t n = ::write(fd.get(), written.data() + done, written.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoText("write " + path);
      done += static_cast<size_t>(n);
    }
    if (::fsync(fd.get()) != 0) return ErrnoText("fsync " + path);
    if (fd.Close() != 0) return ErrnoText("close " + path);
  }
  std::string read(kDiskFileBytes + 1, '\0');  // one more: a longer file is an error too
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoText("open " + path + " for reading");
  size_t got = 0;
  while (got < read.size()) {
    const ssize_t n = ::read(fd.get(), read.data() + got, read.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoText("read " + path);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != data.size()) {
    return "read back " + std::to_string(got) + " of the " + std::to_string(data.size()) +
           " bytes written to " + path;
  }
  for (size_t i = 0; i < data.size(); ++i) {
    if (read[i] != data[i]) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "byte %zu reads 0x%02x, 0x%02x was written", i,
                    static_cast<unsigned char>(read[i]), static_cast<unsigned char>(data[i]));
      return "read back of " + path + " differs: " + buf;
    }
  }
  return "";
}

}  // namespace

std::string_view HealthProbeName(HealthProbe probe) {
  switch (probe) {
    case HealthProbe::kMatmul:
      return "matmul";
    case HealthProbe::kMemory:
      return "memory";
    case HealthProbe::kDisk:
      return "disk";
    case HealthProbe::kLoopback:
      break;
  }
  return "loopback";
}

Result<HealthProbe> ParseHealthProbe(std::string_view name) {
  for (HealthProbe p : kAllProbes) {
    if (name == HealthProbeName(p)) return p;
  }
  return InvalidArgument("unknown health probe '" + QuoteForLog(name) + "': the probes are " +
                         ValidNames());
}

Result<std::set<HealthProbe>> ParseHealthFault(std::string_view text) {
  std::set<HealthProbe> probes;
  if (Trim(text).empty()) return probes;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view item = Trim(text.substr(0, comma));
    Result<HealthProbe> p = ParseHealthProbe(item);
    if (!p.ok()) return p.status().WithContext("ENDURE_HEALTH_FAULT");
    probes.insert(*p);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return probes;
}

void ReferenceMatmul(const float* a, const float* b, float* c, int n) {
  for (int i = 0; i < n * n; ++i) c[i] = 0;
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < n; ++k) {
      const float aik = a[i * n + k];
      for (int j = 0; j < n; ++j) c[i * n + j] += aik * b[k * n + j];
    }
  }
}

ProbeResult RunMatmulProbe(const MatmulKernel& kernel, bool inject) {
  return Timed(HealthProbe::kMatmul, [&](ProbeResult& r) {
    constexpr int n = kMatmulN;
    std::vector<float> a(n * n), b(n * n), c(n * n, 0.0f);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        a[i * n + j] = InputA(i, j);
        b[i * n + j] = InputB(i, j);
      }
    }
    kernel(a.data(), b.data(), c.data(), n);
    if (inject) c[kInjectRow * n + kInjectColumn] += 1.0f;
    // Row i of C sums to A's row i times B's row sums, column j to A's
    // column sums times B's column j; a wrong element breaks both its own.
    std::vector<double> b_row_sum(n, 0), a_column_sum(n, 0);
    for (int k = 0; k < n; ++k) {
      for (int j = 0; j < n; ++j) {
        b_row_sum[k] += b[k * n + j];
        a_column_sum[k] += a[j * n + k];
      }
    }
    int bad_row = -1, bad_column = -1, bad_rows = 0, bad_columns = 0;
    for (int i = 0; i < n; ++i) {
      double want = 0, got = 0;
      for (int k = 0; k < n; ++k) want += a[i * n + k] * b_row_sum[k];
      for (int j = 0; j < n; ++j) got += c[i * n + j];
      if (got != want) {
        if (bad_row < 0) bad_row = i;
        ++bad_rows;
      }
    }
    for (int j = 0; j < n; ++j) {
      double want = 0, got = 0;
      for (int k = 0; k < n; ++k) want += a_column_sum[k] * b[k * n + j];
      for (int i = 0; i < n; ++i) got += c[i * n + j];
      if (got != want) {
        if (bad_column < 0) bad_column = j;
        ++bad_columns;
      }
    }
    const std::string prefix = inject ? "injected: " : "";
    if (bad_rows == 0 && bad_columns == 0) {
      r.ok = !inject;
      if (inject)
        r.detail = prefix + "the perturbed product passed its checksums: the check is broken";
      return;
    }
    std::string detail = std::to_string(bad_rows) + " row and " + std::to_string(bad_columns) +
                         " column checksums of the 128x128 product are wrong";
    if (bad_row >= 0 && bad_column >= 0) {
      double want = 0;
      for (int k = 0; k < n; ++k) want += a[bad_row * n + k] * b[k * n + bad_column];
      char buf[128];
      std::snprintf(buf, sizeof buf, "; C[%d][%d] = %.9g, expected %.9g", bad_row, bad_column,
                    static_cast<double>(c[bad_row * n + bad_column]), want);
      detail += buf;
    }
    r.detail = prefix + detail + " (the CPU's arithmetic is wrong)";
  });
}

ProbeResult RunMemoryProbe(size_t bytes, bool inject) {
  return Timed(HealthProbe::kMemory, [&](ProbeResult& r) {
    const std::string prefix = inject ? "injected: " : "";
    const size_t words = bytes / sizeof(uint64_t);
    if (words == 0) {
      r.ok = !inject;
      r.detail = inject ? prefix + "memory test forced to fail (memory_bytes is 0)"
                        : "skipped: memory_bytes is 0";
      return;
    }
    std::unique_ptr<uint64_t[]> buffer(new (std::nothrow) uint64_t[words]);
    if (buffer == nullptr) {
      r.detail = prefix + "cannot allocate " + std::to_string(bytes) + " bytes";
      return;
    }
    uint64_t* const w = buffer.get();
    for (Pattern p : {Pattern::kAddress, Pattern::kComplement, Pattern::kWalkingOnes}) {
      for (size_t i = 0; i < words; ++i) w[i] = PatternWord(p, i);
      if (inject && p == Pattern::kAddress) w[words / 2] ^= uint64_t{1} << 17;
      MemoryBarrier();
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < words; ++i) {
        if (w[i] != PatternWord(p, i)) {
          if (bad++ == 0) first = i;
        }
      }
      if (bad != 0) {
        r.detail = prefix + std::to_string(bad) + " of " + std::to_string(words) +
                   " words fail the " + PatternName(p) + " pattern; the first, at byte offset " +
                   std::to_string(first * sizeof(uint64_t)) + ", reads " + Hex(w[first]) +
                   ", expected " + Hex(PatternWord(p, first));
        return;
      }
    }
    r.ok = !inject;
    if (inject) r.detail = prefix + "the flipped bit was not detected: the check is broken";
  });
}

ProbeResult RunDiskProbe(const std::string& dir, bool inject) {
  return Timed(HealthProbe::kDisk, [&](ProbeResult& r) {
    const std::string prefix = inject ? "injected: " : "";
    if (dir.empty()) {
      r.detail = prefix + "no directory to test (the node's checkpoint or work dir)";
      return;
    }
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      r.detail = prefix + ErrnoText("stat " + dir);
      return;
    }
    if (!S_ISDIR(st.st_mode)) {
      r.detail = prefix + dir + " is not a directory";
      return;
    }
    Result<std::string> tag = RandomHex(4);
    const std::string path = dir + "/.endure-health-" + std::to_string(::getpid()) + "-" +
                             (tag.ok() ? *tag : std::string("0"));
    bool created = false;
    std::string error = WriteAndReadBack(path, inject, created);
    if (created && ::unlink(path.c_str()) != 0 && error.empty()) {
      error = ErrnoText("unlink " + path);
    }
    r.ok = error.empty() && !inject;
    if (!error.empty()) {
      r.detail = prefix + error;
    } else if (inject) {
      r.detail = prefix + "the corrupted write was not detected: the check is broken";
    }
  });
}

ProbeResult RunLoopbackProbe(bool inject) {
  return Timed(HealthProbe::kLoopback, [&](ProbeResult& r) {
    const std::string prefix = inject ? "injected: " : "";
    Result<std::string> token = RandomHex(16);
    if (!token.ok()) {
      r.detail = prefix + token.status().message();
      return;
    }
    PairTestServerOptions options;
    options.host = "127.0.0.1";
    options.token = *token;
    options.node = "loopback-b";
    options.max_bytes = kLoopbackBytes;
    options.idle_limit = kLoopbackTimeout;
    Result<std::unique_ptr<PairTestServer>> server = PairTestServer::Start(options);
    if (!server.ok()) {
      r.detail = prefix + server.status().message();
      return;
    }
    PairTestTarget target;
    target.host = "127.0.0.1";
    target.port = (*server)->port();
    target.token = *token;
    target.node = "loopback-a";
    target.bytes = kLoopbackBytes;
    target.timeout = kLoopbackTimeout;
    Result<PairOutcome> outcome =
        RunPairTest(target, inject ? PairFault::Fail() : PairFault::None());
    if (!outcome.ok()) {
      r.detail = prefix + outcome.status().message();
    } else if (!outcome->ok) {
      r.detail = prefix + outcome->error;
    } else {
      r.ok = !inject;
      if (inject) r.detail = prefix + "the failing collective passed: the check is broken";
    }
  });
}

HealthReport RunHealthCheck(const HealthCheckOptions& options) {
  HealthReport report;
  const auto injected = [&](HealthProbe p) { return options.fail.count(p) != 0; };
  report.probes.push_back(RunMatmulProbe(ReferenceMatmul, injected(HealthProbe::kMatmul)));
  report.probes.push_back(RunMemoryProbe(options.memory_bytes, injected(HealthProbe::kMemory)));
  report.probes.push_back(RunDiskProbe(options.disk_dir, injected(HealthProbe::kDisk)));
  report.probes.push_back(RunLoopbackProbe(injected(HealthProbe::kLoopback)));
  report.ok = true;
  for (const ProbeResult& p : report.probes) {
    if (!report.summary.empty()) report.summary += ", ";
    report.summary += std::string(HealthProbeName(p.probe));
    if (p.ok) {
      report.summary += " ok " + FormatDuration(FromSeconds(p.seconds));
      if (!p.detail.empty()) report.summary += " (" + p.detail + ")";
    } else {
      report.ok = false;
      report.summary += " FAILED: " + p.detail;
    }
  }
  return report;
}

std::string HealthFaultFor(std::string_view value, std::string_view node) {
  if (value.find('=') == std::string_view::npos) return std::string(value);
  while (!value.empty()) {
    const size_t semi = value.find(';');
    const std::string_view entry = value.substr(0, semi);
    const size_t eq = entry.find('=');
    if (eq != std::string_view::npos && entry.substr(0, eq) == node) {
      return std::string(entry.substr(eq + 1));
    }
    if (semi == std::string_view::npos) break;
    value.remove_prefix(semi + 1);
  }
  return "";
}

}  // namespace endure::agent
