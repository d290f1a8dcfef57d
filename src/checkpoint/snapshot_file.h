// Snapshot files: the checkpoint engine's memory tiers (T0 and T1).
//
// A snapshot file lives in shared memory (a tmpfs such as /dev/shm) and holds
// one shard of one step: a 64-byte header, then the shard's bytes (the
// DecodeShard form). The header's state word is shared between processes
// (std::atomic_ref over the mapping):
//
//   kEmpty --writer--> kWriting --writer--> kReady <--agent--> kPinned
//
// T0: each rank's worker owns kT0Slots slot files, rank-R.slot-0/1/2, in the
// directory its agent names: SnapshotWriter writes step s into a slot that
// neither holds the newest snapshot nor is pinned. The agent pins one slot
// at a time and reads it in place for as long as it needs (the replica to
// the peer, the durable write): with three slots the worker never waits for
// it, however far behind it falls, and the agent never copies a snapshot
// out. The files outlive a crashed worker; a restarted one continues with
// them.
//
// T1: an agent keeps a peer's replicas as snapshot files written in place as
// their bytes arrive (SnapshotFileWriter), so that workers read both tiers
// the same way.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/restore_plan.h"
#include "checkpoint/tensor_blob.h"
#include "common/status.h"

namespace endure::checkpoint {

enum class SlotState : uint32_t { kEmpty = 0, kWriting = 1, kReady = 2, kPinned = 3 };

// What a snapshot file's header says.
struct SnapshotInfo {
  SlotState state = SlotState::kEmpty;
  int64_t step = 0;
  int shard = 0;
  int shards = 1;
  uint64_t bytes = 0;  // payload size
  uint64_t xxh3 = 0;   // payload checksum, computed by the writer
};

// A rank's T0 slots: one the agent may hold pinned, one with the newest
// snapshot, one to write the next into.
inline constexpr int kT0Slots = 3;

// "DIR/rank-3.slot-1".
std::string SlotPath(const std::string& dir, int rank, int slot);

// Worker side: the two T0 slots of one rank.
class SnapshotWriter {
 public:
  // Opens (creating) DIR/rank-R.slot-{0,1,2}. Slots left kWriting by a crashed
  // predecessor are reset to kEmpty. `max_bytes` (0: no limit) bounds one
  // slot file, its header included: the memory budget's share of this rank.
  static Result<std::unique_ptr<SnapshotWriter>> Open(const std::string& dir, int rank, int shards,
                                                      uint64_t max_bytes);
  ~SnapshotWriter();

  struct Saved {
    int slot = 0;
    std::string path;
    uint64_t bytes = 0;
    uint64_t xxh3 = 0;
  };
  // Copies `views` (ShardViews form) into a slot as step `step`: one that
  // holds neither the newest snapshot nor a pin. When every other slot is
  // pinned (the agent pins one at a time, so only a shutdown's persisting
  // does that), waits up to `wait` for one to be let go; nullopt when none
  // was: nothing was saved. kInvalidArgument when the snapshot exceeds
  // max_bytes.
  Result<std::optional<Saved>> Save(int64_t step, const std::vector<TensorView>& views,
                                    std::chrono::milliseconds wait = std::chrono::milliseconds(0));

  // Holds back the slot of snapshot `step` (the step before one whose loss
  // looks anomalous: the rollback target while the controller judges it).
  // Saves then take any other slot first; only when every other one is the
  // newest or pinned is the held slot reused, so a hold never makes a save
  // wait. A later Hold replaces it. Safe to call while a Save runs on
  // another thread.
  void Hold(int64_t step) { held_step_.store(step); }

 private:
  struct Slot;
  SnapshotWriter();
  Status Reserve(Slot& slot, uint64_t payload);

  int rank_ = 0;
  int shards_ = 1;
  uint64_t max_bytes_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  int newest_ = -1;                     // the slot holding the newest snapshot
  std::atomic<int64_t> held_step_{-1};  // Hold's step; -1: none
};

// Agent and reader side: one snapshot file, mapped.
class SnapshotFile {
 public:
  static Result<std::unique_ptr<SnapshotFile>> Open(const std::string& path);
  ~SnapshotFile();

  const std::string& path() const { return path_; }
  SnapshotInfo info() const;
  // The payload as the header sizes it (valid while this object lives).
  Result<std::string_view> payload() const;

  // kReady at `step` -> kPinned; false when the file holds something else.
  bool Pin(int64_t step);
  void Unpin();  // kPinned -> kReady
  // Marks it empty (a rollback abandons its step).
  void Invalidate();
  // Re-reads the payload and checks it against the header's size and
  // checksum; kDataLoss naming the file otherwise.
  Status Verify() const;
  // Flips one payload byte (fault injection: memory corruption).
  void InjectCorruption();

 private:
  SnapshotFile() = default;
  std::string path_;
  int fd_ = -1;
  char* base_ = nullptr;
  size_t size_ = 0;
};

// Writes a snapshot file (a T1 replica) in place as its payload arrives,
// reusing the pages of what it held before (fresh shared memory costs a page
// fault per 4 KiB): Begin puts the header at kWriting with `info`'s step,
// shard, size and checksum, Append adds the payload's bytes in order, and
// Finish, once all info.bytes are there, marks it kReady. Destroyed before
// Finish, the file is left kEmpty: readers never take a partial payload.
class SnapshotFileWriter {
 public:
  static Result<std::unique_ptr<SnapshotFileWriter>> Begin(const std::string& path,
                                                           const SnapshotInfo& info);
  ~SnapshotFileWriter();
  SnapshotFileWriter(const SnapshotFileWriter&) = delete;
  SnapshotFileWriter& operator=(const SnapshotFileWriter&) = delete;

  // kInvalidArgument past info.bytes; kIOError when the write fails.
  Status Append(std::string_view bytes);
  // kInvalidArgument when bytes are missing.
  Status Finish();

 private:
  SnapshotFileWriter() = default;
  Status SetState(SlotState state);
  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;    // the payload's size, from the header
  uint64_t written_ = 0;  // payload bytes appended so far
  bool finished_ = false;
};

// A whole snapshot file at once, through SnapshotFileWriter.
Status WriteSnapshotFile(const std::string& path, const SnapshotInfo& info,
                         std::string_view payload);

// Reads a snapshot file's payload for a restore and checks it is `step`,
// `bytes` long and hashes to `xxh3`: kDataLoss naming the file otherwise.
Result<std::string> ReadSnapshotPayload(const std::string& path, int64_t step, uint64_t bytes,
                                        uint64_t xxh3);

// Reads the copy a restore plan names, from any tier, and checks its size
// and checksum: kDataLoss naming the file when it does not match.
Result<std::string> ReadShardCopy(const ShardCopy& copy);

}  // namespace endure::checkpoint
