// Reading /dev/kmsg; see kernel_log.h.
#include "agent/kernel_log.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

namespace endure::agent {
namespace {

constexpr size_t kMaxKept = 1000;

// "6,1418,23827310364,-;message" -> "message"; "" for a continuation line
// (" KEY=value") or a line of another shape.
std::string_view MessageOf(std::string_view record) {
  if (record.empty() || record[0] == ' ') return {};
  const size_t semi = record.find(';');
  if (semi == std::string_view::npos) return {};
  std::string_view m = record.substr(semi + 1);
  while (!m.empty() && (m.back() == '\n' || m.back() == '\r')) m.remove_suffix(1);
  return m;
}

}  // namespace

bool KernelLog::IsHardwareRecord(std::string_view message) {
  for (std::string_view marker :
       {"NVRM:", "nvidia", "Xid", "SXid", "mlx5", "mlx4", "bnxt", "ice ", "AER:", "pcieport",
        "EDAC", "mce:", "Hardware Error", "Machine check"}) {
    if (message.find(marker) != std::string_view::npos) return true;
  }
  return false;
}

Result<std::unique_ptr<KernelLog>> KernelLog::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return IOError("cannot read the kernel log " + path + ": " + std::strerror(errno));
  }
  std::unique_ptr<KernelLog> log(new KernelLog(fd));
  log->Mark();  // what is there already is old
  return log;
}

KernelLog::~KernelLog() { ::close(fd_); }

void KernelLog::ReadLocked() {
  // /dev/kmsg returns one record per read and EAGAIN at the end (EPIPE when
  // records were overwritten before they were read: go on); a regular file
  // returns chunks and 0 at its end.
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR || errno == EPIPE) continue;
      return;  // EAGAIN: all read
    }
    if (n == 0) return;
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string_view message =
          MessageOf(std::string_view(partial_).substr(start, nl - start));
      if (message.empty()) continue;
      ++count_;
      if (!IsHardwareRecord(message)) continue;
      kept_.push_back({count_, std::string(message)});
      if (kept_.size() > kMaxKept) kept_.pop_front();
    }
    partial_.erase(0, start);
  }
}

uint64_t KernelLog::Mark() {
  MutexLock lock(&mu_);
  ReadLocked();
  return count_;
}

std::string KernelLog::After(uint64_t mark, size_t max_lines) {
  MutexLock lock(&mu_);
  ReadLocked();
  size_t first = kept_.size();
  size_t taken = 0;
  while (first > 0 && kept_[first - 1].index > mark && taken < max_lines) {
    --first;
    ++taken;
  }
  std::string out;
  for (size_t i = first; i < kept_.size(); ++i) out += "kernel: " + kept_[i].message + "\n";
  return out;
}

}  // namespace endure::agent
