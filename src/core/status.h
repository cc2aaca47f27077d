// Errors as values: Status (a code and a message) and Result<T> (a value or a Status).
// Modeled on google/leveldb include/leveldb/status.h and absl::StatusOr.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace shoal {

/// What kind of failure a Status reports.
enum class Code : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed (flag, JSON, prompt)
  kNotFound,            // file, tensor, key, token missing
  kCorrupt,             // bytes from outside break their format (model file, frame)
  kUnsupported,         // well-formed but not handled (dtype, architecture, version)
  kIoError,             // the OS refused a read/write/socket operation
  kOutOfMemory,         // an allocation (host or device) failed
  kOutOfRange,          // position/context/index beyond a limit
  kFailedPrecondition,  // called in the wrong state
  kUnavailable,         // a peer or device is gone or not answering
  kPermissionDenied,    // authentication failed (room secret)
  kDeadlineExceeded,    // timed out
  kInternal,            // a bug or a device error
};

/// Short name of a code ("corrupt", "io error"...).
std::string_view code_name(Code c);

/// A success or an error with a human-readable message naming what is wrong.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "corrupt: tensor 'x' ends past the end of the file"; bytes of the message that are not
  /// printable UTF-8 (a name read from a damaged file: a NUL, an escape sequence) as \xHH.
  std::string to_string() const;
  /// Returns a copy whose message is "context: message" (only when not ok).
  Status with_context(std::string_view context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

/// Builds a Status from a code and an fmt-style message.
template <typename... Args>
Status make_error(Code code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

/// A value of type T, or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(runtime/explicit)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(runtime/explicit)
    if (std::get<0>(v_).ok()) v_ = Status(Code::kInternal, "Result built from an ok Status");
  }

  bool ok() const { return v_.index() == 1; }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<0>(v_);
  }
  T& value() & { return std::get<1>(v_); }
  const T& value() const& { return std::get<1>(v_); }
  T&& value() && { return std::get<1>(std::move(v_)); }
  T* operator->() { return &std::get<1>(v_); }
  const T* operator->() const { return &std::get<1>(v_); }
  T& operator*() & { return std::get<1>(v_); }
  const T& operator*() const& { return std::get<1>(v_); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace shoal

#define SHOAL_CONCAT_INNER_(a, b) a##b
#define SHOAL_CONCAT_(a, b) SHOAL_CONCAT_INNER_(a, b)

/// Returns the Status from the enclosing function when `expr` is an error.
#define SHOAL_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::shoal::Status shoal_status_ = (expr);        \
    if (!shoal_status_.ok()) return shoal_status_; \
  } while (0)

/// `SHOAL_ASSIGN_OR_RETURN(auto x, f());` — unwraps a Result or returns its Status.
#define SHOAL_ASSIGN_OR_RETURN(lhs, expr) \
  SHOAL_ASSIGN_OR_RETURN_IMPL_(SHOAL_CONCAT_(shoal_result_, __LINE__), lhs, expr)
#define SHOAL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
