// Corpus loading and the batch plan.
#include "trainer/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace endure::trainer {
namespace fs = std::filesystem;
namespace {

constexpr size_t kBlock = 4096;

bool LooksBinary(const std::string& bytes) {
  return bytes.substr(0, kBlock).find('\0') != std::string::npos;
}

}  // namespace

Result<Corpus> LoadCorpus(const std::vector<std::string>& paths, double val_fraction) {
  std::vector<fs::path> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (auto it = fs::recursive_directory_iterator(
               p, fs::directory_options::follow_directory_symlink, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file(ec)) files.push_back(it->path());
      }
    } else if (fs::is_regular_file(p, ec)) {
      files.emplace_back(p);
    } else {
      return InvalidArgument("--data: '" + p + "' is neither a file nor a directory");
    }
  }
  std::sort(files.begin(), files.end());
  std::set<fs::path> seen;
  std::string text;
  Corpus corpus;
  for (const fs::path& f : files) {
    std::error_code ec;
    fs::path canonical = fs::canonical(f, ec);
    if (ec || !seen.insert(canonical).second) continue;
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string bytes = ss.str();
    if (bytes.empty() || LooksBinary(bytes)) continue;
    text += bytes;
    ++corpus.files;
  }
  std::string joined;
  for (const std::string& p : paths) joined += (joined.empty() ? "" : " ") + p;
  // Enough bytes for a handful of distinct sequences in both splits.
  if (text.size() < 64 * kBlock) {
    return InvalidArgument("--data: found " + std::to_string(text.size()) + " bytes of text in '" +
                           joined +
                           "'; need at least 256 KiB (point --data at text files, or "
                           "install the 'fortunes' package for the default corpus)");
  }
  const size_t every = static_cast<size_t>(1.0 / val_fraction + 0.5);
  for (size_t block = 0; block * kBlock < text.size(); ++block) {
    std::string_view chunk = std::string_view(text).substr(block * kBlock, kBlock);
    (block % every == every - 1 ? corpus.val : corpus.train).append(chunk);
  }
  return corpus;
}

uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(seed) ^ a) ^ b);
}

std::vector<int64_t> SequenceOffsets(uint64_t seed, int64_t step, int first, int count, int context,
                                     size_t text_size) {
  const uint64_t span = text_size - static_cast<size_t>(context) - 1;
  std::vector<int64_t> offsets;
  offsets.reserve(count);
  for (int i = first; i < first + count; ++i) {
    offsets.push_back(static_cast<int64_t>(
        MixSeed(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(i)) % span));
  }
  return offsets;
}

}  // namespace endure::trainer
