#include "pool/address.h"

#include <algorithm>

namespace shoal::pool {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}
bool is_v6_char(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' ||
         c == '.';
}

}  // namespace

std::string Address::to_string() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

Result<Address> parse_address(std::string_view text, bool allow_port_zero) {
  auto bad = [&](std::string_view why) {
    return make_error(Code::kInvalidArgument, "address '{}': {} (expected HOST:PORT, [IPv6]:PORT or :PORT)",
                      text, why);
  };
  Address a;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("'[' without ']'");
    a.host = std::string(text.substr(1, close - 1));
    if (a.host.empty() || !std::all_of(a.host.begin(), a.host.end(), is_v6_char)) {
      return bad("not an IPv6 literal inside [ ]");
    }
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("no ':PORT' after ']'");
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {  // a port alone, or a host without one
      if (!text.empty() && !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return bad("no ':PORT'");
      port_text = text;
    } else {
      if (text.substr(0, colon).find(':') != std::string_view::npos) return bad("IPv6 literals need [ ]");
      a.host = std::string(text.substr(0, colon));
      port_text = text.substr(colon + 1);
    }
    if (!std::all_of(a.host.begin(), a.host.end(), is_name_char)) return bad("bad character in host");
    if (a.host.size() > 253) return bad("host name longer than 253 characters");
  }
  if (a.host.empty()) a.host = std::string(kDefaultHost);
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad("port is not a number");
  }
  uint32_t port = 0;
  for (char c : port_text) port = port * 10 + uint32_t(c - '0');
  if (port > 65535) return bad("port above 65535");
  if (port == 0 && !allow_port_zero) return bad("port 0");
  a.port = static_cast<uint16_t>(port);
  return a;
}

}  // namespace shoal::pool
