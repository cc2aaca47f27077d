// The host's door: a Listener plus the room-secret handshake. One thread accepts connections; each
// new connection is authenticated on its own short-lived thread (so a silent or slow client
// cannot hold up others) and, once it proved the secret, is handed out by next(). Connections that
// fail (garbage bytes, an HTTP request, a wrong version or secret, silence past the handshake
// timeout) are logged, reported to on_refused, and closed; the room keeps accepting.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "pool/auth.h"
#include "pool/transport.h"

namespace shoal::pool {

struct RoomOptions {
  std::string secret;                      // the room secret (non-empty)
  Millis handshake_timeout = kDefaultHandshakeTimeout;
  size_t max_pending = 32;                 // handshakes in flight; more connections are closed at once
  /// Called (from a room thread) for each refused connection: peer and reason.
  std::function<void(const std::string& peer, const Status& why)> on_refused;
};

/// A connection that proved the room secret, and the role it proved.
struct Arrival {
  PeerRole role = PeerRole::kWorker;
  std::unique_ptr<Connection> conn;
};

class Room {
 public:
  /// Starts accepting on `listener`. kInvalidArgument for an empty secret.
  static Result<std::unique_ptr<Room>> open(std::unique_ptr<Listener> listener, RoomOptions opts);
  /// Stops accepting, closes pending handshakes and unclaimed arrivals, joins every thread.
  ~Room();

  /// The next authenticated connection; kDeadlineExceeded when none within `timeout`.
  Result<Arrival> next(Millis timeout);
  /// Where peers connect (the listener's address).
  std::string address() const { return address_; }
  /// Connections refused so far.
  size_t refused() const;

 private:
  Room(std::unique_ptr<Listener> listener, RoomOptions opts);
  void accept_loop();
  void handshake(std::unique_ptr<Connection> conn);
  void reap_finished();  // joins handshake threads that are done (mu_ held)

  struct Pending {
    std::thread thread;
    bool done = false;
    Connection* conn = nullptr;  // for closing on shutdown
  };

  std::unique_ptr<Listener> listener_;
  RoomOptions opts_;
  std::string address_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Arrival> arrivals_;
  std::list<Pending> pending_;
  size_t refused_ = 0;
  bool stopping_ = false;
  std::thread accept_thread_;
};

}  // namespace shoal::pool
