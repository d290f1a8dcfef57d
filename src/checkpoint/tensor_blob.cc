// Binary layout: "ENDTNSR1", u32 count, then per tensor: u32 name length,
// name, u32 dtype length, dtype, u32 rank, i64 dims[rank], u64 byte count,
// bytes. Integers are little-endian (host order on every supported machine).
#include "checkpoint/tensor_blob.h"

#include <algorithm>
#include <cstring>

namespace endure::checkpoint {
namespace {

constexpr std::string_view kMagic = "ENDTNSR1";
constexpr size_t kPiece = 256 << 10;  // copied, then hashed while still in L2

class Reader {
 public:
  Reader(std::string_view bytes, const std::string& source) : bytes_(bytes), source_(source) {}

  template <typename T>
  Status Get(T* v) {
    if (bytes_.size() < sizeof(T)) return Truncated();
    std::memcpy(v, bytes_.data(), sizeof(T));
    bytes_.remove_prefix(sizeof(T));
    return Status::Ok();
  }
  Status GetBytes(uint64_t n, std::string* out) {
    if (bytes_.size() < n) return Truncated();
    out->assign(bytes_.data(), n);
    bytes_.remove_prefix(n);
    return Status::Ok();
  }
  size_t remaining() const { return bytes_.size(); }
  Status Truncated() const { return DataLoss(source_ + ": truncated tensor data"); }

 private:
  std::string_view bytes_;
  const std::string& source_;
};

}  // namespace

size_t DTypeSize(std::string_view dtype) {
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "float64" || dtype == "int64") return 8;
  if (dtype == "uint8" || dtype == "int8" || dtype == "bool") return 1;
  if (dtype == "float16" || dtype == "bfloat16" || dtype == "int16") return 2;
  return 0;
}

TensorView ViewOf(const TensorBlob& blob) {
  return {blob.name, blob.dtype, blob.shape, blob.data.data(), blob.data.size()};
}

size_t EncodedSize(const std::vector<TensorView>& tensors) {
  size_t total = kMagic.size() + 4;
  for (const TensorView& t : tensors)
    total += 4 + t.name.size() + 4 + t.dtype.size() + 4 + 8 * t.shape.size() + 8 + t.bytes;
  return total;
}

void EncodeTensorsInto(const std::vector<TensorView>& tensors, char* out, Xxh3Hasher* hasher) {
  auto put = [&out, hasher](const void* p, size_t n) {
    const char* from = static_cast<const char*>(p);
    while (n > 0) {
      const size_t k = std::min(n, kPiece);
      std::memcpy(out, from, k);
      if (hasher != nullptr) hasher->Update(out, k);
      out += k;
      from += k;
      n -= k;
    }
  };
  auto put_u32 = [&put](uint32_t v) { put(&v, sizeof v); };
  put(kMagic.data(), kMagic.size());
  put_u32(static_cast<uint32_t>(tensors.size()));
  for (const TensorView& t : tensors) {
    put_u32(static_cast<uint32_t>(t.name.size()));
    put(t.name.data(), t.name.size());
    put_u32(static_cast<uint32_t>(t.dtype.size()));
    put(t.dtype.data(), t.dtype.size());
    put_u32(static_cast<uint32_t>(t.shape.size()));
    put(t.shape.data(), 8 * t.shape.size());
    const uint64_t n = t.bytes;
    put(&n, sizeof n);
    put(t.data, t.bytes);
  }
}

std::string EncodeTensors(const std::vector<TensorBlob>& tensors) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const TensorBlob& t : tensors) views.push_back(ViewOf(t));
  std::string out(EncodedSize(views), '\0');
  EncodeTensorsInto(views, out.data());
  return out;
}

Result<std::vector<TensorBlob>> DecodeTensors(std::string_view bytes, const std::string& source) {
  if (bytes.substr(0, kMagic.size()) != kMagic) {
    return DataLoss(source + ": not an Endure tensor file (bad magic)");
  }
  Reader r(bytes.substr(kMagic.size()), source);
  uint32_t count = 0;
  ENDURE_RETURN_IF_ERROR(r.Get(&count));
  std::vector<TensorBlob> tensors;
  for (uint32_t i = 0; i < count; ++i) {
    TensorBlob t;
    uint32_t len = 0;
    ENDURE_RETURN_IF_ERROR(r.Get(&len));
    ENDURE_RETURN_IF_ERROR(r.GetBytes(len, &t.name));
    ENDURE_RETURN_IF_ERROR(r.Get(&len));
    ENDURE_RETURN_IF_ERROR(r.GetBytes(len, &t.dtype));
    uint32_t rank = 0;
    ENDURE_RETURN_IF_ERROR(r.Get(&rank));
    if (rank > 16) return DataLoss(source + ": tensor '" + t.name + "' has an implausible rank");
    uint64_t elements = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      int64_t dim = 0;
      ENDURE_RETURN_IF_ERROR(r.Get(&dim));
      if (dim < 0) return DataLoss(source + ": tensor '" + t.name + "' has a negative dimension");
      t.shape.push_back(dim);
      // Checked: a product that wrapped around would let a shape of 2^63
      // elements pass with a few bytes of data.
      if (__builtin_mul_overflow(elements, static_cast<uint64_t>(dim), &elements)) {
        return DataLoss(source + ": tensor '" + t.name + "' has an implausible shape");
      }
    }
    uint64_t nbytes = 0;
    ENDURE_RETURN_IF_ERROR(r.Get(&nbytes));
    const size_t elem = DTypeSize(t.dtype);
    uint64_t expected = 0;
    if (elem == 0 || __builtin_mul_overflow(elements, uint64_t{elem}, &expected) ||
        nbytes != expected) {
      return DataLoss(source + ": tensor '" + t.name + "' size does not match its dtype and shape");
    }
    ENDURE_RETURN_IF_ERROR(r.GetBytes(nbytes, &t.data));
    tensors.push_back(std::move(t));
  }
  if (r.remaining() != 0) return DataLoss(source + ": trailing bytes after the last tensor");
  return tensors;
}

namespace {
constexpr char kMetaTensor[] = "meta.json";
}  // namespace

std::vector<TensorView> ShardViews(const std::string& meta_text, std::vector<TensorView> tensors) {
  tensors.insert(tensors.begin(), TensorView{kMetaTensor,
                                             "uint8",
                                             {static_cast<int64_t>(meta_text.size())},
                                             meta_text.data(),
                                             meta_text.size()});
  return tensors;
}

Result<DecodedShard> DecodeShard(std::string_view bytes, const std::string& source) {
  ENDURE_ASSIGN_OR_RETURN(std::vector<TensorBlob> tensors, DecodeTensors(bytes, source));
  if (tensors.empty() || tensors[0].name != kMetaTensor) {
    return DataLoss(source + ": not a checkpoint shard (no meta.json first)");
  }
  DecodedShard shard;
  shard.meta = nlohmann::json::parse(tensors[0].data, nullptr, /*allow_exceptions=*/false);
  if (shard.meta.is_discarded() || !shard.meta.is_object() || !shard.meta.contains("step") ||
      !shard.meta["step"].is_number_integer()) {
    return DataLoss(source + ": shard metadata is not a JSON object with a step");
  }
  tensors.erase(tensors.begin());
  shard.tensors = std::move(tensors);
  return shard;
}

std::vector<int> PartitionBySize(const std::vector<uint64_t>& bytes, int shards) {
  std::vector<uint64_t> load(static_cast<size_t>(std::max(shards, 1)), 0);
  std::vector<int> owner;
  owner.reserve(bytes.size());
  for (uint64_t b : bytes) {
    const auto it = std::min_element(load.begin(), load.end());
    *it += b;
    owner.push_back(static_cast<int>(it - load.begin()));
  }
  return owner;
}

}  // namespace endure::checkpoint
