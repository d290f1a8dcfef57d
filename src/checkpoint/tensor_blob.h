// TensorBlob: a tensor as plain bytes plus its name, dtype and shape, so that
// checkpoints are written and verified without libtorch. The trainer converts
// to and from torch::Tensor at its boundary. EncodeTensors/DecodeTensors give
// a self-describing, bounds-checked binary form.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace endure::checkpoint {

struct TensorBlob {
  std::string name;            // unique within a state, e.g. "model/blocks.0.attn.qkv.weight"
  std::string dtype;           // "float32", "float64", "int64", "uint8"
  std::vector<int64_t> shape;  // empty for a scalar
  std::string data;            // row-major, contiguous, host byte order

  bool operator==(const TensorBlob&) const = default;
};

// Bytes per element of `dtype`, or 0 for an unknown dtype.
size_t DTypeSize(std::string_view dtype);

// A tensor to be saved, seen in place: EncodeTensorsInto copies straight
// from `data`, with no intermediate buffer (the checkpoint stall is that copy).
struct TensorView {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // `bytes` bytes, row-major, contiguous
  size_t bytes = 0;
};

TensorView ViewOf(const TensorBlob& blob);

std::string EncodeTensors(const std::vector<TensorBlob>& tensors);

// The exact size EncodeTensorsInto writes for `tensors`.
size_t EncodedSize(const std::vector<TensorView>& tensors);
// Writes the EncodeTensors form of `tensors` to `out`, which must hold
// EncodedSize(tensors) bytes. With a `hasher`, also hashes what it wrote, a
// piece at a time while it is still in the cache (the same digest as
// Xxh3 over the whole).
void EncodeTensorsInto(const std::vector<TensorView>& tensors, char* out,
                       Xxh3Hasher* hasher = nullptr);

// Parses EncodeTensors output. Truncation, a bad magic number or sizes that
// do not add up give kDataLoss naming `source` (a file name, for messages).
Result<std::vector<TensorBlob>> DecodeTensors(std::string_view bytes, const std::string& source);

// One shard of a checkpoint: the JSON metadata (which holds "step") travels
// as a first uint8 tensor named "meta.json", then the shard's tensors, all
// in the EncodeTensors form.
std::vector<TensorView> ShardViews(const std::string& meta_text, std::vector<TensorView> tensors);

struct DecodedShard {
  nlohmann::json meta;
  std::vector<TensorBlob> tensors;
};
// Parses a shard; kDataLoss naming `source` when it is not one.
Result<DecodedShard> DecodeShard(std::string_view bytes, const std::string& source);

// Splits tensors of the given sizes among `shards` savers: each tensor, in
// order, goes to the shard with the fewest bytes so far (ties: the lowest).
// Every rank computes the same assignment from the same list.
std::vector<int> PartitionBySize(const std::vector<uint64_t>& bytes, int shards);

}  // namespace endure::checkpoint
