// The hop connections of the chain host -> w1 -> ... -> wN -> host (docs/protocol.md, "Connections
// and roles"). Each stage dials the next stage's listener with role hop, names the plan epoch and
// itself in HOP_OPEN, and keeps the connection alive with heartbeats (a Link). The receiving stage
// hands every authenticated hop connection to a HopInbox, which answers its heartbeats at once
// (the receiver may still be loading its slice) and gives it out when the plan it names is claimed.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "pool/link.h"
#include "pool/messages.h"
#include "pool/transport.h"

namespace shoal::pool {

/// Tokens per frame at most (a prefill batch; also the worker slices' step size).
inline constexpr int kFrameTokens = 16;
/// Frames the host keeps in flight around the chain during prefill.
inline constexpr int kFramesInFlight = 6;

/// Heartbeat and timing settings of the chain's connections.
struct HopOptions {
  Millis ping_interval{500};
  Millis dead_after{2000};       // silence after which a hop counts as dead
  Millis connect_timeout{5000};  // connect + authenticate
};

/// Dials `address` as stage `from_stage` of plan `epoch`: connects, authenticates with role hop,
/// sends HOP_OPEN and starts heartbeats. `name` labels the link in errors ("hop to worker 'w1'").
/// Errors: kUnavailable (nothing listens / unreachable), kPermissionDenied (the secrets differ),
/// kInvalidArgument (malformed address), with `name` as context.
Result<std::unique_ptr<Link>> open_hop(Network& net, std::string_view address, std::string_view secret, uint64_t epoch,
                                       uint16_t from_stage, const std::string& name, const HopOptions& opts);

/// Incoming hop connections, held until the plan they belong to claims them. Thread-safe.
class HopInbox {
 public:
  explicit HopInbox(HopOptions opts) : opts_(opts) {}
  /// Takes an authenticated connection of role hop and starts answering its heartbeats.
  void add(std::unique_ptr<Connection> conn);
  /// The hop of plan `epoch` sent by stage `from_stage`. Hops of older plans are closed; a hop of
  /// this plan from another stage gets an ERROR and is closed; hops of newer plans wait. Polls
  /// `abort` (when given) and returns its error; kDeadlineExceeded after `timeout`.
  Result<std::unique_ptr<Link>> take(uint64_t epoch, uint16_t from_stage, Millis timeout,
                                     const std::function<Status()>& abort = {});
  /// Closes every held hop.
  void clear();

 private:
  struct Held {
    std::unique_ptr<Link> link;
    std::optional<HopOpen> open;  // once its HOP_OPEN arrived
    Clock::time_point since;
  };
  HopOptions opts_;
  std::mutex mu_;
  std::list<Held> held_;
};

}  // namespace shoal::pool
