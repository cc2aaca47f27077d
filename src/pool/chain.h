// The hop connections of the chain host -> w1 -> ... -> wN -> host (docs/protocol.md, "Connections
// and roles"). Each stage dials the next stage's listener with role hop, names the plan epoch and
// itself in HOP_OPEN, and keeps the connection alive with heartbeats (a Link). The receiving stage
// hands every authenticated hop connection to a HopInbox, which answers its heartbeats at once
// (the receiver may still be loading its slice) and gives it out when the plan it names is claimed.
#pragma once

#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

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

/// Hop connections a stage holds at most while they wait for their plan; more are refused.
inline constexpr size_t kMaxHeldHops = 16;

/// Incoming hop connections, held until the plan they belong to claims them. Thread-safe. A
/// sweeper thread looks at every held hop every few milliseconds, whether or not a plan is waiting
/// for one, and closes those that cannot serve: down links, no HOP_OPEN within connect_timeout, a
/// first message that is not a HOP_OPEN, and hops of plans no newer than the last one claimed
/// (stale, or a second hop for a plan that already has its own: each is told why with an ERROR).
/// A hop of a newer plan waits, however long its stage takes to load.
class HopInbox {
 public:
  explicit HopInbox(HopOptions opts);
  /// clear(), then stops the sweeper.
  ~HopInbox();
  HopInbox(const HopInbox&) = delete;
  HopInbox& operator=(const HopInbox&) = delete;

  /// Takes an authenticated connection of role hop and starts answering its heartbeats. Refused
  /// (ERROR kUnavailable, closed) when kMaxHeldHops are already held.
  void add(std::unique_ptr<Connection> conn);
  /// The hop of plan `epoch` sent by stage `from_stage` (one take() at a time): its plan is then
  /// claimed. A hop of this
  /// plan from another stage gets an ERROR and is closed; hops of newer plans wait. Polls `abort`
  /// (when given) and returns its error; kDeadlineExceeded after `timeout`.
  Result<std::unique_ptr<Link>> take(uint64_t epoch, uint16_t from_stage, Millis timeout,
                                     const std::function<Status()>& abort = {});
  /// Closes every held hop.
  void clear();
  /// Hops held now (for tests and logs).
  size_t held() const;

 private:
  struct Held {
    std::unique_ptr<Link> link;
    std::optional<HopOpen> open;  // once its HOP_OPEN arrived
    Clock::time_point since;
  };
  struct Want {
    uint64_t epoch;
    uint16_t from_stage;
  };
  struct DroppedHop {
    std::unique_ptr<Link> link;
    Status why;         // the ERROR its sender is told; Ok: none
    std::string quiet;  // else why it is closed
  };
  using Dropped = std::vector<DroppedHop>;
  // One look at every held hop (mu_ held): reads HOP_OPENs, moves the hops that cannot serve into
  // `drop`, and with `claim` takes out the hop want_ asks for (claimed_ is then its plan).
  std::unique_ptr<Link> sweep(Dropped& drop, bool claim);
  // Tells and closes (not under mu_: sends, and joins the links' threads).
  static void close_dropped(Dropped& drop);
  void sweep_loop();

  HopOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // stop_, held_ no longer empty
  std::list<Held> held_;
  std::optional<Want> want_;   // the take() in progress
  uint64_t claimed_ = 0;       // newest plan whose hop was taken
  bool stop_ = false;
  std::thread sweeper_;
};

}  // namespace shoal::pool
