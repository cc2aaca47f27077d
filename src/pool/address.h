// Network addresses as the CLI and the assign message write them: "HOST:PORT", "[IPv6]:PORT", or
// ":PORT" / "PORT" for the loopback default (nothing listens beyond loopback unless told).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace shoal::pool {

inline constexpr std::string_view kDefaultHost = "127.0.0.1";

struct Address {
  std::string host;  // IPv4 literal, IPv6 literal without brackets, or a host name
  uint16_t port = 0;
  /// "127.0.0.1:7000", "[::1]:7000".
  std::string to_string() const;
};

/// Parses an address; the host defaults to 127.0.0.1. Port 0 ("any free port") only when
/// `allow_port_zero` (listening). kInvalidArgument naming the text and what is wrong.
Result<Address> parse_address(std::string_view text, bool allow_port_zero = false);

}  // namespace shoal::pool
