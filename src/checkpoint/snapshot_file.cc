// Snapshot files in shared memory: the T0 slots and T1 replicas.
#include "checkpoint/snapshot_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "common/env.h"
#include "common/hash.h"

namespace endure::checkpoint {
namespace {

constexpr char kMagic[8] = {'E', 'N', 'D', 'S', 'N', 'A', 'P', '1'};
constexpr size_t kHeaderSize = 64;
constexpr uint64_t kGrowQuantum = uint64_t{1} << 20;

struct Header {
  char magic[8];
  uint32_t state;  // SlotState, accessed through std::atomic_ref
  int32_t shard;
  int64_t step;
  uint64_t bytes;
  uint64_t xxh3;
  int32_t shards;
  char pad[kHeaderSize - 44];
};
static_assert(sizeof(Header) == kHeaderSize);

std::atomic_ref<uint32_t> StateOf(char* base) {
  return std::atomic_ref<uint32_t>(reinterpret_cast<Header*>(base)->state);
}

Status Errno(const std::string& what, const std::string& path) {
  return IOError(what + " '" + path + "': " + std::strerror(errno));
}

SnapshotInfo InfoOf(const Header& h, uint32_t state) {
  SnapshotInfo info;
  info.state = static_cast<SlotState>(state);
  info.step = h.step;
  info.shard = h.shard;
  info.shards = h.shards;
  info.bytes = h.bytes;
  info.xxh3 = h.xxh3;
  return info;
}

Status ReadFully(int fd, char* out, size_t n, off_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t r = pread(fd, out, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("cannot read", path);
    if (r == 0) return DataLoss(path + ": truncated snapshot");
    out += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return Status::Ok();
}

Status WriteFully(int fd, const char* p, size_t n, off_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t w = pwrite(fd, p, n, offset);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Errno("cannot write", path);
    p += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return Status::Ok();
}

}  // namespace

std::string SlotPath(const std::string& dir, int rank, int slot) {
  return JoinPath(dir, "rank-" + std::to_string(rank) + ".slot-" + std::to_string(slot));
}

// ---- SnapshotWriter ----

struct SnapshotWriter::Slot {
  std::string path;
  int fd = -1;
  char* base = nullptr;
  size_t capacity = 0;  // bytes mapped (= the file's size)

  ~Slot() {
    if (base != nullptr) munmap(base, capacity);
    if (fd >= 0) close(fd);
  }
  SlotState state() const { return static_cast<SlotState>(StateOf(base).load()); }
  const Header& header() const { return *reinterpret_cast<const Header*>(base); }
};

SnapshotWriter::SnapshotWriter() = default;
SnapshotWriter::~SnapshotWriter() = default;

Result<std::unique_ptr<SnapshotWriter>> SnapshotWriter::Open(const std::string& dir, int rank,
                                                             int shards, uint64_t max_bytes) {
  std::unique_ptr<SnapshotWriter> w(new SnapshotWriter());
  w->rank_ = rank;
  w->shards_ = shards;
  w->max_bytes_ = max_bytes;
  int64_t newest_step = -1;
  for (int i = 0; i < kT0Slots; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->path = SlotPath(dir, rank, i);
    slot->fd = open(slot->path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (slot->fd < 0) return Errno("cannot open checkpoint slot", slot->path);
    struct stat st {};
    if (fstat(slot->fd, &st) != 0) return Errno("cannot stat", slot->path);
    if (static_cast<size_t>(st.st_size) < kHeaderSize) {  // a new (or truncated) file
      if (ftruncate(slot->fd, kHeaderSize) != 0) return Errno("cannot size", slot->path);
      st.st_size = kHeaderSize;
    }
    slot->capacity = static_cast<size_t>(st.st_size);
    void* p = mmap(nullptr, slot->capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                   slot->fd, 0);
    if (p == MAP_FAILED) return Errno("cannot map", slot->path);
    slot->base = static_cast<char*>(p);
    Header& h = *reinterpret_cast<Header*>(slot->base);
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
      std::memset(slot->base, 0, kHeaderSize);
      std::memcpy(h.magic, kMagic, sizeof kMagic);
    }
    // A predecessor that died mid-copy left a half-written slot.
    uint32_t writing = static_cast<uint32_t>(SlotState::kWriting);
    StateOf(slot->base).compare_exchange_strong(writing, static_cast<uint32_t>(SlotState::kEmpty));
    const SlotState state = slot->state();
    if ((state == SlotState::kReady || state == SlotState::kPinned) && h.step > newest_step) {
      newest_step = h.step;
      w->newest_ = i;
    }
    w->slots_.push_back(std::move(slot));
  }
  return w;
}

Status SnapshotWriter::Reserve(Slot& slot, uint64_t payload) {
  const uint64_t need = kHeaderSize + payload;
  if (need <= slot.capacity) return Status::Ok();
  uint64_t size = (need + kGrowQuantum - 1) / kGrowQuantum * kGrowQuantum;
  // Grown in whole quanta, but never past the slot's share of the memory
  // budget: what the agent counts against the budget is the file's size.
  if (max_bytes_ > 0) size = std::min(size, std::max(need, max_bytes_));
  if (ftruncate(slot.fd, static_cast<off_t>(size)) != 0) {
    return Errno("cannot grow checkpoint slot (is the shared memory full?)", slot.path);
  }
  munmap(slot.base, slot.capacity);
  slot.base = nullptr;
  // MAP_POPULATE: the pages are faulted in now, once, not during a save.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, slot.fd, 0);
  if (p == MAP_FAILED) return Errno("cannot map", slot.path);
  slot.base = static_cast<char*>(p);
  slot.capacity = size;
  return Status::Ok();
}

Result<std::optional<SnapshotWriter::Saved>> SnapshotWriter::Save(
    int64_t step, const std::vector<TensorView>& views, std::chrono::milliseconds wait) {
  const uint64_t bytes = EncodedSize(views);
  // The share bounds the whole slot file, header included.
  if (max_bytes_ > 0 && kHeaderSize + bytes > max_bytes_) {
    return InvalidArgument("a checkpoint shard of " + std::to_string(bytes) +
                           " bytes exceeds its share of the memory budget (" +
                           std::to_string(max_bytes_) +
                           " bytes per slot); raise checkpoint.memory_budget");
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  int target = -1;
  for (;;) {
    // The oldest slot first: it is the one the agent is least likely to want;
    // a held one (a rollback target) last.
    const int64_t held = held_step_.load();
    auto is_held = [&](int i) {
      const Slot& s = *slots_[static_cast<size_t>(i)];
      return held >= 0 && s.state() == SlotState::kReady && s.header().step == held;
    };
    std::vector<int> order;
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
      if (i != newest_) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      if (is_held(a) != is_held(b)) return is_held(b);
      return slots_[static_cast<size_t>(a)]->header().step <
             slots_[static_cast<size_t>(b)]->header().step;
    });
    for (int i : order) {
      char* base = slots_[static_cast<size_t>(i)]->base;
      uint32_t state = StateOf(base).load();
      if (state != static_cast<uint32_t>(SlotState::kPinned) &&
          StateOf(base).compare_exchange_strong(state,
                                                static_cast<uint32_t>(SlotState::kWriting))) {
        target = i;
        break;
      }
    }
    if (target >= 0) break;
    // The agent is reading every other slot (a shutdown persisting them).
    if (std::chrono::steady_clock::now() >= deadline) return std::optional<Saved>();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Slot& slot = *slots_[static_cast<size_t>(target)];
  Status reserved = Reserve(slot, bytes);
  if (!reserved.ok()) {
    StateOf(slot.base).store(static_cast<uint32_t>(SlotState::kEmpty));
    return reserved;
  }
  Header& h = *reinterpret_cast<Header*>(slot.base);
  h.step = step;
  h.shard = rank_;
  h.shards = shards_;
  h.bytes = bytes;
  char* payload = slot.base + kHeaderSize;
  Xxh3Hasher hasher;
  EncodeTensorsInto(views, payload, &hasher);
  h.xxh3 = hasher.Digest();
  StateOf(slot.base).store(static_cast<uint32_t>(SlotState::kReady), std::memory_order_release);
  newest_ = target;
  return std::optional<Saved>(Saved{target, slot.path, bytes, h.xxh3});
}

// ---- SnapshotFile ----

Result<std::unique_ptr<SnapshotFile>> SnapshotFile::Open(const std::string& path) {
  std::unique_ptr<SnapshotFile> f(new SnapshotFile());
  f->path_ = path;
  // Never through a symlink, never anything but a regular file: the path
  // may name a slot its worker could have replaced.
  f->fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (f->fd_ < 0) {
    if (errno == ENOENT) return NotFound(path + ": no such snapshot");
    if (errno == ELOOP) return DataLoss(path + ": a symlink, not a snapshot");
    return Errno("cannot open snapshot", path);
  }
  struct stat st {};
  if (fstat(f->fd_, &st) != 0) return Errno("cannot stat", path);
  if (!S_ISREG(st.st_mode)) return DataLoss(path + ": not a regular file");
  if (static_cast<size_t>(st.st_size) < kHeaderSize) return DataLoss(path + ": truncated header");
  f->size_ = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd_, 0);
  if (p == MAP_FAILED) return Errno("cannot map", path);
  f->base_ = static_cast<char*>(p);
  if (std::memcmp(f->base_, kMagic, sizeof kMagic) != 0) {
    return DataLoss(path + ": not a snapshot (bad magic)");
  }
  return f;
}

SnapshotFile::~SnapshotFile() {
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
}

SnapshotInfo SnapshotFile::info() const {
  return InfoOf(*reinterpret_cast<const Header*>(base_),
                StateOf(base_).load(std::memory_order_acquire));
}

Result<std::string_view> SnapshotFile::payload() const {
  const uint64_t bytes = reinterpret_cast<const Header*>(base_)->bytes;
  if (bytes > size_ - kHeaderSize) {
    return DataLoss(path_ + ": truncated snapshot (" + std::to_string(size_ - kHeaderSize) +
                    " of " + std::to_string(bytes) + " bytes)");
  }
  return std::string_view(base_ + kHeaderSize, bytes);
}

bool SnapshotFile::Pin(int64_t step) {
  uint32_t ready = static_cast<uint32_t>(SlotState::kReady);
  if (!StateOf(base_).compare_exchange_strong(ready, static_cast<uint32_t>(SlotState::kPinned))) {
    return false;
  }
  if (reinterpret_cast<const Header*>(base_)->step != step) {
    Unpin();
    return false;
  }
  return true;
}

void SnapshotFile::Unpin() {
  uint32_t pinned = static_cast<uint32_t>(SlotState::kPinned);
  StateOf(base_).compare_exchange_strong(pinned, static_cast<uint32_t>(SlotState::kReady));
}

void SnapshotFile::Invalidate() { StateOf(base_).store(static_cast<uint32_t>(SlotState::kEmpty)); }

Status SnapshotFile::Verify() const {
  ENDURE_ASSIGN_OR_RETURN(std::string_view bytes, payload());
  return VerifyBytes(path_, bytes, bytes.size(), reinterpret_cast<const Header*>(base_)->xxh3);
}

void SnapshotFile::InjectCorruption() {
  const uint64_t bytes = reinterpret_cast<const Header*>(base_)->bytes;
  if (bytes > 0 && bytes <= size_ - kHeaderSize) base_[kHeaderSize + bytes / 2] ^= 0x01;
}

// ---- whole files ----

Result<std::unique_ptr<SnapshotFileWriter>> SnapshotFileWriter::Begin(const std::string& path,
                                                                      const SnapshotInfo& info) {
  std::unique_ptr<SnapshotFileWriter> w(new SnapshotFileWriter());
  w->path_ = path;
  w->bytes_ = info.bytes;
  // Never through a symlink: the directory is the agent's, the name a peer's.
  w->fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (w->fd_ < 0) return Errno("cannot open", path);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.state = static_cast<uint32_t>(SlotState::kWriting);
  h.step = info.step;
  h.shard = info.shard;
  h.shards = info.shards;
  h.bytes = info.bytes;
  h.xxh3 = info.xxh3;
  ENDURE_RETURN_IF_ERROR(WriteFully(w->fd_, reinterpret_cast<const char*>(&h), sizeof h, 0, path));
  return w;
}

SnapshotFileWriter::~SnapshotFileWriter() {
  if (fd_ < 0) return;
  if (!finished_) {
    // Best effort: a file whose header cannot be written reads as damaged.
    Status st = SetState(SlotState::kEmpty);
    if (!st.ok()) std::fprintf(stderr, "endure: %s\n", st.message().c_str());
  }
  close(fd_);
}

Status SnapshotFileWriter::SetState(SlotState state) {
  const uint32_t word = static_cast<uint32_t>(state);
  return WriteFully(fd_, reinterpret_cast<const char*>(&word), sizeof word, offsetof(Header, state),
                    path_);
}

Status SnapshotFileWriter::Append(std::string_view bytes) {
  if (bytes.size() > bytes_ - written_) {
    return InvalidArgument(path_ + ": " + std::to_string(written_ + bytes.size()) +
                           " payload bytes for a snapshot of " + std::to_string(bytes_));
  }
  ENDURE_RETURN_IF_ERROR(WriteFully(fd_, bytes.data(), bytes.size(),
                                    static_cast<off_t>(kHeaderSize + written_), path_));
  written_ += bytes.size();
  return Status::Ok();
}

Status SnapshotFileWriter::Finish() {
  if (written_ != bytes_) {
    return InvalidArgument(path_ + ": " + std::to_string(written_) + " of " +
                           std::to_string(bytes_) + " payload bytes");
  }
  ENDURE_RETURN_IF_ERROR(SetState(SlotState::kReady));
  finished_ = true;
  return Status::Ok();
}

Status WriteSnapshotFile(const std::string& path, const SnapshotInfo& info,
                         std::string_view payload) {
  SnapshotInfo whole = info;
  whole.bytes = payload.size();
  ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotFileWriter> w,
                          SnapshotFileWriter::Begin(path, whole));
  ENDURE_RETURN_IF_ERROR(w->Append(payload));
  return w->Finish();
}

Result<std::string> ReadSnapshotPayload(const std::string& path, int64_t step, uint64_t bytes,
                                        uint64_t xxh3) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return DataLoss(path + ": cannot open snapshot: " + std::strerror(errno));
  struct stat file {};
  if (fstat(fd, &file) != 0 || !S_ISREG(file.st_mode)) {
    close(fd);
    return DataLoss(path + ": not a regular file");
  }
  Header h{};
  Status st = ReadFully(fd, reinterpret_cast<char*>(&h), sizeof h, 0, path);
  std::string payload;
  if (st.ok()) {
    const auto state = static_cast<SlotState>(std::atomic_ref<uint32_t>(h.state).load());
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
      st = DataLoss(path + ": not a snapshot (bad magic)");
    } else if ((state != SlotState::kReady && state != SlotState::kPinned) || h.step != step) {
      st = DataLoss(path + ": no longer holds step " + std::to_string(step));
    } else if (h.bytes != bytes) {
      st = DataLoss(path + ": size " + std::to_string(h.bytes) + " bytes, expected " +
                    std::to_string(bytes));
    } else {
      payload.resize(bytes);
      st = ReadFully(fd, payload.data(), bytes, kHeaderSize, path);
    }
  }
  close(fd);
  ENDURE_RETURN_IF_ERROR(st);
  ENDURE_RETURN_IF_ERROR(VerifyBytes(path, payload, bytes, xxh3));
  return payload;
}

Result<std::string> ReadShardCopy(const ShardCopy& copy) {
  if (copy.tier != Tier::kT2) {
    return ReadSnapshotPayload(copy.path, copy.step, copy.bytes, copy.xxh3);
  }
  Result<std::string> bytes = Env::Default()->ReadFile(copy.path);
  if (!bytes.ok()) return DataLoss(copy.path + ": " + bytes.status().message());
  ENDURE_RETURN_IF_ERROR(VerifyBytes(copy.path, *bytes, copy.bytes, copy.xxh3));
  return bytes;
}

}  // namespace endure::checkpoint
