// Locating shipped configuration files.
#include "common/shipped_files.h"

#include <unistd.h>

#include <filesystem>

#include "common/env.h"

namespace endure {

namespace {

// `relatives` of the running binary's directory, made canonical where they
// can be; empty when the binary's path cannot be read.
std::vector<std::string> NextToTheBinary(const std::vector<std::string>& relatives) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return {};
  const std::string bin = DirName(std::string(exe, static_cast<size_t>(n)));
  std::vector<std::string> candidates;
  for (const std::string& relative : relatives) {
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::weakly_canonical(bin + relative, ec);
    candidates.push_back(ec ? bin + relative : p.string());
  }
  return candidates;
}

}  // namespace

std::vector<std::string> ShippedConfigCandidates(const std::string& name) {
  std::vector<std::string> candidates =
      NextToTheBinary({"/../../config/" + name, "/../share/endure/" + name});
  if (candidates.empty()) return {"config/" + name};
  return candidates;
}

std::optional<std::string> ShippedPythonDir() {
  for (const std::string& dir : NextToTheBinary({"/../python", "/../share/endure/python"})) {
    if (Env::Default()->Exists(JoinPath(dir, "autostep/sitecustomize.py"))) return dir;
  }
  return std::nullopt;
}

Result<std::string> FindShippedConfig(const std::string& name, const std::string& flag) {
  std::string tried;
  for (const std::string& c : ShippedConfigCandidates(name)) {
    if (Env::Default()->Exists(c)) return c;
    tried += (tried.empty() ? "" : ", ") + c;
  }
  return InvalidArgument("no " + name + " found (looked for " + tried + "); pass " + flag);
}

}  // namespace endure
