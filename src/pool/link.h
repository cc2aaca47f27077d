// A live connection: heartbeats both ways and prompt detection of a dead or silent peer. Each Link
// runs one thread that reads the connection, answers pings, measures round trips, sends its own
// pings every ping_interval, and queues every other message for recv(). A peer that sends nothing
// at all (not even a pong) for dead_after, that closes, that says bye, or whose bytes are malformed
// takes the link down: recv() then returns the queued messages and after them the reason, which
// names the link (e.g. "worker 'box2' (layers 8-15)"); on_down runs once with the same Status.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "pool/transport.h"

namespace shoal::pool {

struct LinkOptions {
  std::string name;            // who is on the other end, for errors
  Millis ping_interval{500};   // how often we ping
  Millis dead_after{2000};     // silence that counts as death
  /// Say bye to a peer found silent, naming the silence, before closing (a frozen process reads
  /// it when it wakes). Off where the sends could be stalled behind full buffers (hops).
  bool bye_to_silent_peer = false;
  /// An orderly bye is logged at info; hops log it at debug (their control links say why).
  bool bye_at_info = true;
  /// Called once, from the link's thread, when the link goes down (not after close()).
  std::function<void(const Status&)> on_down;
};

class Link {
 public:
  /// Starts the link's thread on an authenticated connection.
  Link(std::unique_ptr<Connection> conn, LinkOptions opts);
  /// close("link closed"), then joins the thread.
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  /// Sends a message (thread-safe). The link's down Status when it is down; a failed send takes
  /// the link down.
  Status send(const Message& m);
  /// The next message other than ping/pong/bye. kDeadlineExceeded when none in `timeout`; once
  /// the link is down and the queue is empty, the down Status (kUnavailable naming the link).
  Result<Message> recv(Millis timeout);
  /// Ok while up; why it went down.
  Status status() const;
  bool is_up() const { return status().ok(); }
  /// Whether the link went down because the peer said bye (an orderly leave), not by a closed
  /// connection, a silence, malformed bytes or our own close.
  bool said_bye() const;
  /// Sends BYE with `reason` (best effort) and closes; recv() then reports kUnavailable.
  void close(std::string_view reason);
  /// Last measured ping round trip; zero before the first pong.
  std::chrono::microseconds rtt() const { return std::chrono::microseconds(rtt_us_.load()); }
  const std::string& name() const { return opts_.name; }

 private:
  void run();
  // Sends a ping or pong; false when the link went down because of it.
  bool send_heartbeat(const Message& m);
  // Takes the link down once; with `notify`, logs why (info when the peer said bye, else a
  // warning) and runs on_down.
  void go_down(const Status& why, bool notify, bool orderly = false);

  std::unique_ptr<Connection> conn_;
  LinkOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> inbox_;
  Status down_;  // ok while up
  bool said_bye_ = false;  // down_ is the peer's bye
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> rtt_us_{0};
  std::thread thread_;
};

}  // namespace shoal::pool
