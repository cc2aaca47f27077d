// TCP transport over standalone asio. asio resolves addresses (IPv4, IPv6 literals, host names),
// opens, binds, accepts and sets TCP_NODELAY; the data path then waits with poll(2) on the socket
// so that each direction can block with its own deadline from its own thread, and close() (a
// shutdown) wakes both. One process-wide io_context owns the sockets; it is never run, because
// every operation here is synchronous. Listening is on 127.0.0.1 unless an address is given.
#pragma once

#include "pool/transport.h"

namespace shoal::pool {

/// The TCP network: listen("0.0.0.0:7000") to accept from other machines, listen(":0") for a free
/// loopback port; connect("10.0.0.2:7000", timeout).
Network& tcp_network();

}  // namespace shoal::pool
