// Reading a configuration file or directory; see config_files.h.
#include "common/config_files.h"

#include <sys/stat.h>

#include "common/env.h"

namespace endure {

Result<std::vector<TextFile>> ReadConfigFiles(const std::string& path, const std::string& suffix) {
  Env* env = Env::Default();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    ENDURE_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
    return std::vector<TextFile>{{path, std::move(text)}};
  }
  ENDURE_ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(path));
  std::vector<TextFile> files;
  for (const std::string& name : names) {
    if (name.empty() || name[0] == '.' || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string file = path + (path.back() == '/' ? "" : "/") + name;
    ENDURE_ASSIGN_OR_RETURN(std::string text, env->ReadFile(file));
    files.push_back({file, std::move(text)});
  }
  if (files.empty()) {
    return InvalidArgument("the directory " + path + " holds no *" + suffix +
                           " file; give a file, or a directory of them");
  }
  return files;
}

}  // namespace endure
