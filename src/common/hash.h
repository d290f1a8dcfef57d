// XXH3-64 checksums (libxxhash) for checkpoint integrity and parameter
// fingerprints. Hex form is 16 lowercase digits.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

struct XXH3_state_s;

namespace endure {

uint64_t Xxh3(std::string_view data);
std::string HexU64(uint64_t v);

// Incremental XXH3-64: Update() any number of times, then Digest().
// Not thread-safe.
class Xxh3Hasher {
 public:
  Xxh3Hasher();
  ~Xxh3Hasher();
  Xxh3Hasher(const Xxh3Hasher&) = delete;
  Xxh3Hasher& operator=(const Xxh3Hasher&) = delete;

  void Update(const void* data, size_t size);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  uint64_t Digest() const;

 private:
  XXH3_state_s* state_;
};

}  // namespace endure
