// Logging goes to stderr through spdlog; stdout is reserved for generated text and JSON.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace shoal {

/// Sets up the default logger on stderr. level: "trace", "debug", "info", "warn", "error", "off".
void init_logging(std::string_view level = "info");

/// A byte count for messages: "1.50 GiB", "300.0 MiB", "512 B" (binary units, 3 digits).
std::string format_bytes(uint64_t n);

/// Length of the valid, printable UTF-8 character at s[i] (no overlong forms, surrogates, code
/// points past U+10FFFF or control characters: U+0000..U+001F, U+007F..U+009F), or 0. Requires
/// i < s.size().
size_t printable_char_len(std::string_view s, size_t i);

/// Text from outside (a model file's strings, a peer's) made safe for a terminal line: printable
/// UTF-8 kept, every other byte written as \xHH. "a\nb" becomes `a\x0ab`.
std::string escape_unprintable(std::string_view s);

}  // namespace shoal
