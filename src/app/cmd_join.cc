// shoal join: lend this machine's device to a pool (docs/protocol.md, "Host and worker").
#include <memory>
#include <mutex>

#include "app/commands.h"
#include "app/pool_flags.h"
#include "app/signal_watch.h"
#include "core/log.h"
#include "pool/transport_tcp.h"
#include "pool/worker.h"

namespace shoal::app {

namespace {

struct JoinOptions {
  std::string host;
  std::string secret;
  std::string model;
  std::string device = "cpu";
  int threads = 0;
  std::string prefill_precision = "exact";
  std::string mem;
  int mem_share = 1;
  std::string name;
  std::string data_listen;
  int dead_after_ms = 2000;
  int wait_host_s = 60;
  bool no_progress = false;
  bool no_warmup = false;
  bool stay = false;
};

// How long a --stay worker waits for its host to come back (a year: until stopped).
constexpr pool::Millis kStayWait{int64_t(365) * 24 * 3600 * 1000};

int join(const JoinOptions& o) {
  if (Status st = check_one_device(o.device); !st.ok()) return fail(st);
  // SIGINT / SIGTERM / SIGHUP: leave the pool in order (the host hears a bye, not a silence).
  // Watched before any thread starts.
  std::mutex mu;  // running, stop_signal
  pool::Worker* running = nullptr;
  int stop_signal = 0;
  SignalWatch signals([&](int sig) {
    spdlog::info("{}: leaving the pool", signal_name(sig));
    std::lock_guard lock(mu);
    if (stop_signal == 0) stop_signal = sig;
    if (running) running->stop();
  });
  auto secret = room_secret(o.secret);
  if (!secret.ok()) return usage_error(secret.status().message());
  pool::WorkerOptions w;
  w.host = o.host;
  w.secret = *secret;
  w.model = o.model;
  w.device = o.device;
  w.threads = o.threads;
  w.half_prefill = o.prefill_precision == "half";
  w.warm_up = !o.no_warmup;
  if (!o.mem.empty()) {
    auto mem = parse_bytes(o.mem);
    if (!mem.ok()) return usage_error(mem.status().with_context("--mem").message());
    w.mem = *mem;
  }
  w.mem_share = o.mem_share;
  w.name = o.name;
  w.data_listen = o.data_listen;
  w.progress = !o.no_progress;
  w.host_wait = pool::Millis(int64_t(o.wait_host_s) * 1000);
  w.hops.dead_after = pool::Millis(o.dead_after_ms);
  w.hops.ping_interval = pool::Millis(std::max(50, o.dead_after_ms / 4));
  for (;;) {
    pool::Worker worker(w, pool::tcp_network());  // (a copy: with --stay the next round joins as this one)
    {
      std::lock_guard lock(mu);
      running = &worker;
      if (stop_signal != 0) worker.stop();
    }
    const Status st = worker.run();
    int sig = 0;
    {
      std::lock_guard lock(mu);
      running = nullptr;
      sig = stop_signal;
    }
    // A worker that left the pool on a signal exits 0 (it served); one stopped before it got in, as
    // an interrupted command does.
    if (sig != 0 && !worker.joined()) {
      spdlog::warn("stopped before it joined the host at {}", o.host);
      return 128 + sig;
    }
    // --stay: a host that ended (said bye, or was lost) is waited for and joined again; a refusal
    // (another model, a name taken) or a failure of this worker ends it.
    const bool again = o.stay && sig == 0 && worker.joined() && (st.ok() || st.code() == Code::kUnavailable);
    if (!again) return st.ok() ? 0 : fail(st);
    if (!st.ok()) spdlog::warn("{}", st.to_string());
    spdlog::info("--stay: waiting for the host at {} to join it again", o.host);
    w.host_wait = kStayWait;
  }
}

}  // namespace

CommandFn add_join_command(CLI::App& app) {
  auto o = std::make_shared<JoinOptions>();
  CLI::App* cmd = app.add_subcommand("join", "Lend this machine's device to a pool: hold some layers for a host");
  cmd->add_option("address", o->host, "The host's room, HOST:PORT")->required()->check(address_check(false));
  cmd->add_option("--secret", o->secret, "The room secret (default: $SHOAL_SECRET)");
  cmd->add_option("-m,--model", o->model, "This machine's copy of the model (default: the path the host sends)");
  cmd->add_option("--device", o->device, "Where the layers run: cpu, cpu-ref, cuda:N")
      ->capture_default_str()
      ->check([](const std::string& text) {
        const Status st = check_device_name(text);  // (one device: check_one_device says why not a list)
        return st.ok() || text.find(',') != std::string::npos ? std::string() : st.message();
      });
  add_threads_flag(cmd, o->threads);
  add_prefill_precision_flag(cmd, o->prefill_precision);
  add_no_warmup_flag(cmd, o->no_warmup);
  cmd->add_option("--mem", o->mem, "Memory lent to the pool, e.g. 8G (default: what the device has free)");
  cmd->add_option("--mem-share", o->mem_share,
                  "Without --mem, lend 1/N of the free memory (N processes sharing one device, as --pool starts them)")
      ->capture_default_str()
      ->transform(int_range(1, 1024));
  cmd->add_option("--name", o->name, "This worker's name in plans and errors (default: HOSTNAME-PID)");
  cmd->add_option("--data-listen", o->data_listen,
                  "The hop listener, HOST:PORT: where the previous stage connects, at PORT of the address this "
                  "worker reaches the host from (HOST: the interface listened on; 0.0.0.0 for all; default: the "
                  "address that reaches the host, any port)")
      ->check(address_check(true));
  cmd->add_flag("--no-progress", o->no_progress, "No load progress bar on stderr (the local pools' workers)");
  cmd->add_option("--dead-after", o->dead_after_ms, "A peer silent this long (ms) counts as dead")
      ->capture_default_str()
      ->transform(int_range(100, 3600000));
  cmd->add_flag("--stay", o->stay,
                "When the host ends (it says bye or is lost), wait for it and join again, as long as it takes (a "
                "host restarted, one `shoal host -p` after another); a signal still ends the worker");
  cmd->add_option("--wait-host", o->wait_host_s,
                  "Seconds to keep trying a host that is not up yet (name not resolved, refused or no answer); 0: try once")
      ->capture_default_str()
      ->transform(int_range(0, 86400));
  return [o] { return join(*o); };
}

}  // namespace shoal::app
