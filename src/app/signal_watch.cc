#include "app/signal_watch.h"

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "app/generate_text.h"
#include "core/log.h"
#include "pool/host.h"

namespace shoal::app {
namespace {

using Clock = std::chrono::steady_clock;

// A repeat within this long of the first signal is the same request delivered twice (`timeout`
// signals the process and then its group; systemd, the main process and then its cgroup).
constexpr std::chrono::milliseconds kRepeatWindow{500};

// Ends the process by `sig`'s default action now: from the watcher thread, the only one that
// takes the signal. No logger or stdio: the callback may hold their locks.
[[noreturn]] void quit_now(int sig) {
  const std::string msg = std::string("shoal: ") + signal_name(sig) + " again: quitting now\n";
  (void)!::write(STDERR_FILENO, msg.data(), msg.size());
  die_by_signal(sig);
}

}  // namespace

void die_by_signal(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
  std::_Exit(128 + sig);  // (not reached: the default action of both is to terminate)
}

SignalWatch::SignalWatch(std::function<void(int)> on_signal) {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  // SIGHUP (the terminal closed) too, unless it is ignored (nohup): then it stays ignored.
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) sigaddset(&set_, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  watcher_ = std::thread([this, fn = std::move(on_signal)] {
    Clock::time_point first;
    for (;;) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0) continue;
      std::lock_guard lock(mu_);
      if (done_) return;  // the destructor's wake-up
      if (!callback_.joinable()) {
        first = Clock::now();
        // On its own thread: this one stays free for a second signal. SIGPIPE blocked there: a
        // log line to a pipe the same hang-up closed (`2>&1 | tee`) fails with EPIPE instead of
        // ending the process before its bye.
        callback_ = std::thread([fn, sig] {
          sigset_t pipe;
          sigemptyset(&pipe);
          sigaddset(&pipe, SIGPIPE);
          pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
          fn(sig);
        });
      } else if (Clock::now() - first >= kRepeatWindow) {
        quit_now(sig);
      }
    }
  });
}

SignalWatch::~SignalWatch() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  pthread_kill(watcher_.native_handle(), SIGTERM);  // blocked there: wakes sigwait, nothing else
  watcher_.join();
  if (callback_.joinable()) callback_.join();
}

HostSignals::HostSignals()
    : watch_([this](int sig) {
        std::lock_guard lock(mu_);
        spdlog::warn("{}: the host stops{}", signal_name(sig), host_ ? "; saying bye to the pool" : "");
        if (host_) host_->say_bye(fmt::format("the host was stopped ({})", signal_name(sig)));
        end_answer_on_stdout();
        std::fflush(stdout);
        std::_Exit(128 + sig);
      }) {}

HostSignals::Hold::Hold(HostSignals& s, pool::Host& host) : s_(s) {
  std::lock_guard lock(s_.mu_);
  s_.host_ = &host;
}

HostSignals::Hold::~Hold() {
  std::lock_guard lock(s_.mu_);
  s_.host_ = nullptr;
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

}  // namespace shoal::app
