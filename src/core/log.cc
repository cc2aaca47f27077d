#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

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

}  // namespace shoal
