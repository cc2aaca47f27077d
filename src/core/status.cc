#include "core/status.h"

#include "core/log.h"

namespace shoal {

std::string_view code_name(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotFound: return "not found";
    case Code::kCorrupt: return "corrupt";
    case Code::kUnsupported: return "unsupported";
    case Code::kIoError: return "io error";
    case Code::kOutOfMemory: return "out of memory";
    case Code::kOutOfRange: return "out of range";
    case Code::kFailedPrecondition: return "failed precondition";
    case Code::kUnavailable: return "unavailable";
    case Code::kPermissionDenied: return "permission denied";
    case Code::kDeadlineExceeded: return "deadline exceeded";
    case Code::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", code_name(code_), escape_unprintable(message_));
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_));
}

}  // namespace shoal
