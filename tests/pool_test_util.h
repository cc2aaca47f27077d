// Helpers for the pool's end-to-end tests: a child process whose stdin the test writes and whose
// stdout and stderr it reads while it runs (a `shoal host` answering prompts, a `shoal join`), and
// the two ways tests start those.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace shoal::test {

using namespace std::chrono_literals;

class Child {
 public:
  /// Starts argv[0] with `env` added to the environment ("NAME=value").
  static std::unique_ptr<Child> start(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
    auto c = std::unique_ptr<Child>(new Child());
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return nullptr;
    std::vector<std::string> args = argv;
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    av.push_back(nullptr);
    std::vector<std::string> envs;
    for (char** e = environ; e && *e; ++e) envs.emplace_back(*e);
    envs.insert(envs.end(), env.begin(), env.end());
    std::vector<char*> ev;
    for (auto& e : envs) ev.push_back(e.data());
    ev.push_back(nullptr);
    c->pid_ = fork();
    if (c->pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) close(fd);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigaction(SIGHUP, &dfl, nullptr);  // as from a terminal, even when the tests run under nohup
      execve(av[0], av.data(), ev.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    c->stdin_ = in[1];
    c->reader_ = std::thread([p = c.get(), o = out[0], e = err[0]] { p->read_loop(o, e); });
    return c;
  }

  ~Child() {
    kill(SIGKILL);
    wait_exit(10s);
    if (stdin_ >= 0) close(stdin_);
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid() const { return pid_; }
  void kill(int sig) {
    if (pid_ > 0 && !exited_) ::kill(pid_, sig);
  }
  void write(const std::string& s) { (void)!::write(stdin_, s.data(), s.size()); }
  void close_stdin() {
    if (stdin_ >= 0) close(stdin_);
    stdin_ = -1;
  }

  /// Waits until stderr matches `re`; false after `timeout`. `from`: skip the first bytes.
  bool wait_err(const std::string& re, std::chrono::milliseconds timeout, size_t from = 0) {
    return wait_for(err_, re, timeout, from);
  }
  bool wait_out(const std::string& re, std::chrono::milliseconds timeout, size_t from = 0) {
    return wait_for(out_, re, timeout, from);
  }
  /// Waits until stdout, from byte `from` on, contains `text` literally.
  bool wait_out_text(const std::string& text, std::chrono::milliseconds timeout, size_t from = 0) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return from <= out_.size() && out_.find(text, from) != std::string::npos; });
  }
  std::string err() {
    std::lock_guard lock(mu_);
    return err_;
  }
  std::string out() {
    std::lock_guard lock(mu_);
    return out_;
  }
  /// The exit status (-1: killed by a signal or still running after `timeout`).
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!exited_) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        signal_ = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        break;
      }
      if (std::chrono::steady_clock::now() >= until) return -1;
      std::this_thread::sleep_for(10ms);
    }
    return status_;
  }
  /// The signal that killed it (0: it exited, or wait_exit has not seen it end).
  int term_signal() const { return signal_; }

 private:
  Child() = default;

  bool wait_for(const std::string& buf, const std::string& re, std::chrono::milliseconds timeout, size_t from) {
    const std::regex r(re);
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      return from <= buf.size() && std::regex_search(buf.begin() + std::ptrdiff_t(from), buf.end(), r);
    });
  }

  void read_loop(int out_fd, int err_fd) {
    pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
    int open_fds = 2;
    char buf[4096];
    while (open_fds > 0) {
      if (poll(fds, 2, -1) < 0) break;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = read(fds[i].fd, buf, sizeof buf);
        if (n <= 0) {
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
          continue;
        }
        std::lock_guard lock(mu_);
        (i == 0 ? out_ : err_).append(buf, size_t(n));
        cv_.notify_all();
      }
    }
  }

  pid_t pid_ = -1;
  int stdin_ = -1;
  bool exited_ = false;
  int status_ = -1;
  int signal_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_, err_;
  std::thread reader_;
};

/// A `shoal host` on a free loopback port; returns its address (empty on failure).
inline std::string host_address(Child& host) {
  if (!host.wait_err(R"(room open on 127\.0\.0\.1:\d+)", 60s)) return "";
  std::smatch m;
  const std::string err = host.err();
  std::regex_search(err, m, std::regex(R"(room open on (127\.0\.0\.1:\d+))"));
  return m[1];
}

/// `shoal host` for stories260K whose workers hold every layer (--layers-local 0), waiting for
/// `n_workers`, greedy, 48 tokens, with the room secret in SHOAL_SECRET; EXTRA... after that.
inline std::unique_ptr<Child> stories_host(const std::string& secret, int n_workers,
                                           const std::vector<std::string>& extra = {},
                                           const std::string& listen = "127.0.0.1:0") {
  std::vector<std::string> argv = {shoal_bin(), "host", "-m", fixture("models/stories260K.gguf"), "--listen", listen,
                                   "--workers", std::to_string(n_workers), "--layers-local", "0", "-c", "128", "-n",
                                   "48", "--temp", "0", "-t", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Child::start(argv, {"SHOAL_SECRET=" + secret});
}

/// `shoal join ADDRESS --name NAME -t 1 EXTRA...` with the room secret in SHOAL_SECRET.
inline std::unique_ptr<Child> join(const std::string& address, const std::string& name, const std::string& secret,
                                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {shoal_bin(), "join", address, "--name", name, "-t", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Child::start(argv, {"SHOAL_SECRET=" + secret});
}

}  // namespace shoal::test
