#include "pool/host_local.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "backend/backend.h"
#include "pool/auth.h"

extern char** environ;

namespace shoal::pool {
namespace {

std::string describe_exit(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "left the pool (exit status 0)";
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "stopped";
}

}  // namespace

Result<std::vector<std::string>> device_list(const std::string& device) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t comma = device.find(',', at);
    std::string entry = device.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const size_t first = entry.find_first_not_of(" \t"), last = entry.find_last_not_of(" \t");
    if (first == std::string::npos)
      return make_error(Code::kInvalidArgument, "--device '{}' has an empty entry (expected e.g. cuda:0,cuda:1)",
                        device);
    out.push_back(entry.substr(first, last - first + 1));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

std::vector<LocalPlacement> local_placements(const std::vector<std::string>& devices, size_t n) {
  // The memory a process lends from: a card by its index (as create_backend reads it), else the
  // machine's RAM (a malformed cuda:... stands for itself: create_backend refuses it).
  auto memory_of = [](const std::string& d) -> std::string {
    bool bad = false;
    const std::optional<int> index = cuda_device_index(d, &bad);
    return index ? fmt::format("cuda:{}", *index) : bad ? d : "ram";
  };
  std::vector<LocalPlacement> out(devices.empty() ? 0 : n);
  for (size_t i = 0; i < out.size(); ++i) out[i].device = devices[i % devices.size()];
  for (auto& a : out) {
    a.mem_share = int(std::count_if(out.begin(), out.end(),
                                    [&](const LocalPlacement& b) { return memory_of(b.device) == memory_of(a.device); }));
  }
  return out;
}

std::string random_secret() {
  const Nonce n = random_nonce();
  std::string s;
  for (uint8_t b : n) s += fmt::format("{:02x}", b);
  return s;
}

Result<std::unique_ptr<LocalWorkers>> LocalWorkers::spawn(const LocalWorkerOptions& o) {
  std::unique_ptr<LocalWorkers> w(new LocalWorkers());
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "SHOAL_SECRET=", 13) != 0) env_strings.emplace_back(*e);
  }
  env_strings.push_back("SHOAL_SECRET=" + o.secret);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  for (size_t i = 0; i < o.workers.size(); ++i) {
    const LocalPlacement& at = o.workers[i];
    std::vector<std::string> args = {"shoal", "--log-level", o.log_level, "join", o.host,
                                     "-m", o.model, "--device", at.device, "--name", fmt::format("local-{}", i + 1),
                                     "--dead-after", std::to_string(o.dead_after_ms),
                                     "--mem-share", std::to_string(at.mem_share), "--no-progress",
                                     "--wait-host", "0"};  // (the host is up: one try, full timeouts)
    if (o.threads > 0) args.insert(args.end(), {"--threads", std::to_string(o.threads)});
    if (o.half_prefill) args.insert(args.end(), {"--prefill-precision", "half"});
    if (!o.warm_up) args.push_back("--no-warmup");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return make_error(Code::kIoError, "fork for local worker {}: {}", i + 1, std::strerror(errno));
    if (pid == 0) {
      sigset_t none;  // the host may block SIGINT / SIGTERM (its signal thread): the worker starts clean
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the parent died before prctl took effect
      execve(o.exe.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    w->pids_.push_back(pid);
    w->statuses_.push_back(0);
  }
  return w;
}

Status LocalWorkers::check() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] > 0 && waitpid(pids_[i], &statuses_[i], WNOHANG) == pids_[i]) {
      const pid_t pid = pids_[i];
      pids_[i] = -1;
      return make_error(Code::kUnavailable, "local worker {} (pid {}) {}", i + 1, pid, describe_exit(statuses_[i]));
    }
    if (pids_[i] < 0) return make_error(Code::kUnavailable, "local worker {} {}", i + 1, describe_exit(statuses_[i]));
  }
  return Status::Ok();
}

void LocalWorkers::wait_exit(std::chrono::milliseconds grace) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    bool running = false;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (pids_[i] > 0 && waitpid(pids_[i], &statuses_[i], WNOHANG) == pids_[i]) pids_[i] = -1;
      running = running || pids_[i] > 0;
    }
    if (!running || std::chrono::steady_clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

LocalWorkers::~LocalWorkers() {
  for (pid_t p : pids_) {
    if (p > 0) kill(p, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (size_t i = 0; i < pids_.size(); ++i) {
    while (pids_[i] > 0) {
      if (waitpid(pids_[i], &statuses_[i], WNOHANG) == pids_[i]) {
        pids_[i] = -1;
      } else if (std::chrono::steady_clock::now() >= deadline) {
        kill(pids_[i], SIGKILL);
        waitpid(pids_[i], &statuses_[i], 0);
        pids_[i] = -1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
}

}  // namespace shoal::pool
