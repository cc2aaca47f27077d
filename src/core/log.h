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

}  // namespace shoal
