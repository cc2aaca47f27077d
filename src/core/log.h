// Logging goes to stderr through spdlog; stdout is reserved for generated text and JSON.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace shoal {

/// Sets up the default logger on stderr. level: "trace", "debug", "info", "warn", "error", "off".
void init_logging(std::string_view level = "info");

}  // namespace shoal
