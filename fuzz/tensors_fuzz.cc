// Fuzz target: checkpoint::DecodeTensors and DecodeShard, which read every
// checkpoint shard (disk, node memory, a peer's replica), on any bytes.
// The encoding is canonical: bytes that decode re-encode to themselves.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "checkpoint/tensor_blob.h"
#include "fuzz/fuzz_util.h"

using namespace endure;
using checkpoint::TensorBlob;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes = fuzz::AsText(data, size);
  Result<std::vector<TensorBlob>> tensors = checkpoint::DecodeTensors(bytes, "fuzz.bin");
  Result<checkpoint::DecodedShard> shard = checkpoint::DecodeShard(bytes, "fuzz.bin");
  if (!tensors.ok()) {
    FUZZ_CHECK(tensors.status().code() == StatusCode::kDataLoss);
    FUZZ_CHECK(!shard.ok() && shard.status().code() == StatusCode::kDataLoss);
    return 0;
  }
  std::vector<uint64_t> sizes;
  for (const TensorBlob& t : *tensors) {
    const size_t elem = checkpoint::DTypeSize(t.dtype);
    FUZZ_CHECK(elem > 0 && t.shape.size() <= 16);
    // Without wrap-around: a shape whose element count overflows describes
    // more data than any tensor holds.
    const bool empty = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
    uint64_t bytes_needed = empty ? 0 : elem;
    for (int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0);
      FUZZ_CHECK(!__builtin_mul_overflow(bytes_needed, static_cast<uint64_t>(d), &bytes_needed));
    }
    FUZZ_CHECK(t.data.size() == bytes_needed);
    sizes.push_back(t.data.size());
  }
  FUZZ_CHECK(checkpoint::EncodeTensors(*tensors) == bytes);

  std::vector<checkpoint::TensorView> views;
  for (const TensorBlob& t : *tensors) views.push_back(checkpoint::ViewOf(t));
  FUZZ_CHECK(checkpoint::EncodedSize(views) == size);

  const std::vector<int> owners = checkpoint::PartitionBySize(sizes, 3);
  FUZZ_CHECK(owners.size() == sizes.size());
  for (int o : owners) FUZZ_CHECK(o >= 0 && o < 3);

  if (shard.ok()) {
    FUZZ_CHECK(shard->meta.is_object() && shard->meta["step"].is_number_integer());
    FUZZ_CHECK(shard->tensors.size() + 1 == tensors->size());
    FUZZ_CHECK((*tensors)[0].name == "meta.json");
  } else {
    FUZZ_CHECK(shard.status().code() == StatusCode::kDataLoss);
  }
  return 0;
}
