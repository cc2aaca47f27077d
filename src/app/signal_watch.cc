#include "app/signal_watch.h"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/log.h"

namespace shoal::app {

SignalWatch::SignalWatch(std::function<void(int)> on_signal) {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  thread_ = std::thread([this, fn = std::move(on_signal)] {
    bool first = true;
    for (;;) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0 || done_) return;
      if (!first) {
        spdlog::warn("{} again: quitting now", signal_name(sig));
        std::fflush(stdout);
        std::_Exit(128 + sig);
      }
      first = false;
      fn(sig);
    }
  });
}

SignalWatch::~SignalWatch() {
  done_ = true;
  // Wakes sigwait (done_ is set: the thread returns without calling anything).
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace shoal::app
