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

size_t printable_char_len(std::string_view s, size_t i) {
  const auto b = uint8_t(s[i]);
  if (b < 0x80) return (b < 0x20 || b == 0x7F) ? 0 : 1;
  size_t len;
  uint32_t cp, min_cp;
  if ((b & 0xE0) == 0xC0) {
    len = 2, cp = b & 0x1Fu, min_cp = 0x80;
  } else if ((b & 0xF0) == 0xE0) {
    len = 3, cp = b & 0x0Fu, min_cp = 0x800;
  } else if ((b & 0xF8) == 0xF0) {
    len = 4, cp = b & 0x07u, min_cp = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto c = uint8_t(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3Fu);
  }
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0x80 && cp <= 0x9F)) return 0;
  return len;
}

std::string escape_unprintable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (const size_t len = printable_char_len(s, i)) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += fmt::format("\\x{:02x}", uint8_t(s[i++]));
    }
  }
  return out;
}

}  // namespace shoal
