// POSIX Env and the atomic-write protocol.
#include "common/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace endure {
namespace {

Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  return IOError(what + " '" + path + "': " + std::strerror(err));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status Append(std::string_view data) override {
    while (!data.empty()) {
      ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus("write", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (::fsync(fd_) != 0) return ErrnoStatus("fsync", path_, errno);
    return Status::Ok();
  }

  Status Close() override {
    int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return ErrnoStatus("close", path_, errno);
    return Status::Ok();
  }

 private:
  std::string path_;
  int fd_;
};

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus("cannot create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  Result<std::string> ReadFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return NotFound("no such file '" + path + "'");
      return ErrnoStatus("cannot open", path, errno);
    }
    // Read straight into a buffer of the file's size: no regrowth copies.
    struct stat st;
    std::string out;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) out.resize(static_cast<size_t>(st.st_size));
    size_t filled = 0;
    for (;;) {
      if (filled == out.size()) out.resize(out.size() + (1 << 16));
      ssize_t n = ::read(fd, out.data() + filled, out.size() - filled);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        return ErrnoStatus("read", path, err);
      }
      if (n == 0) break;
      filled += static_cast<size_t>(n);
    }
    out.resize(filled);
    ::close(fd);
    return out;
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus("rename to " + to, from, errno);
    return Status::Ok();
  }

  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("cannot open directory", dir, errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoStatus("fsync directory", dir, err);
    return Status::Ok();
  }

  Status CreateDirs(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return IOError("cannot create directory '" + dir + "': " + ec.message());
    return Status::Ok();
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus("unlink", path, errno);
    return Status::Ok();
  }

  Status RemoveAll(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return IOError("cannot remove '" + path + "': " + ec.message());
    return Status::Ok();
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno == ENOENT) return NotFound("no such directory '" + dir + "'");
      return ErrnoStatus("cannot list", dir, errno);
    }
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(std::move(name));
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }
};

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv();  // never deleted: used until exit
  return env;
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

namespace {

Status ReplaceFile(Env* env, const std::string& path, std::string_view data, bool durable) {
  const std::string tmp = path + ".tmp";
  auto write = [&]() -> Status {
    ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(tmp));
    ENDURE_RETURN_IF_ERROR(file->Append(data));
    if (durable) ENDURE_RETURN_IF_ERROR(file->Sync());
    ENDURE_RETURN_IF_ERROR(file->Close());
    ENDURE_RETURN_IF_ERROR(env->RenameFile(tmp, path));
    return durable ? env->SyncDir(DirName(path)) : Status::Ok();
  };
  Status st = write();
  if (st.ok()) return st;
  // The temporary file would only be in the way; if it stays, say so.
  const Status removed = env->RemoveFile(tmp);
  return removed.ok() ? st : st.WithContext("(and " + tmp + " stays: " + removed.message() + ")");
}

}  // namespace

Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data) {
  return ReplaceFile(env, path, data, /*durable=*/true);
}

Status PublishFile(Env* env, const std::string& path, std::string_view data) {
  return ReplaceFile(env, path, data, /*durable=*/false);
}

}  // namespace endure
