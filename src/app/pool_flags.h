// Flags of the pool's subcommands (`shoal host`, `shoal join`) and of `--pool N` on run/check,
// and the local pool those start: the host plus N-1 worker processes on loopback.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/common_options.h"
#include "pool/host.h"
#include "pool/host_local.h"

namespace shoal::app {

struct PoolFlags {
  int pool = 1;                      // --pool N: processes in the local pool (run/check)
  std::string hop_dtype = "f16";     // --hop-dtype
  bool hop_dtype_set = false;        // --hop-dtype was given
  int dead_after_ms = 2000;          // --dead-after
  bool dead_after_set = false;       // --dead-after was given
  std::string layers_local = "auto"; // --layers-local N|auto
  std::string split;                 // --split 0-3,4-7
};

/// --hop-dtype, --dead-after, --layers-local, --split; with `local_pool` also --pool.
void add_pool_flags(CLI::App* cmd, PoolFlags& f, bool local_pool);

/// A CLI11 check of a HOST:PORT option (pool::parse_address; port 0 only with `allow_port_zero`):
/// a bad one is a usage error naming the option and what is wrong.
CLI::Validator address_check(bool allow_port_zero);

/// --layers-local's value as a layer count (callers handle "auto"). kInvalidArgument saying what
/// it expects.
Result<uint32_t> parse_layers_local(const std::string& text);

/// Host options from the model and pool flags (secret and address are the caller's).
/// Errors: kInvalidArgument naming the bad flag value.
Result<pool::HostOptions> host_options(const ModelFlags& m, const PoolFlags& p);

/// For `run` / `check` without --pool (a pool of one): the pool flags are still checked as
/// host_options() checks them (kInvalidArgument naming the flag), and --layers-local, --split,
/// --hop-dtype and --dead-after, which shape a pool, are named in a warning when set.
Status check_pool_flags_alone(const PoolFlags& p);

/// p with the number of processes `run` / `check` start as its pool: --pool N; or, with --pool
/// left at 1 and a --device list of L > 1 entries, L (one process per device; pool::device_list).
/// kInvalidArgument when the list has an empty entry, more than 64 entries, or more entries than N
/// (a listed device would hold nothing).
Result<PoolFlags> local_pool_flags(const ModelFlags& m, const PoolFlags& p);

/// A host and its local worker processes; the host goes first (it says bye), then the workers.
struct LocalPool {
  std::unique_ptr<pool::LocalWorkers> workers;
  std::unique_ptr<pool::Host> host;
  // The host says bye first; its workers then leave by themselves (a signal only for one that
  // has not within a second).
  ~LocalPool() {
    host.reset();
    if (workers) workers->wait_exit(std::chrono::milliseconds(1000));
  }
};

/// Starts the host on a random loopback port with a random secret, p.pool - 1 local workers
/// (each with threads/N CPU threads unless -t is given; devices by local_placements, so a --device
/// list spreads the pool over several GPUs), waits for them and makes the first plan
/// (printed on stderr). With --layers-local and --split unset the layers are dealt evenly.
/// `before_workers` (may be empty) runs once the host is open, before any worker starts: its
/// error (e.g. a prompt that cannot fit) is returned at once.
Result<std::unique_ptr<LocalPool>> start_local_pool(const ModelFlags& m, const PoolFlags& p, bool tokenizer,
                                                    const std::function<Status(pool::Host&)>& before_workers = {});

/// The room secret: --secret, else $SHOAL_SECRET. kInvalidArgument when neither is set.
Result<std::string> room_secret(const std::string& flag);

/// "8G", "512M", "1073741824": bytes (K/M/G/T are powers of 1024). kInvalidArgument otherwise.
Result<uint64_t> parse_bytes(const std::string& text);

}  // namespace shoal::app
