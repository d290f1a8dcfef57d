#include "checkpoint/tensor_blob.h"

#include <gtest/gtest.h>

namespace endure::checkpoint {
namespace {

std::vector<TensorBlob> Sample() {
  return {{"w", "float32", {2, 3}, std::string(24, '\x01')},
          {"step", "int64", {}, std::string(8, '\x02')},
          {"empty", "float32", {0}, ""}};
}

TEST(TensorBlob, RoundTrips) {
  Result<std::vector<TensorBlob>> back = DecodeTensors(EncodeTensors(Sample()), "f");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, Sample());
}

TEST(TensorBlob, EveryTruncationIsDataLossNamingTheSource) {
  std::string bytes = EncodeTensors(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    Result<std::vector<TensorBlob>> r =
        DecodeTensors(std::string_view(bytes).substr(0, n), "x.bin");
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(r.status().message().rfind("x.bin: ", 0), 0u);
  }
}

TEST(TensorBlob, SizeMustMatchShape) {
  std::vector<TensorBlob> bad = {{"w", "float32", {2, 3}, std::string(20, 'x')}};
  EXPECT_FALSE(DecodeTensors(EncodeTensors(bad), "f").ok());
}

// Found by fuzz/tensors_fuzz.cc: (2^62 + 2) x 2 float32 elements are 2^65 + 16
// bytes, which wrapped around to the 16 bytes given.
TEST(TensorBlob, ShapeWhoseSizeOverflowsIsDataLoss) {
  const int64_t huge = (int64_t{1} << 62) + 2;
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{huge, 2}, std::vector<int64_t>{huge, huge, 0}}) {
    std::vector<TensorBlob> bad = {{"w", "float32", shape, std::string(16, 'x')}};
    if (shape.back() == 0) bad[0].data.clear();
    Result<std::vector<TensorBlob>> r = DecodeTensors(EncodeTensors(bad), "f");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(r.status().message().rfind("f: tensor 'w' ", 0), 0u) << r.status().message();
  }
}

TEST(TensorBlobTest, HashingWhileEncodingGivesTheWholeDigest) {
  std::vector<TensorBlob> t = {{"big", "uint8", {700000}, std::string(700000, 'q')},
                               {"small", "float32", {2}, std::string(8, 'z')}};
  const std::string whole = EncodeTensors(t);
  std::vector<TensorView> views = {ViewOf(t[0]), ViewOf(t[1])};
  std::string out(EncodedSize(views), '\0');
  Xxh3Hasher hasher;
  EncodeTensorsInto(views, out.data(), &hasher);
  EXPECT_EQ(out, whole);
  EXPECT_EQ(hasher.Digest(), Xxh3(whole));
}

TEST(PartitionBySizeTest, BalancesBytesDeterministically) {
  EXPECT_EQ(PartitionBySize({100, 10, 10, 80, 5}, 2), (std::vector<int>{0, 1, 1, 1, 0}));
  EXPECT_EQ(PartitionBySize({1, 1, 1}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(PartitionBySize({4, 4, 4, 4}, 4), (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace endure::checkpoint
