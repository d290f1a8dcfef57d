#include "common/hash.h"

#include <gtest/gtest.h>

namespace endure {
namespace {

TEST(Xxh3, IncrementalEqualsOneShot) {
  std::string data(100000, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  Xxh3Hasher h;
  h.Update(std::string_view(data).substr(0, 777));
  h.Update(std::string_view(data).substr(777));
  EXPECT_EQ(h.Digest(), Xxh3(data));
  data[5000] ^= 1;
  EXPECT_NE(h.Digest(), Xxh3(data));
}

TEST(HexU64, IsSixteenLowercaseDigits) { EXPECT_EQ(HexU64(0xABCull), "0000000000000abc"); }

}  // namespace
}  // namespace endure
