// TensorBlob: a tensor as plain bytes plus its name, dtype and shape, so that
// checkpoints are written and verified without libtorch. The trainer converts
// to and from torch::Tensor at its boundary. EncodeTensors/DecodeTensors give
// a self-describing, bounds-checked binary form.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

std::string EncodeTensors(const std::vector<TensorBlob>& tensors);

// Parses EncodeTensors output. Truncation, a bad magic number or sizes that
// do not add up give kDataLoss naming `source` (a file name, for messages).
Result<std::vector<TensorBlob>> DecodeTensors(std::string_view bytes, const std::string& source);

}  // namespace endure::checkpoint
