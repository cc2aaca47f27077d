// In-process transport: a pair of bounded byte pipes in memory, with the same record layer, limits
// and errors as TCP. For tests (host and workers in one process, injected garbage, stalled peers).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "pool/transport.h"

namespace shoal::pool {

/// Two connected byte streams (a, b); what one writes the other reads; a's local() is name_a and
/// its peer() name_b. Each direction buffers at most `capacity` bytes: a writer whose peer does
/// not read blocks, then times out.
std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>> make_pipe_pair(
    std::string name_a, std::string name_b, size_t capacity = 1 << 20);

/// Two connected Connections (a, b).
std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> make_connection_pair(
    ConnectionOptions opts = {});

class InProcessListenerState;

/// A Network whose addresses exist only inside this object: listen() registers an address,
/// connect() pairs pipes with it. Thread-safe.
class InProcessNetwork : public Network {
 public:
  explicit InProcessNetwork(size_t pipe_capacity = 1 << 20) : pipe_capacity_(pipe_capacity) {}
  Result<std::unique_ptr<Listener>> listen(std::string_view address, ConnectionOptions opts = {}) override;
  Result<std::unique_ptr<Connection>> connect(std::string_view address, Millis timeout,
                                              ConnectionOptions opts = {}) override;
  /// Connects and returns the raw client stream (tests write garbage bytes with it).
  Result<std::unique_ptr<ByteStream>> connect_raw(std::string_view address);

 private:
  std::mutex mu_;
  size_t pipe_capacity_;
  uint16_t next_port_ = 40000;  // port handed out for ":0"
  uint64_t next_id_ = 1;        // numbers connections in peer names
  std::map<std::string, std::weak_ptr<InProcessListenerState>> listeners_;
};

}  // namespace shoal::pool
