// XXH3 wrappers.
#include "common/hash.h"

#include <xxhash.h>

#include <cstdio>

namespace endure {

uint64_t Xxh3(std::string_view data) { return XXH3_64bits(data.data(), data.size()); }

std::string HexU64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Xxh3Hasher::Xxh3Hasher() : state_(XXH3_createState()) { XXH3_64bits_reset(state_); }
Xxh3Hasher::~Xxh3Hasher() { XXH3_freeState(state_); }
void Xxh3Hasher::Update(const void* data, size_t size) { XXH3_64bits_update(state_, data, size); }
uint64_t Xxh3Hasher::Digest() const { return XXH3_64bits_digest(state_); }

}  // namespace endure
