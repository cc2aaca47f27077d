// SIGINT, SIGTERM and SIGHUP for the subcommands that take part in a pool (`shoal host`, `shoal
// join`, `run` / `check --pool N`): they leave it in order (a BYE to every peer) instead of
// vanishing into the peers' silence timeouts. A single-process `run` says it was stopped, then dies
// by the signal.
#pragma once

#include <signal.h>

#include <functional>
#include <mutex>
#include <thread>

namespace shoal::pool {
class Host;
}  // namespace shoal::pool

namespace shoal::app {

/// Blocks SIGINT, SIGTERM and SIGHUP (unless SIGHUP is ignored, as under nohup) in the calling
/// thread (and so in every thread started after it) and, when the first of them arrives, runs
/// `on_signal(signo)` on a thread of its own (sigwait: the callback is ordinary code, not a signal
/// handler). A second one at least 0.5 s later ends the process at once by the signal's default
/// action, even while the callback is stuck (a full stdout pipe, a peer that stopped reading); one
/// sooner is taken for the same request delivered twice (`timeout`, a process group) and ignored.
/// Construct it before any other thread starts, or those threads may still take the signal's
/// default action. The destructor stops watching (no callback starts afterwards) and joins, waiting
/// for a callback already running.
class SignalWatch {
 public:
  explicit SignalWatch(std::function<void(int)> on_signal);
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

 private:
  sigset_t set_{};
  std::mutex mu_;  // done_, callback_
  bool done_ = false;
  std::thread watcher_;   // sigwait, for as long as the watch lives
  std::thread callback_;  // on_signal, once the first signal came
};

/// The signals of a command that hosts a pool (`host`, `run --pool N`, `check --pool N`): on
/// SIGINT, SIGTERM or SIGHUP it says bye to every worker and guest through the host it holds (none
/// yet: nothing to say), flushes stdout and exits 128 + signo. Construct it first, like a
/// SignalWatch.
class HostSignals {
 public:
  HostSignals();
  /// While it lives (it must go before the host does), a signal says bye through `host`.
  class Hold {
   public:
    Hold(HostSignals& s, pool::Host& host);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    HostSignals& s_;
  };

 private:
  std::mutex mu_;  // host_
  pool::Host* host_ = nullptr;
  SignalWatch watch_;  // last: its callback uses the members above
};

/// Ends the process by `sig`'s default action (a shell sees it killed by the signal): restores the
/// default action, unblocks `sig` in the calling thread and raises it there.
[[noreturn]] void die_by_signal(int sig);

/// "SIGINT", "SIGTERM", "SIGHUP" (others: "a signal").
const char* signal_name(int signo);

}  // namespace shoal::app
