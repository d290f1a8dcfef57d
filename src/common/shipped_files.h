// Where the files Endure ships (config/log_rules/, ...) are found at run
// time: next to the running binary. build/bin/endure uses the source tree's
// config/; an installed PREFIX/bin/endure uses PREFIX/share/endure/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace endure {

// The places looked at for config file `name`, in order.
std::vector<std::string> ShippedConfigCandidates(const std::string& name);

// The first candidate that exists; kInvalidArgument listing the candidates
// (and saying which flag overrides it, `flag`) when none does.
Result<std::string> FindShippedConfig(const std::string& name, const std::string& flag);

// The built Python package's directory (build/python next to build/bin, or
// PREFIX/share/endure/python), when it holds autostep/sitecustomize.py.
std::optional<std::string> ShippedPythonDir();

}  // namespace endure
