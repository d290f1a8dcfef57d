// Helpers of the verbs; see cli_util.h.
#include "tools/endure/cli_util.h"

#include <cstdio>
#include <ctime>

#include "common/env.h"
#include "tools/endure/verbs.h"

namespace endure::cli {

int64_t NowUnixMs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

std::string Utc(int64_t unix_ms) {
  const time_t t = static_cast<time_t>(unix_ms / 1000);
  tm utc{};
  gmtime_r(&t, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &utc);
  return buf;
}

int Fail(const std::string& verb, const Status& st) {
  std::fprintf(stderr, "endure %s: %s\n", verb.c_str(), st.message().c_str());
  return st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound
             ? kExitUsage
             : kExitInternal;
}

Result<std::string> StateDatabase(const std::string& state_dir, const std::string& file,
                                  const std::string& what) {
  const std::string hint =
      "pass the [cluster] state_dir the jobs share, or a job's state_dir (e.g. runs/demo)";
  if (!Env::Default()->Exists(state_dir)) {
    return InvalidArgument(state_dir + ": no such directory; " + hint);
  }
  const std::string path = JoinPath(state_dir, file);
  if (!Env::Default()->Exists(path)) {
    return InvalidArgument(state_dir + ": no " + what + " (" + path +
                           ") here: no controller has run with it; " + hint);
  }
  return path;
}

}  // namespace endure::cli
