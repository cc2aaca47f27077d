// SIGINT and SIGTERM for the long-running subcommands (`shoal host`, `shoal join`): they leave the
// pool in order (a BYE to every peer) instead of vanishing into the peers' silence timeouts.
#pragma once

#include <signal.h>

#include <atomic>
#include <functional>
#include <thread>

namespace shoal::app {

/// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread started after it) and
/// runs `on_signal(signo)` on a thread of its own when the first of them arrives (sigwait: the
/// callback is ordinary code, not a signal handler). A second signal while the first is being
/// handled quits at once (exit status 128 + signo, stdout flushed). Construct it before any other
/// thread starts, or those threads may still take the signal's default action. The destructor
/// stops watching (the callback does not run afterwards) and joins the thread; it must not run
/// while the callback does.
class SignalWatch {
 public:
  explicit SignalWatch(std::function<void(int)> on_signal);
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

 private:
  sigset_t set_{};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

/// "SIGINT", "SIGTERM" (or "signal N").
const char* signal_name(int signo);

}  // namespace shoal::app
