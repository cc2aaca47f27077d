// Always-on invariant checks (also in Release). A failed check is a bug in Shoal, never a
// reaction to outside input: bytes from files and peers are validated into Status errors.
#pragma once

#include <fmt/format.h>

#include <string>

namespace shoal {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace shoal

/// SHOAL_CHECK(n > 0) or SHOAL_CHECK(n > 0, "n={} for {}", n, name): aborts with the message.
#define SHOAL_CHECK(cond, ...)                                                                    \
  do {                                                                                            \
    if (!(cond)) [[unlikely]]                                                                     \
      ::shoal::check_failed(__FILE__, __LINE__, #cond, std::string(__VA_OPT__(fmt::format(__VA_ARGS__)))); \
  } while (0)
