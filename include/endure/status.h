// Status and Result<T>: how Endure reports recoverable failures without
// exceptions. A Status carries a code and a message written for the person
// who has to fix the problem ("--steps: expected a positive integer, got
// 'abc'"). Bugs are not Statuses: they hit ENDURE_CHECK and abort.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace endure {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad flag, config or input: the user must change something
  kNotFound,
  kDataLoss,     // a file exists but fails verification (checksum, truncation)
  kIOError,      // the operating system refused a file or socket operation
  kUnavailable,  // a peer or service cannot be reached right now
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) std::abort();   // an OK Status carries no value
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* expr);

}  // namespace endure

// Aborts with file and line when `cond` is false: for invariants, not input.
#define ENDURE_CHECK(cond) \
  ((cond) ? static_cast<void>(0) : ::endure::CheckFailed(__FILE__, __LINE__, #cond))

#define ENDURE_RETURN_IF_ERROR(expr) \
  do {                               \
    ::endure::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

#define ENDURE_CONCAT_INNER(a, b) a##b
#define ENDURE_CONCAT(a, b) ENDURE_CONCAT_INNER(a, b)
#define ENDURE_ASSIGN_OR_RETURN(lhs, expr)                                                  \
  auto ENDURE_CONCAT(_res_, __LINE__) = (expr);                                             \
  if (!ENDURE_CONCAT(_res_, __LINE__).ok()) return ENDURE_CONCAT(_res_, __LINE__).status(); \
  lhs = std::move(ENDURE_CONCAT(_res_, __LINE__)).value()
