// The training loop, its c10d Gloo data parallelism, and the conversion of
// the training state to and from named tensors for checkpoints. The only
// translation unit besides gpt.cc that includes libtorch.
#include "trainer/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <dlfcn.h>
#include <malloc.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "checkpoint/checkpoint_dir.h"
#include "common/fault_injection_env.h"
#include "common/mutex.h"
#include "endure/client.h"
#include "trainer/corpus.h"
#include "trainer/exact_sum.h"
#include "trainer/gpt.h"
#include "trainer/schedule.h"

namespace endure::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using checkpoint::TensorBlob;
using checkpoint::TrainingState;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Result<int> EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > 1 << 30) {
    return InvalidArgument(std::string(name) + "='" + v + "' is not a non-negative integer");
  }
  return static_cast<int>(n);
}

// libtorch does not set OpenBLAS's own thread pool; with several ranks on a
// few cores, oversubscription costs 3-4x.
void SetThreads(int threads) {
  torch::set_num_threads(threads);
  using SetFn = void (*)(int);
  if (auto fn = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
}

// --threads, else OMP_NUM_THREADS (torchrun sets it to 1; `endure run` to
// cores / ranks on the machine), else 1: on small machines extra intra-op
// threads spin against the other ranks and are slower than one (measured:
// 716 ms against 359 ms a step for one rank on 2 cores).
int ThreadsPerRank(const TrainerOptions& options) {
  if (options.threads > 0) return options.threads;
  if (Result<int> omp = EnvInt("OMP_NUM_THREADS", 0); omp.ok() && *omp > 0) return *omp;
  return 1;
}

// glibc returns large freed blocks to the kernel (mmap'd chunks, heap
// trimming), so every step faults its activations in again; on VMs a fresh
// page costs microseconds. Keeping freed memory in the heap made a step 2.1x
// faster here (771 -> 364 ms, one rank of the demo model).
void KeepFreedMemory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum; fixes it (no dynamic growth)
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

// ---- State boundary: model + optimizer <-> named tensors and metadata ----

std::string DTypeName(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat:
      return "float32";
    case torch::kDouble:
      return "float64";
    case torch::kLong:
      return "int64";
    case torch::kByte:
      return "uint8";
    default:
      ENDURE_CHECK(false && "unsupported dtype in training state");
  }
  return "";
}

TensorBlob ToBlob(const std::string& name, const torch::Tensor& t) {
  torch::Tensor c = t.detach().contiguous().cpu();
  TensorBlob blob;
  blob.name = name;
  blob.dtype = DTypeName(c.scalar_type());
  blob.shape.assign(c.sizes().begin(), c.sizes().end());
  blob.data.assign(static_cast<const char*>(c.data_ptr()), c.nbytes());
  return blob;
}

// Copies `blob` into `dst`, which must have the same shape and size.
Status FromBlob(const TensorBlob& blob, torch::Tensor dst) {
  std::vector<int64_t> shape(dst.sizes().begin(), dst.sizes().end());
  if (shape != blob.shape || blob.data.size() != dst.nbytes()) {
    return InvalidArgument("checkpoint tensor '" + blob.name +
                           "' does not match this model's shape (was it written with other "
                           "--layers/--d-model/--heads/--context?)");
  }
  torch::NoGradGuard no_grad;
  std::memcpy(dst.data_ptr(), blob.data.data(), blob.data.size());
  return Status::Ok();
}

nlohmann::json ModelJson(const ModelConfig& m) {
  return {{"layers", m.layers},
          {"d_model", m.d_model},
          {"heads", m.heads},
          {"context", m.context},
          {"vocab", m.vocab}};
}

ModelConfig ModelFromJson(const nlohmann::json& j) {
  ModelConfig m;
  m.layers = j.value("layers", m.layers);
  m.d_model = j.value("d_model", m.d_model);
  m.heads = j.value("heads", m.heads);
  m.context = j.value("context", m.context);
  m.vocab = j.value("vocab", m.vocab);
  return m;
}

std::string OptimizerKey(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}

// The training state as named tensors, in a fixed order every rank agrees
// on, and its metadata. The tensors are views of the live ones, except the
// RNG state, a copy made for the occasion.
struct StateParts {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  nlohmann::json meta;
};

StateParts CollectState(GPT& model, torch::optim::AdamW& optimizer, int64_t step,
                        const TrainerOptions& options) {
  StateParts parts;
  int64_t adam_step = 0;
  for (const auto& p : model->named_parameters()) {
    parts.tensors.emplace_back("model/" + p.key(), p.value().detach());
    auto it = optimizer.state().find(OptimizerKey(p.value()));
    if (it == optimizer.state().end()) continue;  // no optimizer step taken yet
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    parts.tensors.emplace_back("optim/" + p.key() + "/exp_avg", s.exp_avg());
    parts.tensors.emplace_back("optim/" + p.key() + "/exp_avg_sq", s.exp_avg_sq());
    adam_step = s.step();
  }
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    parts.tensors.emplace_back("rng/cpu", gen.get_state());
  }
  parts.meta = {{"step", step},
                {"model", ModelJson(options.model)},
                {"adam_step", adam_step},
                {"seed", options.seed},
                {"global_batch", options.global_batch},
                // The batch of step s is a pure function of (seed, s), so the
                // data position is the next step index.
                {"data_position", {{"next_step", step}}}};
  return parts;
}

TrainingState CaptureState(GPT& model, torch::optim::AdamW& optimizer, int64_t step,
                           const TrainerOptions& options) {
  StateParts parts = CollectState(model, optimizer, step, options);
  TrainingState state;
  state.step = step;
  state.meta = std::move(parts.meta);
  for (const auto& [name, t] : parts.tensors) state.tensors.push_back(ToBlob(name, t));
  return state;
}

// This rank's shard of the state, ready to be copied into node memory: the
// tensors are split among the ranks by size, and each rank copies only its
// own, straight from the live tensors (views: they must not change until the
// copy is done).
struct PreparedShard {
  int64_t step = 0;
  int shards = 1;
  StateParts parts;  // keeps the views, and the RNG state's copy, alive
  std::vector<TensorRef> refs;
  std::string meta;
};

PreparedShard PrepareShard(GPT& model, torch::optim::AdamW& optimizer, int64_t step,
                           const TrainerOptions& options, const DistEnv& dist) {
  PreparedShard shard;
  shard.step = step;
  shard.shards = dist.world_size;
  shard.parts = CollectState(model, optimizer, step, options);
  std::vector<uint64_t> sizes;
  for (const auto& [name, t] : shard.parts.tensors) sizes.push_back(t.nbytes());
  const std::vector<int> owner = checkpoint::PartitionBySize(sizes, dist.world_size);
  for (size_t i = 0; i < shard.parts.tensors.size(); ++i) {
    if (owner[i] != dist.rank) continue;
    const torch::Tensor& t = shard.parts.tensors[i].second;
    ENDURE_CHECK(t.is_contiguous() && t.device().is_cpu());
    shard.refs.push_back(TensorRef{shard.parts.tensors[i].first, DTypeName(t.scalar_type()),
                                   std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                                   t.data_ptr(), t.nbytes()});
  }
  shard.meta = shard.parts.meta.dump();
  return shard;
}

// Copies a prepared shard into node memory through the agent; whether it
// was saved.
Result<bool> SaveShard(Session& session, const PreparedShard& shard) {
  return session.SaveSnapshot(shard.step, shard.shards, shard.meta, shard.refs);
}

// The checkpoint copy of the step that just ended, made on a thread of its
// own while the next step's forward and backward passes run: they read the
// parameters and change neither them nor the optimizer's state. Wait()
// before the next collective (and so before the update), before a rejoin,
// and before a fault ends the process. At most one copy is in flight.
class BackgroundSave {
 public:
  ~BackgroundSave() {
    if (future_.valid()) future_.wait();  // the views must outlive the copy
  }
  void Start(Session& session, PreparedShard shard) {
    ENDURE_CHECK(!future_.valid());
    shard_ = std::make_unique<PreparedShard>(std::move(shard));
    future_ = std::async(std::launch::async,
                         [&session, s = shard_.get()] { return SaveShard(session, *s); });
  }
  bool pending() const { return future_.valid(); }
  // Waits for the copy in flight: the step it saved, or -1 when there was
  // none or it was not saved (every other slot stayed pinned).
  Result<int64_t> Wait() {
    if (!future_.valid()) return int64_t{-1};
    Result<bool> saved = future_.get();
    const int64_t step = shard_->step;
    shard_.reset();
    if (!saved.ok())
      return saved.status().WithContext("checkpoint at step " + std::to_string(step));
    return *saved ? step : int64_t{-1};
  }

 private:
  std::unique_ptr<PreparedShard> shard_;
  std::future<Result<bool>> future_;
};

// Loads the agent's restore plan: each shard's loader rank reads and checks
// its copy, then broadcasts the bytes to every rank; all ranks decode all
// shards into one state. A copy that fails its check fails every rank.
Result<TrainingState> LoadPlanned(const RestorePlan& plan, const DistEnv& dist,
                                  c10d::ProcessGroup* group, const Session& session) {
  TrainingState state;
  state.step = plan.step;
  for (size_t i = 0; i < plan.sources.size(); ++i) {
    const RestoreSource& src = plan.sources[i];
    const bool loader = group == nullptr || src.loader_rank == dist.rank;
    std::string bytes, error;
    if (loader) {
      Result<std::string> r = session.ReadRestoreShard(i);
      if (r.ok()) {
        bytes = std::move(r).value();
      } else {
        error = r.status().message();
      }
    }
    if (group != nullptr) {
      c10d::BroadcastOptions from;
      from.rootRank = src.loader_rank;
      std::vector<torch::Tensor> size = {
          torch::full({1}, error.empty() ? static_cast<int64_t>(bytes.size()) : -1, torch::kLong)};
      group->broadcast(size, from)->wait();
      const int64_t n = size[0].item<int64_t>();
      if (n < 0 && !loader)
        error = "rank " + std::to_string(src.loader_rank) + " could not read it";
      if (n > 0) {
        if (!loader) bytes.resize(static_cast<size_t>(n));
        std::vector<torch::Tensor> data = {torch::from_blob(bytes.data(), {n}, torch::kByte)};
        group->broadcast(data, from)->wait();
      }
    }
    if (!error.empty()) return DataLoss("restore of " + src.description + ": " + error);
    ENDURE_ASSIGN_OR_RETURN(checkpoint::DecodedShard shard,
                            checkpoint::DecodeShard(bytes, src.description));
    if (shard.meta["step"] != plan.step) {
      return DataLoss(src.description + ": holds step " + shard.meta["step"].dump());
    }
    if (src.shard == 0) state.meta = std::move(shard.meta);
    for (TensorBlob& t : shard.tensors) state.tensors.push_back(std::move(t));
  }
  return state;
}

Status RestoreState(const TrainingState& state, GPT& model, torch::optim::AdamW* optimizer) {
  std::map<std::string, const TensorBlob*> blobs;
  for (const TensorBlob& b : state.tensors) blobs[b.name] = &b;
  auto find = [&](const std::string& name) -> Result<const TensorBlob*> {
    auto it = blobs.find(name);
    if (it == blobs.end()) return DataLoss("checkpoint lacks tensor '" + name + "'");
    return it->second;
  };
  const int64_t adam_step = state.meta.value("adam_step", int64_t{0});
  for (const auto& p : model->named_parameters()) {
    ENDURE_ASSIGN_OR_RETURN(const TensorBlob* blob, find("model/" + p.key()));
    ENDURE_RETURN_IF_ERROR(FromBlob(*blob, p.value()));
    if (optimizer == nullptr || adam_step == 0) continue;
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(adam_step);
    s->exp_avg(torch::empty_like(p.value()));
    s->exp_avg_sq(torch::empty_like(p.value()));
    ENDURE_ASSIGN_OR_RETURN(blob, find("optim/" + p.key() + "/exp_avg"));
    ENDURE_RETURN_IF_ERROR(FromBlob(*blob, s->exp_avg()));
    ENDURE_ASSIGN_OR_RETURN(blob, find("optim/" + p.key() + "/exp_avg_sq"));
    ENDURE_RETURN_IF_ERROR(FromBlob(*blob, s->exp_avg_sq()));
    optimizer->state()[OptimizerKey(p.value())] = std::move(s);
  }
  if (optimizer != nullptr) {
    ENDURE_ASSIGN_OR_RETURN(const TensorBlob* rng, find("rng/cpu"));
    torch::Tensor rng_state = torch::empty({static_cast<int64_t>(rng->data.size())}, torch::kByte);
    ENDURE_RETURN_IF_ERROR(FromBlob(*rng, rng_state));
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng_state);
  }
  return Status::Ok();
}

// The parameters' fingerprint (endure::Fingerprint, in their named order):
// the printed param_fingerprint and what the SDC check compares.
std::string ParamFingerprint(GPT& model) {
  std::vector<torch::Tensor> keep;  // contiguous copies, where a parameter is not
  std::vector<TensorRef> refs;
  for (const auto& p : model->named_parameters()) {
    torch::Tensor c = p.value().detach().contiguous();
    refs.push_back(TensorRef{p.key(), DTypeName(c.scalar_type()),
                             std::vector<int64_t>(c.sizes().begin(), c.sizes().end()), c.data_ptr(),
                             c.nbytes()});
    keep.push_back(std::move(c));
  }
  return endure::Fingerprint(refs);
}

// Applies an injected bitflip to this replica's parameters, in their raw
// bytes and outside autograd: the corruption a faulty GPU or memory would
// leave, invisible to the optimizer.
void ApplyBitFlip(GPT& model, const BitFlip& flip, int rank) {
  auto named = model->named_parameters();
  if (named.size() == 0) return;
  const size_t index = static_cast<size_t>(flip.tensor) % named.size();
  torch::Tensor t = named[index].value().detach();
  ENDURE_CHECK(t.is_contiguous() && t.device().is_cpu());
  const bool flipped = FlipBit(flip, t.data_ptr(), t.numel(), t.element_size());
  std::fprintf(stderr, "endure-train: rank %d: %s bit %d of element %lld of %s\n", rank,
               flipped ? "flipped" : "could not flip", flip.bit,
               static_cast<long long>(flip.element % std::max<int64_t>(1, t.numel())),
               named[index].key().c_str());
  std::fflush(stderr);
}

// ---- Data ----

// Inputs and next-token targets for the given sequence start offsets.
std::pair<torch::Tensor, torch::Tensor> MakeBatch(const std::string& text,
                                                  const std::vector<int64_t>& offsets,
                                                  int context) {
  const int64_t n = static_cast<int64_t>(offsets.size());
  torch::Tensor bytes = torch::empty({n, context + 1}, torch::kByte);
  uint8_t* dst = bytes.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * (context + 1), text.data() + offsets[i], context + 1);
  }
  torch::Tensor tokens = bytes.to(torch::kLong);
  return {tokens.slice(1, 0, context), tokens.slice(1, 1, context + 1)};
}

// A micro-batch of seeded random bytes: the same for the same (seed, step,
// slot), so that a replay of the step reads it again.
std::pair<torch::Tensor, torch::Tensor> RandomBatch(uint64_t seed, int64_t step, int slot, int n,
                                                    int context) {
  std::mt19937_64 rng(seed ^ (static_cast<uint64_t>(step) << 20) ^ static_cast<uint64_t>(slot));
  torch::Tensor bytes = torch::empty({n, context + 1}, torch::kByte);
  uint8_t* dst = bytes.data_ptr<uint8_t>();
  for (int64_t i = 0; i < static_cast<int64_t>(n) * (context + 1); ++i) {
    dst[i] = static_cast<uint8_t>(rng());
  }
  torch::Tensor tokens = bytes.to(torch::kLong);
  return {tokens.slice(1, 0, context), tokens.slice(1, 1, context + 1)};
}

// The mean loss over `batches` held-out micro-batches. Changes nothing: no
// gradients, no random numbers (the batches are a pure function of the seed),
// so training after it is bit for bit training without it.
double HeldOutLoss(GPT& model, const std::string& val, const TrainerOptions& options, int batches) {
  if (batches == 0) return std::nan("");
  torch::NoGradGuard no_grad;
  double total = 0;
  for (int b = 0; b < batches; ++b) {
    // A fixed held-out set: "step" -1 - b never occurs in training.
    auto offsets = SequenceOffsets(options.seed, -1 - b, 0, options.micro_batch,
                                   options.model.context, val.size());
    auto [x, y] = MakeBatch(val, offsets, options.model.context);
    total += model->Loss(x, y).item<double>();
  }
  return total / batches;
}

std::string Generate(GPT& model, const std::string& prompt, int tokens, double temperature,
                     uint64_t seed) {
  std::string p = prompt.empty() ? "\n" : prompt;
  torch::Tensor ids = torch::empty({static_cast<int64_t>(p.size())}, torch::kLong);
  for (size_t i = 0; i < p.size(); ++i) ids[i] = static_cast<int64_t>(static_cast<uint8_t>(p[i]));
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  model->eval();
  torch::Tensor out = model->Generate(ids, tokens, temperature, gen);
  std::string text;
  for (int64_t i = 0; i < out.size(0); ++i)
    text.push_back(static_cast<char>(out[i].item<int64_t>()));
  return text;
}

// ---- Data parallelism ----

// The agent offered a later generation while a collective waited: the
// process group is abandoned and the rank rejoins (in-process restart).
struct RejoinOffered : std::runtime_error {
  RejoinOffered() : std::runtime_error("the agent offered a later generation") {}
};

// Waits for `work`. With `session` (the agent offers in-process restarts),
// the wait is cut short when the agent offers a later generation: a peer
// failed, and a collective blocked on it (a hung peer, or one whose sockets
// linger) must not be waited out. A collective that failed rethrows. The
// wait sleeps on the work's future (no polling of the work, no timed-out
// waits, whose exceptions each capture a backtrace) and looks for an offer
// every 20 ms.
void WaitFor(c10d::Work& work, const Session* session) {
  if (session == nullptr) {
    work.wait();
    return;
  }
  struct Done {
    Mutex mu;
    CondVar cv;
    bool done GUARDED_BY(mu) = false;
  };
  auto done = std::make_shared<Done>();
  work.getFuture()->addCallback([done](c10::ivalue::Future&) {
    MutexLock lock(&done->mu);
    done->done = true;
    done->cv.NotifyAll();
  });
  constexpr std::chrono::milliseconds kLook{20};
  while (true) {
    {
      MutexLock lock(&done->mu);
      if (done->cv.WaitFor(lock, kLook, [&]() REQUIRES(done->mu) { return done->done; })) break;
    }
    if (session->RejoinPending()) throw RejoinOffered();
  }
  work.wait();  // done: returns, or throws the collective's error
}

// The global batch's mean gradient, summed exactly over its slots
// (trainer/exact_sum.h), so that it does not depend on how many ranks there
// are or which slots each computed: a job that shrinks or grows trains the
// same parameters bit for bit. Each rank keeps the gradients of its slots
// (one copy of the parameters' size per slot it computes); one MAX
// allreduce agrees on each bucket's scale, then one int64 SUM allreduce per
// bucket adds the fixed-point partial sums. The step's loss rides in the
// last bucket, so every rank logs the same global loss. A world of one rank
// has no group and sums alone, by the same arithmetic.
class GradientReducer {
 public:
  // `group`: null in a world of one. `session` (may be null): cut a wait
  // short when the agent offers a later generation (WaitFor).
  GradientReducer(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<torch::Tensor> params,
                  double bucket_mb, const Session* session)
      : group_(std::move(group)), params_(std::move(params)), session_(session) {
    const int64_t limit = static_cast<int64_t>(bucket_mb * 1024 * 1024 / sizeof(float));
    int64_t size = 0;
    buckets_.emplace_back();
    for (size_t i = 0; i < params_.size(); ++i) {
      if (size > 0 && size + params_[i].numel() > limit) {
        buckets_.emplace_back();
        size = 0;
      }
      buckets_.back().push_back(i);
      size += params_[i].numel();
    }
  }

  // The backward pass of one of this rank's slots is done: keeps its
  // gradients (the parameters' are cleared for the next slot) and its loss,
  // already divided by the number of slots.
  void TakeSlot(float loss) {
    std::vector<torch::Tensor> grads;
    for (torch::Tensor& p : params_) {
      grads.push_back(p.grad().defined() ? p.grad().contiguous() : torch::zeros_like(p));
      p.mutable_grad() = torch::Tensor();
    }
    slots_.push_back(std::move(grads));
    losses_.push_back(loss);
  }

  // Sums the slots taken on every rank (`total_slots` of them) into each
  // parameter's gradient; returns the mean loss.
  double Reduce(int total_slots) {
    // Taken first: a failed collective leaves nothing behind for the next try.
    std::vector<std::vector<torch::Tensor>> slots = std::move(slots_);
    std::vector<float> losses = std::move(losses_);
    slots_.clear();
    losses_.clear();
    ENDURE_CHECK(!slots.empty());
    const size_t nb = buckets_.size();
    torch::Tensor maxes = torch::zeros({static_cast<int64_t>(nb + 1)}, torch::kFloat);
    float* m = maxes.data_ptr<float>();
    for (const auto& grads : slots) {
      for (size_t b = 0; b < nb; ++b) {
        for (size_t i : buckets_[b]) {
          m[b] = MaxAbs(grads[i].data_ptr<float>(), grads[i].numel(), m[b]);
        }
      }
    }
    m[nb] = MaxAbs(losses.data(), losses.size(), 0);
    if (group_) {
      c10d::AllreduceOptions max;
      max.reduceOp = c10d::ReduceOp::MAX;
      std::vector<torch::Tensor> io = {maxes};
      WaitFor(*group_->allreduce(io, max), session_);
    }
    auto exponent = [&](size_t b) {
      return std::isfinite(m[b]) ? FixedPointExponent(m[b], total_slots) : 0;
    };
    std::vector<torch::Tensor> sums;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t b = 0; b < nb; ++b) {
      int64_t n = b + 1 == nb ? 1 : 0;
      for (size_t i : buckets_[b]) n += params_[i].numel();
      torch::Tensor sum = torch::zeros({n}, torch::kLong);
      int64_t* acc = sum.data_ptr<int64_t>();
      for (const auto& grads : slots) {
        int64_t offset = 0;
        for (size_t i : buckets_[b]) {
          // A non-finite bucket's sum is NaN on every rank (below).
          if (std::isfinite(m[b])) {
            AccumulateFixed(grads[i].data_ptr<float>(), grads[i].numel(), exponent(b),
                            acc + offset);
          }
          offset += grads[i].numel();
        }
      }
      if (b + 1 == nb && std::isfinite(m[nb])) {
        const int64_t at = n - 1;  // the one element after the gradients
        for (const float& l : losses) AccumulateFixed(&l, 1, exponent(nb), acc + at);
      }
      if (group_) {
        std::vector<torch::Tensor> io = {sum};
        works.push_back(group_->allreduce(io));
      }
      sums.push_back(sum);
    }
    for (auto& w : works) WaitFor(*w, session_);
    double loss = 0;
    for (size_t b = 0; b < nb; ++b) {
      const int64_t* acc = sums[b].data_ptr<int64_t>();
      int64_t offset = 0;
      for (size_t i : buckets_[b]) {
        torch::Tensor g = slots[0][i];  // reused as the result
        if (std::isfinite(m[b])) {
          FromFixed(acc + offset, g.numel(), exponent(b), g.data_ptr<float>());
        } else {
          g.fill_(std::numeric_limits<float>::quiet_NaN());
        }
        params_[i].mutable_grad() = g;
        offset += g.numel();
      }
      if (b + 1 == nb) {
        loss = std::isfinite(m[nb]) ? std::ldexp(static_cast<double>(acc[offset]), -exponent(nb))
                                    : std::numeric_limits<double>::quiet_NaN();
      }
    }
    return loss;
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<torch::Tensor> params_;
  const Session* session_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<std::vector<torch::Tensor>> slots_;  // this rank's slots of the step, in order
  std::vector<float> losses_;
};

struct Cluster {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

// Waits until something listens at addr:port (at most `timeout`). c10d's
// TCPStore client retries a refused connection only after about a second,
// which a restarted worker that beats rank 0's store would pay in full.
void WaitUntilListening(const std::string& addr, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &info) != 0) return;
  const auto deadline = Clock::now() + timeout;
  bool connected = false;
  while (!connected && Clock::now() < deadline) {
    for (addrinfo* a = info; a != nullptr && !connected; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
      ::close(fd);
    }
    if (!connected) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  freeaddrinfo(info);
}

Cluster Connect(const DistEnv& dist, const TrainerOptions& options) {
  Cluster c;
  // Under torchrun the agent already hosts the store at MASTER_PORT; rank 0
  // hosts it otherwise. Keys live under a per-attempt prefix so that a
  // restarted worker set never reads a previous attempt's keys.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool use_agent_store = agent_store != nullptr && std::string(agent_store) == "True";
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(dist.master_port);
  store_options.isServer = dist.rank == 0 && !use_agent_store;
  if (!store_options.isServer) {
    WaitUntilListening(dist.master_addr, dist.master_port,
                       std::chrono::seconds(options.collective_timeout_s));
  }
  store_options.waitWorkers = !use_agent_store;
  store_options.numWorkers = static_cast<size_t>(dist.world_size);
  store_options.timeout = std::chrono::seconds(options.collective_timeout_s);
  c.store = c10::make_intrusive<c10d::PrefixStore>(
      std::string("endure/attempt_") + (attempt != nullptr ? attempt : "0"),
      c10::make_intrusive<c10d::TCPStore>(dist.master_addr, store_options));
  auto gloo_options =
      c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(options.collective_timeout_s));
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (dist.master_addr.rfind("127.", 0) == 0 || dist.master_addr == "localhost") {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  c.group = c10::make_intrusive<c10d::ProcessGroupGloo>(c.store, dist.rank, dist.world_size,
                                                        gloo_options);
  return c;
}

// ---- In-process restart: the state from a data-parallel peer ----

// Joins the training state of the ranks of a new generation over `group`:
// each rank says how many steps it completed (-1: it starts fresh, holding
// no state), and the lowest rank that completed the most broadcasts its
// parameters, optimizer moments and RNG state to every rank. Ranks already
// there keep theirs (they are identical: data-parallel replicas); the ones
// behind (a fresh replacement, a survivor whose last allreduce failed while
// a peer's succeeded) take the broadcast. Returns the steps completed, now
// the same on every rank. kDataLoss when no rank holds any state.
Result<int64_t> JoinPeerState(c10d::ProcessGroup& group, const DistEnv& dist, int64_t completed,
                              GPT& model, torch::optim::AdamW& optimizer,
                              const TrainerOptions& options) {
  // [steps completed, optimizer steps taken] of every rank.
  int64_t adam_step = -1;
  if (completed >= 0) {
    adam_step = 0;
    for (const auto& p : model->named_parameters()) {
      auto it = optimizer.state().find(OptimizerKey(p.value()));
      if (it != optimizer.state().end()) {
        adam_step = static_cast<torch::optim::AdamWParamState&>(*it->second).step();
      }
    }
  }
  std::vector<torch::Tensor> mine = {torch::tensor({completed, adam_step}, torch::kLong)};
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < dist.world_size; ++r) all[0].push_back(torch::empty({2}, torch::kLong));
  group.allgather(all, mine)->wait();
  int64_t best = -1, source = -1, best_adam = 0;
  bool behind = false;
  for (int r = 0; r < dist.world_size; ++r) {
    const int64_t steps = all[0][r][0].item<int64_t>();
    if (steps > best) {
      best = steps;
      source = r;
      best_adam = all[0][r][1].item<int64_t>();
    }
  }
  for (int r = 0; r < dist.world_size; ++r) behind |= all[0][r][0].item<int64_t>() != best;
  if (best < 0) return DataLoss("no rank of the new generation holds the training state");
  if (!behind) return best;
  const bool receive = completed != best;
  torch::NoGradGuard no_grad;
  if (receive && best_adam > 0) {
    // Moments of the right shape to receive into.
    for (const auto& p : model->named_parameters()) {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->exp_avg(torch::zeros_like(p.value()));
      s->exp_avg_sq(torch::zeros_like(p.value()));
      optimizer.state()[OptimizerKey(p.value())] = std::move(s);
    }
  }
  if (receive) {
    for (auto& [key, state] : optimizer.state()) {
      static_cast<torch::optim::AdamWParamState&>(*state).step(best_adam);
    }
  }
  // Every float tensor of the state in one buffer, then the RNG state.
  StateParts parts = CollectState(model, optimizer, best, options);
  std::vector<torch::Tensor> floats;
  torch::Tensor rng;
  for (const auto& [name, t] : parts.tensors) {
    if (name == "rng/cpu") {
      rng = t;
    } else {
      floats.push_back(t);
    }
  }
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& t : floats) flat.push_back(t.reshape({-1}));
  std::vector<torch::Tensor> io = {torch::cat(flat)};
  std::vector<torch::Tensor> rng_io = {rng.contiguous()};
  c10d::BroadcastOptions from;
  from.rootRank = static_cast<int>(source);
  group.broadcast(io, from)->wait();
  group.broadcast(rng_io, from)->wait();
  if (receive) {
    int64_t offset = 0;
    for (torch::Tensor& t : floats) {
      t.copy_(io[0].slice(0, offset, offset + t.numel()).view_as(t));
      offset += t.numel();
    }
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng_io[0]);
  }
  return best;
}

// The corpus a warm standby loaded ahead of its assignment (WarmUp), for
// the options it was loaded with.
struct LoadedCorpus {
  std::vector<std::string> data;
  double val_fraction = 0;
  Corpus corpus;
};
std::optional<LoadedCorpus>& PreloadedCorpus() {
  static std::optional<LoadedCorpus> loaded;
  return loaded;
}

// The corpus of `options`: the preloaded one when it matches (once), else
// read now.
Result<Corpus> TakeCorpus(const TrainerOptions& options) {
  std::optional<LoadedCorpus>& pre = PreloadedCorpus();
  if (pre && pre->data == options.data && pre->val_fraction == options.val_fraction) {
    Corpus corpus = std::move(pre->corpus);
    pre.reset();
    return corpus;
  }
  pre.reset();
  return LoadCorpus(options.data, options.val_fraction);
}

// ---- Progress output (rank 0) ----

class Progress {
 public:
  explicit Progress(const TrainerOptions& options)
      : options_(options), tty_(isatty(STDOUT_FILENO) == 1) {
    if (!options.metrics_file.empty()) metrics_.open(options.metrics_file, std::ios::app);
  }
  bool metrics_ok() const { return options_.metrics_file.empty() || metrics_.good(); }

  void Step(int64_t step, double loss, double lr, double step_s, double compute_s, double comm_s,
            double ckpt_s) {
    const int64_t done = step + 1;
    const double tokens = double(options_.global_batch) * options_.model.context;
    window_s_ += step_s;
    window_compute_s_ += compute_s;
    window_comm_s_ += comm_s;
    window_ckpt_s_ += ckpt_s;
    ++window_steps_;
    const bool log = done % options_.log_every == 0 || done == options_.steps;
    if (!log && !tty_) return;
    const double n = window_steps_;
    char line[256];
    std::snprintf(line, sizeof line,
                  "step %6lld/%lld | loss %.4f | lr %.2e | %7.0f tok/s | %6.1f ms/step "
                  "(compute %.1f, allreduce-wait %.1f, checkpoint %.2f)",
                  static_cast<long long>(done), static_cast<long long>(options_.steps), loss, lr,
                  tokens * n / window_s_, 1e3 * window_s_ / n, 1e3 * window_compute_s_ / n,
                  1e3 * window_comm_s_ / n, 1e3 * window_ckpt_s_ / n);
    std::printf(tty_ ? "\r\033[K%s%s" : "%s%s", line, log ? "\n" : "");
    std::fflush(stdout);
    if (!log) return;
    if (metrics_.is_open()) {
      nlohmann::json j = {{"step", done},
                          {"loss", loss},
                          {"lr", lr},
                          {"tokens_per_s", tokens * n / window_s_},
                          {"ms_per_step", 1e3 * window_s_ / n},
                          {"compute_ms", 1e3 * window_compute_s_ / n},
                          {"allreduce_wait_ms", 1e3 * window_comm_s_ / n},
                          {"checkpoint_ms", 1e3 * window_ckpt_s_ / n}};
      metrics_ << j.dump() << "\n";
      metrics_.flush();
    }
    window_s_ = window_compute_s_ = window_comm_s_ = window_ckpt_s_ = 0;
    window_steps_ = 0;
  }

 private:
  const TrainerOptions& options_;
  bool tty_;
  std::ofstream metrics_;
  double window_s_ = 0, window_compute_s_ = 0, window_comm_s_ = 0, window_ckpt_s_ = 0;
  int64_t window_steps_ = 0;
};

// The flags, with the agent's instructions in their place where it gave any.
TrainerOptions ApplySession(TrainerOptions options, const Session& session) {
  if (!session.checkpoint_dir().empty()) options.ckpt_dir = session.checkpoint_dir();
  if (session.checkpoint_every()) options.ckpt_every = *session.checkpoint_every();
  return options;
}

// The newest step a restore may use: nullopt for a fresh start.
std::optional<int64_t> RestoreLimit(const TrainerOptions& options, const Session& session) {
  if (options.ckpt_dir.empty()) return std::nullopt;
  if (!session.restore_step()) {
    return options.resume ? std::optional<int64_t>(INT64_MAX) : std::nullopt;
  }
  const int64_t step = *session.restore_step();
  if (step == -1) return INT64_MAX;
  if (step == 0) return std::nullopt;
  return step;
}

Result<TrainSummary> TrainImpl(const TrainerOptions& flags, const DistEnv& first_dist,
                               Session& session) {
  const TrainerOptions options = ApplySession(flags, session);
  // This rank's place in the world: an in-process restart may change it (a
  // job that shrinks after a lost node, or grows back).
  DistEnv dist = first_dist;
  ENDURE_RETURN_IF_ERROR(options.Validate(dist.world_size));
  bool leader = dist.rank == 0;
  ENDURE_ASSIGN_OR_RETURN(Corpus corpus, TakeCorpus(options));
  KeepFreedMemory();
  SetThreads(ThreadsPerRank(options));

  torch::manual_seed(options.seed);
  GPT model(options.model);
  std::vector<torch::Tensor> decay, no_decay, params;
  for (const auto& p : model->named_parameters()) {
    (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
    params.push_back(p.value());
  }
  using torch::optim::AdamWOptions;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      decay, std::make_unique<AdamWOptions>(
                 AdamWOptions(options.lr).betas({0.9, 0.95}).weight_decay(options.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<AdamWOptions>(
                                    AdamWOptions(options.lr).betas({0.9, 0.95}).weight_decay(0)));
  torch::optim::AdamW optimizer(std::move(groups), AdamWOptions(options.lr));

  // In-process restart: with the agent offering it, a failed collective is
  // not the end of this process; it rejoins the next generation, which may
  // have fewer or more ranks (a world of one rejoins when the job grows).
  const bool rejoins = session.rejoin_offered_here();
  if (rejoins) {
    session.DeclareRejoin();
    // A step whose peer died stops at its next block or gradient once the
    // agent offers the next generation, instead of computing to its end a
    // step that cannot complete (RejoinPending reads the session's watch).
    model->StopStepsWhen([&session] { return session.RejoinPending(); });
  }
  // Seeded data, fixed-point gradient sums: a replayed step's loss is the
  // same bit for bit (trainer/exact_sum.h).
  session.DeclareDeterministic();
  Cluster cluster;
  if (dist.world_size > 1) cluster = Connect(dist, options);
  auto reducer = std::make_unique<GradientReducer>(cluster.group, params, options.bucket_mb,
                                                   rejoins ? &session : nullptr);

  TrainSummary summary;
  if (!options.ckpt_dir.empty())
    ENDURE_RETURN_IF_ERROR(Env::Default()->CreateDirs(options.ckpt_dir));
  // --disk-full-step: the checkpoint directory through an Env whose writes
  // fail with ENOSPC once that step is reached.
  std::unique_ptr<FaultInjectionEnv> disk_full;
  if (options.disk_full_step > 0 && !options.ckpt_dir.empty()) {
    disk_full = std::make_unique<FaultInjectionEnv>(Env::Default(), options.ckpt_dir,
                                                    /*real_syncs=*/true);
  }
  checkpoint::CheckpointDir ckpt(disk_full ? disk_full.get() : Env::Default(), options.ckpt_dir);
  const auto restore_start = Clock::now();
  if (session.peer_restore() && cluster.group) {
    // Started fresh into a generation whose other ranks kept their state.
    ENDURE_ASSIGN_OR_RETURN(summary.start_step,
                            JoinPeerState(*cluster.group, dist, -1, model, optimizer, options));
    if (leader) {
      std::printf("restored step %lld from a data-parallel peer\n",
                  static_cast<long long>(summary.start_step));
    }
  } else if (const auto& plan = session.restore_plan()) {
    // The agent chose the restore point across the checkpoint tiers.
    if (plan->step > 0) {
      ENDURE_ASSIGN_OR_RETURN(TrainingState state,
                              LoadPlanned(*plan, dist, cluster.group.get(), session));
      if (ModelFromJson(state.meta.value("model", nlohmann::json::object())) != options.model) {
        return InvalidArgument("checkpoint step " + std::to_string(plan->step) +
                               " holds a model of config " + state.meta["model"].dump() +
                               "; pass the same --layers/--d-model/--heads/--context");
      }
      ENDURE_RETURN_IF_ERROR(RestoreState(state, model, &optimizer));
      summary.start_step = plan->step;
    }
    if (leader && plan->step > 0) std::printf("restored %s\n", plan->summary.c_str());
  } else if (const std::optional<int64_t> limit = RestoreLimit(options, session)) {
    // Rank 0 chooses the restore point; every rank loads that same step.
    int64_t step = -1;
    std::optional<TrainingState> chosen;  // rank 0 keeps what it verified and loaded
    if (leader) {
      std::vector<std::string> refused;
      Result<TrainingState> newest = ckpt.LoadNewestAtOrBefore(*limit, &refused);
      for (const std::string& why : refused) std::printf("resume: refused %s\n", why.c_str());
      if (newest.ok()) {
        step = newest->step;
        chosen = std::move(newest).value();
      }
    }
    if (cluster.store) {
      const std::string key = "endure/resume_step";
      if (leader) {
        std::string s = std::to_string(step);
        cluster.store->set(key, std::vector<uint8_t>(s.begin(), s.end()));
      } else {
        std::vector<uint8_t> v = cluster.store->get(key);
        step = std::stoll(std::string(v.begin(), v.end()));
      }
    }
    if (step >= 0) {
      if (!chosen) {
        ENDURE_ASSIGN_OR_RETURN(chosen, ckpt.Load(step));
      }
      const TrainingState& state = *chosen;
      if (ModelFromJson(state.meta.value("model", nlohmann::json::object())) != options.model) {
        return InvalidArgument("checkpoint " + ckpt.StepDir(step) + " holds a model of config " +
                               state.meta["model"].dump() +
                               "; pass the same --layers/--d-model/--heads/--context");
      }
      ENDURE_RETURN_IF_ERROR(RestoreState(state, model, &optimizer));
      summary.start_step = step;
      if (leader)
        std::printf("resumed from %s (step %lld)\n", ckpt.StepDir(step).c_str(),
                    static_cast<long long>(step));
    } else if (leader) {
      if (*limit == INT64_MAX) {
        std::printf("resume: no checkpoint in %s verifies; starting from step 0\n",
                    options.ckpt_dir.c_str());
      } else {
        std::printf(
            "resume: no checkpoint at or before step %lld in %s verifies; starting "
            "from step 0\n",
            static_cast<long long>(*limit), options.ckpt_dir.c_str());
      }
    }
  }
  if (leader && !options.ckpt_dir.empty() && !session.peer_restore() && !session.restore_plan() &&
      session.restore_step() && *session.restore_step() != -1) {
    // A rollback (or fresh start) ordered by the agent abandons the steps
    // after its limit: checkpoints taken there must never be restored later,
    // so they go before this timeline commits its own. Steps at or before
    // the limit stay, even those that did not load here: a read error for a
    // moment must not cost a good checkpoint (docs/checkpoints.md).
    const int64_t limit = *session.restore_step();
    for (int64_t later : ckpt.ListSteps()) {
      if (later <= limit) continue;
      ENDURE_RETURN_IF_ERROR(Env::Default()->RemoveAll(ckpt.StepDir(later)));
      std::printf("rollback: removed %s (after the restore limit, step %lld)\n",
                  ckpt.StepDir(later).c_str(), static_cast<long long>(limit));
    }
  }
  const double restore_s = SecondsSince(restore_start);

  if (leader) {
    int64_t n = 0;
    for (const auto& p : params) n += p.numel();
    std::printf(
        "endure-train: %lld parameters, %d ranks, global batch %d (%d micro-batches of %d, "
        "%d on this rank), corpus %zu train / %zu val bytes from %d files\n",
        static_cast<long long>(n), dist.world_size, options.global_batch, options.Slots(),
        options.micro_batch, SlotsOfRank(dist.rank, dist.world_size, options.Slots()).count,
        corpus.train.size(), corpus.val.size(), corpus.files);
    std::fflush(stdout);
  }
  Progress progress(options);
  if (leader && !progress.metrics_ok()) {
    return InvalidArgument("--metrics-file: cannot open '" + options.metrics_file + "'");
  }

  model->train();
  session.SetTokensPerStep(int64_t{options.global_batch} * options.model.context);
  session.SetTotalSteps(options.steps);
  session.Ready(summary.start_step, restore_s, SecondsSinceProcessStart());
  double loss = std::nan("");
  // Abandoned process groups: a collective of theirs may still be blocked
  // on a dead peer, and destroying a group joins its threads. Never freed.
  static auto* abandoned = new std::vector<Cluster>();
  int64_t completed = summary.start_step;  // steps whose update this rank applied
  // Every-step checkpoints into node memory: each step's copy overlaps the
  // next step's compute. The first copy (it sizes the slots and checks the
  // memory budget) and the last are made inside their step.
  // The step reports a copy as its checkpoint when it starts it: the
  // controller's ledger counts the step's work saved from then on (a copy
  // that fails fails the rank at the next step; the restore goes by what the
  // tiers hold, not by these reports).
  BackgroundSave background_save;
  bool first_save = true;
  auto finish_save = [&]() -> Status { return background_save.Wait().status(); };
  // Joins the generation the agent offers (in-process restart), keeping this
  // process and its state: the old group is abandoned, the new one formed
  // (this rank's place and the world's size may differ: a shrink or a
  // regrow), and the ranks agree on the state (JoinPeerState).
  auto rejoin = [&](const std::string& why) -> Status {
    const auto rejoin_start = Clock::now();
    // The state may change hands below: the copy in flight ends first.
    ENDURE_RETURN_IF_ERROR(finish_save());
    first_save = true;  // a new generation: maybe a new world size, new slots
    std::fprintf(stderr, "endure-train: rank %d: %s; rejoining\n", dist.rank, why.c_str());
    std::fflush(stderr);
    if (Status st = session.Rejoin(std::chrono::seconds(options.collective_timeout_s)); !st.ok()) {
      return Internal(why + "; " + st.message());
    }
    ENDURE_ASSIGN_OR_RETURN(DistEnv next, DistEnvFromEnvironment());
    ENDURE_RETURN_IF_ERROR(options.Validate(next.world_size));
    abandoned->push_back(std::move(cluster));
    cluster = Cluster{};
    reducer.reset();
    dist = next;
    leader = dist.rank == 0;
    if (dist.world_size > 1) cluster = Connect(dist, options);
    reducer = std::make_unique<GradientReducer>(cluster.group, params, options.bucket_mb, &session);
    if (cluster.group) {
      ENDURE_ASSIGN_OR_RETURN(
          completed, JoinPeerState(*cluster.group, dist, completed, model, optimizer, options));
    }
    session.Ready(completed, SecondsSince(rejoin_start), SecondsSinceProcessStart());
    if (leader) {
      std::printf("rejoined generation %lld at step %lld as rank %d of %d\n",
                  static_cast<long long>(session.generation()), static_cast<long long>(completed),
                  dist.rank, dist.world_size);
      std::fflush(stdout);
    }
    return Status::Ok();
  };
  for (int64_t step = summary.start_step; step < options.steps; ++step) {
    if (rejoins && session.RejoinPending()) {
      // Offered between steps, with no collective failed: the job changes
      // size (a regrow), or a peer failed while this rank was not waiting.
      ENDURE_RETURN_IF_ERROR(rejoin("a later generation was offered"));
      step = completed;
      if (step >= options.steps) break;
    }
    // An injected fault that ends the process strikes after the copy.
    if (background_save.pending() && session.StopsAt(step)) ENDURE_RETURN_IF_ERROR(finish_save());
    session.BeginStep(step);  // injected kill/exit/hang/log faults fire here
    const auto step_start = Clock::now();
    double ckpt_stall_s = 0;
    const double lr = LearningRate(options, step);
    // Every rank has the same skip list, so all of them leave out the same
    // collectives.
    const bool skip = session.ShouldSkip(step);
    double compute_s = 0, comm_s = 0;
    if (skip) {
      if (leader) {
        std::printf("step %6lld/%lld skipped (ENDURE_SKIP_STEPS)\n",
                    static_cast<long long>(step + 1), static_cast<long long>(options.steps));
        std::fflush(stdout);
      }
    } else {
      for (auto& group : optimizer.param_groups()) {
        static_cast<AdamWOptions&>(group.options()).lr(lr);
      }
      optimizer.zero_grad();
      // This rank's slots of the global batch; their gradients are summed
      // exactly with the other ranks' (GradientReducer).
      const int slots = options.Slots();
      const SlotRange mine = SlotsOfRank(dist.rank, dist.world_size, slots);
      try {
        for (int slot = mine.first; slot < mine.first + mine.count; ++slot) {
          auto offsets =
              SequenceOffsets(options.seed, step, slot * options.micro_batch, options.micro_batch,
                              options.model.context, corpus.train.size());
          auto [x, y] = step + 1 == options.corrupt_batch_step
                            ? RandomBatch(options.seed, step, slot, options.micro_batch,
                                          options.model.context)
                            : MakeBatch(corpus.train, offsets, options.model.context);
          torch::Tensor l = model->Loss(x, y) / slots;  // StepStopped once offered (rejoins)
          if (step + 1 == options.nan_batch_step) l = l * std::nan("");
          l.backward();
          reducer->TakeSlot(l.item<float>());
        }
      } catch (const StepStopped&) {
        ENDURE_RETURN_IF_ERROR(rejoin("step " + std::to_string(step + 1) +
                                      " stopped: a later generation was offered"));
        step = completed - 1;  // the loop goes on with step index `completed`
        continue;
      }
      compute_s = SecondsSince(step_start);
      // The last step's checkpoint copy (overlapped with this step's
      // forward and backward passes) is done before the collective, and so
      // before the update: once any rank is past the collective of step
      // s + 1, every rank's copy of step s is complete, and a stop that a
      // report of step s + 1 causes finds it in node memory.
      if (background_save.pending()) {
        const auto wait_start = Clock::now();
        ENDURE_RETURN_IF_ERROR(finish_save());
        ckpt_stall_s += SecondsSince(wait_start);
      }
      const auto comm_start = Clock::now();
      // Injected comm-fail and comm-slow act here, inside the communication
      // time; also in a world of one, so that a fault behaves the same at any
      // world size.
      session.BeforeCollective(step);
      try {
        loss = reducer->Reduce(slots);
      } catch (const std::exception& e) {
        if (!rejoins) throw;
        // A peer failed (or the job changes size): keep this process and
        // its state, abandon the group, and join the next generation.
        ENDURE_RETURN_IF_ERROR(rejoin("collective of step " + std::to_string(step + 1) +
                                      " failed (" + e.what() + ")"));
        step = completed - 1;  // the loop goes on with step index `completed`
        continue;
      }
      comm_s = SecondsSince(comm_start);
      if (options.grad_clip > 0) torch::nn::utils::clip_grad_norm_(params, options.grad_clip);
      optimizer.step();
    }
    completed = step + 1;

    // Silent data corruption, when injected, lands after the update and
    // before the fingerprint, as a faulty device's would.
    if (std::optional<BitFlip> flip = session.BitflipDue(step)) {
      ApplyBitFlip(model, *flip, dist.rank);
    }
    if (session.FingerprintDue(step)) {
      ENDURE_RETURN_IF_ERROR(session.ReportFingerprint(step, ParamFingerprint(model)));
    }

    const int64_t done = step + 1;
    const bool due =
        (options.ckpt_every > 0 && done % options.ckpt_every == 0) || done == options.steps;
    int64_t checkpoint_step = -1;
    if (due && session.memory_checkpoints()) {
      // Every rank copies its shard into node memory; the agent does the rest.
      const auto ckpt_start = Clock::now();
      ENDURE_RETURN_IF_ERROR(finish_save());  // a skipped step waited for none
      PreparedShard shard = PrepareShard(model, optimizer, done, options, dist);
      if (first_save || done == options.steps) {
        ENDURE_RETURN_IF_ERROR(session.Phase("checkpoint"));
        Result<bool> saved = SaveShard(session, shard);
        if (!saved.ok())
          return saved.status().WithContext("checkpoint at step " + std::to_string(done));
        if (*saved) checkpoint_step = done;
        ENDURE_RETURN_IF_ERROR(session.Phase("train"));
        first_save = false;
      } else {
        background_save.Start(session, std::move(shard));
        checkpoint_step = done;
      }
      ckpt_stall_s += SecondsSince(ckpt_start);
    } else if (due && !options.ckpt_dir.empty() && leader) {
      // Data-parallel replicas are identical: rank 0 writes the whole state.
      // Only it is in the checkpoint phase; the others wait for it in the
      // next allreduce.
      if (disk_full && done >= options.disk_full_step) {
        disk_full->FailWritesUnder(options.ckpt_dir, InjectedError::kNoSpace);
      }
      ENDURE_RETURN_IF_ERROR(session.Phase("checkpoint"));
      const auto ckpt_start = Clock::now();
      Result<checkpoint::CommitStats> stats =
          ckpt.Commit(CaptureState(model, optimizer, done, options));
      if (!stats.ok())
        return stats.status().WithContext("checkpoint at step " + std::to_string(done));
      ENDURE_RETURN_IF_ERROR(ckpt.Retain(options.ckpt_keep));
      ckpt_stall_s += SecondsSince(ckpt_start);
      checkpoint_step = done;
      ENDURE_RETURN_IF_ERROR(session.Phase("train"));
    }
    if (skip) {
      session.EndSkippedStep(step, ckpt_stall_s, checkpoint_step);
    } else {
      // The loss as logged: an injected `nan` fault shows here, while the
      // model itself is untouched.
      const double logged_loss =
          session.EndStep(step, loss, compute_s, comm_s, ckpt_stall_s, checkpoint_step).value();
      if (leader)
        progress.Step(step, logged_loss, lr, SecondsSince(step_start), compute_s, comm_s,
                      ckpt_stall_s);
    }
    if (options.eval_every > 0 && done % options.eval_every == 0) {
      // Every rank evaluates (the same held-out batches), each in its own
      // "eval" phase, after the step was reported: its time is no step's.
      ENDURE_RETURN_IF_ERROR(session.Phase("eval"));
      const auto eval_start = Clock::now();
      const double eval_loss = HeldOutLoss(model, corpus.val, options, options.eval_steps);
      ENDURE_RETURN_IF_ERROR(session.Phase("train"));
      if (leader) {
        std::printf("eval after step %lld/%lld | loss %.4f | %d batches in %.1f ms\n",
                    static_cast<long long>(done), static_cast<long long>(options.steps), eval_loss,
                    options.eval_steps, 1e3 * SecondsSince(eval_start));
        std::fflush(stdout);
      }
    }
  }

  ENDURE_RETURN_IF_ERROR(finish_save());
  summary.steps = options.steps;
  summary.final_loss = loss;
  summary.fingerprint = ParamFingerprint(model);
  if (leader) {
    // The final evaluation and sample take longer than a step: they are a
    // phase of their own, with its own timeout, and no hang.
    ENDURE_RETURN_IF_ERROR(session.Phase("eval"));
    summary.val_loss = HeldOutLoss(model, corpus.val, options, options.eval_batches);
    std::printf("validation loss %.4f\n", summary.val_loss);
    if (options.sample_tokens > 0) {
      summary.sample =
          Generate(model, options.sample_prompt, options.sample_tokens, 0.8, options.seed);
      std::printf("--- sample ---\n%s\n--------------\n", summary.sample.c_str());
    }
    std::printf("param_fingerprint=%s\n", summary.fingerprint.c_str());
    std::fflush(stdout);
  }
  return summary;
}

}  // namespace

void WarmUp(const TrainerOptions& options) {
  // A replacement's start reads the corpus: read it now (an error is
  // reported by the real start, which reads it again).
  if (Result<Corpus> corpus = LoadCorpus(options.data, options.val_fraction); corpus.ok()) {
    PreloadedCorpus() = LoadedCorpus{options.data, options.val_fraction, std::move(corpus).value()};
  }
  try {
    KeepFreedMemory();
    SetThreads(ThreadsPerRank(options));
    GPT model(options.model);
    torch::Tensor x = torch::randint(0, options.model.vocab,
                                     {options.micro_batch, options.model.context}, torch::kLong);
    model->Loss(x, x).backward();
  } catch (const std::exception&) {
    // Only an optimisation: the real start reports any real problem.
  }
}

Result<DistEnv> DistEnvFromEnvironment() {
  DistEnv d;
  const char* world = std::getenv("WORLD_SIZE");
  if (world == nullptr || *world == '\0') return d;
  ENDURE_ASSIGN_OR_RETURN(d.world_size, EnvInt("WORLD_SIZE", 1));
  if (d.world_size < 1) return InvalidArgument("WORLD_SIZE must be at least 1");
  ENDURE_ASSIGN_OR_RETURN(d.rank, EnvInt("RANK", 0));
  ENDURE_ASSIGN_OR_RETURN(d.local_rank, EnvInt("LOCAL_RANK", d.rank));
  ENDURE_ASSIGN_OR_RETURN(d.local_world_size, EnvInt("LOCAL_WORLD_SIZE", d.world_size));
  if (d.local_world_size < 1) d.local_world_size = 1;
  if (d.rank >= d.world_size) {
    return InvalidArgument("RANK=" + std::to_string(d.rank) +
                           " is not below WORLD_SIZE=" + std::to_string(d.world_size));
  }
  if (d.world_size == 1) return d;
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') {
    return InvalidArgument("WORLD_SIZE=" + std::to_string(d.world_size) +
                           " is set but MASTER_ADDR is not: set MASTER_ADDR and MASTER_PORT (as "
                           "torchrun does), or unset WORLD_SIZE to run as one process");
  }
  d.master_addr = addr;
  ENDURE_ASSIGN_OR_RETURN(d.master_port, EnvInt("MASTER_PORT", 29500));
  if (d.master_port < 1 || d.master_port > 65535) {
    return InvalidArgument("MASTER_PORT must be a TCP port (1-65535)");
  }
  return d;
}

Result<TrainSummary> Train(const TrainerOptions& options, const DistEnv& dist, Session* session) {
  std::unique_ptr<Session> disabled;
  if (session == nullptr) {
    disabled = Session::Disabled();
    session = disabled.get();
  }
  try {
    return TrainImpl(options, dist, *session);
  } catch (const c10::Error& e) {
    return Internal(std::string("libtorch: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal(e.what());
  }
}

Result<std::string> SampleFromCheckpoint(const SampleOptions& options) {
  try {
    checkpoint::CheckpointDir ckpt(Env::Default(), options.ckpt_dir);
    std::vector<std::string> refused;
    Result<TrainingState> state = ckpt.LoadNewest(&refused);
    for (const std::string& why : refused) std::fprintf(stderr, "refused %s\n", why.c_str());
    if (!state.ok()) {
      return InvalidArgument("--ckpt-dir: no checkpoint in '" + options.ckpt_dir +
                             "' verifies (train with --ckpt-dir first)");
    }
    GPT model(ModelFromJson(state->meta.value("model", nlohmann::json::object())));
    ENDURE_RETURN_IF_ERROR(RestoreState(*state, model, nullptr));
    return Generate(model, options.prompt, options.tokens, options.temperature, options.seed);
  } catch (const c10::Error& e) {
    return Internal(std::string("libtorch: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Internal(e.what());
  }
}

}  // namespace endure::trainer
