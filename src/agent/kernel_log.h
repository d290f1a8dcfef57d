// KernelLog: the node's kernel messages (/dev/kmsg), where the NVIDIA driver
// writes its Xid records, the NIC driver its link and firmware errors, and
// the kernel its PCIe AER and machine-check reports: evidence the worker's own
// output does not hold (a worker sees "CUDA error: unspecified launch
// failure"; the kernel log says "NVRM: Xid ... 79, GPU has fallen off the
// bus"). The agent adds the records of its generation to a failed worker's
// last lines before classifying them, so that the Xid behind a cascade names
// the cause.
//
// Only hardware records are kept (the NVIDIA driver, mlx5 and other NICs,
// AER, MCE/EDAC): an OOM killer's record may be another job's on a shared
// host, so it is not attributed to this one's workers. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "common/status.h"

namespace endure::agent {

class KernelLog {
 public:
  // Opens `path` (/dev/kmsg, or a file of the same format:
  // "PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE" per line) and reads what
  // is already there, which Mark() then counts as old. Fails naming the path
  // when it cannot be read (a container without access to the kernel log).
  static Result<std::unique_ptr<KernelLog>> Open(const std::string& path);
  ~KernelLog();
  KernelLog(const KernelLog&) = delete;
  KernelLog& operator=(const KernelLog&) = delete;

  // Reads what arrived; returns a mark after everything read so far.
  uint64_t Mark();
  // The hardware records read after `mark` (reading what arrived first),
  // oldest first, at most the newest `max_lines`, as "kernel: MESSAGE" lines.
  std::string After(uint64_t mark, size_t max_lines = 100);

  // Whether a kernel message is hardware evidence (see above).
  static bool IsHardwareRecord(std::string_view message);

 private:
  explicit KernelLog(int fd) : fd_(fd) {}
  void ReadLocked();  // mu_ held

  Mutex mu_;
  const int fd_;
  uint64_t count_ = 0;   // records read: marks count them
  std::string partial_;  // a regular file's line not yet complete
  struct Record {
    uint64_t index;
    std::string message;
  };
  std::deque<Record> kept_;  // hardware records, newest last, bounded
};

}  // namespace endure::agent
