// Local worker processes for `shoal run --pool N` and `shoal check --pool N`: the host forks and
// executes its own binary's `join` N-1 times, on the host's loopback room. The room secret travels
// in the child's environment (SHOAL_SECRET), never on a command line. Each child asks the kernel
// to kill it when its parent dies (prctl PR_SET_PDEATHSIG), so workers never outlive the host, even
// when the host is killed; the destructor ends them in order otherwise.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace shoal::pool {

/// Where one local worker runs: its device and how many processes of the pool draw on that
/// device's memory (it lends free memory / mem_share).
struct LocalPlacement {
  std::string device = "cpu";
  int mem_share = 1;
};

struct LocalWorkerOptions {
  std::string exe = "/proc/self/exe";  // the shoal binary
  std::string host;                    // the room's address, "127.0.0.1:PORT"
  std::string secret;
  std::string model;
  std::vector<LocalPlacement> workers;  // one per worker: local-(i + 1) takes entry i
  int threads = 0;                     // per worker (0: the worker's default)
  bool half_prefill = false;           // --prefill-precision half
  bool warm_up = true;                 // false: --no-warmup
  std::string log_level = "info";
  int dead_after_ms = 2000;
};

class LocalWorkers {
 public:
  /// Starts one worker per entry of opts.workers, named local-1 .. local-n. Errors: kIoError when
  /// fork fails (the ones already started are ended).
  static Result<std::unique_ptr<LocalWorkers>> spawn(const LocalWorkerOptions& opts);
  /// Asks every live worker to stop (SIGTERM), waits up to 2 s, then SIGKILLs and reaps.
  ~LocalWorkers();
  LocalWorkers(const LocalWorkers&) = delete;
  LocalWorkers& operator=(const LocalWorkers&) = delete;

  /// Ok while every worker process runs; kUnavailable naming the first one that exited and how.
  Status check();
  /// Waits up to `grace` for every worker to exit by itself (after the host's bye), reaping them;
  /// the destructor then signals only those still running.
  void wait_exit(std::chrono::milliseconds grace);
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  LocalWorkers() = default;
  std::vector<pid_t> pids_;     // -1 once reaped
  std::vector<int> statuses_;   // waitpid status once reaped
};

/// The entries of a device list: "cuda:0,cuda:1" gives {"cuda:0", "cuda:1"} (spaces around an
/// entry dropped), one device gives itself. kInvalidArgument for an empty entry.
Result<std::vector<std::string>> device_list(const std::string& device);

/// Where each of the n processes of a local pool runs (the host first, then local-1 ...): entry
/// i mod devices.size() of `devices` (not empty). mem_share counts the processes drawing on the
/// same memory (every cpu / cpu-ref process on the machine's RAM, cuda:N on its card, "cuda" and
/// "cuda:00" being cuda:0), so that each lends free memory / mem_share.
std::vector<LocalPlacement> local_placements(const std::vector<std::string>& devices, size_t n);

/// The secret: 32 random bytes as hex (OpenSSL's RAND_bytes).
std::string random_secret();

}  // namespace shoal::pool
