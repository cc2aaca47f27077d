// Transports move whole messages between two peers. A transport implements ByteStream (an ordered,
// reliable byte pipe with deadlines) and Listener; Connection puts the record layer (pool/wire.h)
// on any ByteStream, so TCP (pool/transport_tcp.h) and in-process pipes (pool/transport_inproc.h)
// behave the same: same limits, same errors, same closing rules. A Network makes both reachable by
// address, so the host and worker code can run over either.
//
// Threads: Connection::send is safe from several threads at once (sends are serialised);
// Connection::recv is for one thread at a time; close() from any thread wakes both. A connection
// that receives a malformed record sends the peer an ERROR saying why, closes itself, and returns
// that error from recv (and kUnavailable from then on); its users log it (Room as a refused
// connection, Link as the reason it went down). Nothing here ever blocks past its deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "pool/wire.h"

namespace shoal::pool {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

/// An ordered, reliable, bidirectional byte stream (a TCP socket, an in-process pipe pair).
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  /// Reads 1..buf.size() bytes. kDeadlineExceeded when none arrived by `deadline`;
  /// kUnavailable when the peer closed or close() was called (the message says which).
  virtual Result<size_t> read_some(std::span<uint8_t> buf, Clock::time_point deadline) = 0;
  /// Writes every part, in order. kDeadlineExceeded when the peer did not take the bytes by
  /// `deadline` (the stream is then in an unknown state and must be closed); kUnavailable when
  /// closed or the peer is gone.
  virtual Status write_all(std::span<const std::span<const uint8_t>> parts,
                           Clock::time_point deadline) = 0;
  /// Wakes blocked reads/writes (they return kUnavailable) and tells the peer. Idempotent,
  /// thread-safe.
  virtual void close() = 0;
  /// Who is on the other end, for messages: "127.0.0.1:51234", "in-process 127.0.0.1:7000".
  virtual std::string peer() const = 0;
  /// This end's address: "10.0.0.2:40122" (the interface that reaches the peer), "in-process ...".
  virtual std::string local() const = 0;
};

/// Limits shared by every connection.
struct ConnectionOptions {
  uint32_t max_payload = kDefaultMaxPayload;  // larger records are refused both ways
  Millis send_timeout{2000};  // a peer that takes no bytes for this long counts as gone
};

/// Messages over a ByteStream.
class Connection {
 public:
  explicit Connection(std::unique_ptr<ByteStream> stream, ConnectionOptions opts = {});
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// Sends one message (thread-safe). kInvalidArgument when the payload is over max_payload;
  /// kUnavailable when the connection is closed, the peer is gone (what it sent before leaving
  /// can still be received), or it stalled past send_timeout (the connection is then closed).
  Status send(const Message& m);
  /// The next message, waiting up to `timeout`. kDeadlineExceeded when no whole message came in
  /// time (partial bytes are kept); kUnavailable when closed; kCorrupt / kUnsupported /
  /// kOutOfRange for a malformed record (the connection is then closed, see the file comment).
  Result<Message> recv(Millis timeout);
  /// Closes both directions; idempotent, thread-safe.
  void close();
  bool is_closed() const;
  const std::string& peer() const { return peer_; }
  /// This end's address (a worker listens for its upstream hop on the host part of it).
  std::string local() const { return stream_->local(); }

 private:
  void fail(const Status& why);

  std::unique_ptr<ByteStream> stream_;
  ConnectionOptions opts_;
  std::string peer_;
  RecordDecoder decoder_;
  std::vector<uint8_t> rx_buf_;
  std::mutex send_mu_;
  mutable std::mutex state_mu_;
  bool closed_ = false;
  Status recv_error_;  // sticky once a record was malformed
};

/// Accepts incoming connections.
class Listener {
 public:
  virtual ~Listener() = default;
  /// The next incoming connection, waiting up to `timeout`. kDeadlineExceeded when none came;
  /// kUnavailable once closed.
  virtual Result<std::unique_ptr<Connection>> accept(Millis timeout) = 0;
  /// The address peers connect to, with the real port when listening on port 0.
  virtual std::string address() const = 0;
  /// Stops listening; wakes a blocked accept(). Idempotent, thread-safe.
  virtual void close() = 0;
};

/// Where listeners live and connections go: TCP (tcp_network()) or in-process (InProcessNetwork).
class Network {
 public:
  virtual ~Network() = default;
  /// Listens on `address` ("HOST:PORT", ":PORT"; the host defaults to 127.0.0.1; port 0 picks one).
  virtual Result<std::unique_ptr<Listener>> listen(std::string_view address,
                                                   ConnectionOptions opts = {}) = 0;
  /// Connects to `address` within `timeout`. kUnavailable when nothing listens there or it does
  /// not answer in time; kInvalidArgument for a malformed address.
  virtual Result<std::unique_ptr<Connection>> connect(std::string_view address, Millis timeout,
                                                      ConnectionOptions opts = {}) = 0;
};

}  // namespace shoal::pool
