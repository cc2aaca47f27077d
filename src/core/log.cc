#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <iterator>

namespace shoal {

void init_logging(std::string_view level) {
  auto logger = spdlog::get("shoal");
  if (!logger) {
    logger = spdlog::stderr_color_mt("shoal");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
  }
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
}

std::string format_bytes(uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(n) / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(units)) v /= 1024, ++u;
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : 1, units[u]);
}

}  // namespace shoal
