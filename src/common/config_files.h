// Configuration that may be one file or a directory of them, such as the log
// rules (config/log_rules/: one file per family of causes, plus a site's own).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace endure {

struct TextFile {
  std::string path;
  std::string text;
};

// `path` itself when it is a file; when it is a directory, its files whose
// names end in `suffix` (".toml"), in name order, without descending and
// skipping hidden files. Fails naming the path when it cannot be read, or
// when a directory holds no such file.
Result<std::vector<TextFile>> ReadConfigFiles(const std::string& path, const std::string& suffix);

}  // namespace endure
