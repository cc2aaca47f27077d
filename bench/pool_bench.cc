// pool_bench: how fast a pool of 1..N stages runs one model (DESIGN.md "Performance accounting":
// a pool is bound by hops; report laps/s, tokens per lap and time per hop). For each pool size and
// injected one-way latency it plans the layers evenly, then measures
//   prefill: one prompt of --prompt tokens (frames of 16, up to 6 in flight), tokens/s;
//   decode:  --gen laps of one token each (greedy), laps/s = tokens/s;
//   hop:     (lap time - lap time of the 1-stage pool) / hops per lap, the cost of one hop.
// Stages run as threads of this process (each its own backend), over TCP loopback behind a
// userspace delay proxy (bench/pool_delay_network.h: this kernel has no netem); --processes runs
// the workers as `shoal join` processes instead (no injected latency then).
//
//   pool_bench -m stories260K.gguf --stages 1,2,3,4 --delay-ms 0,1,20
//   pool_bench -m qwen3-0.6b-q8_0.gguf --stages 1,2,4 --processes --shoal build-rel/shoal
//   pool_bench -m llama3-8b-q4_0.gguf --stages 1,2 --processes --shoal build-rel/shoal
//              --device cuda:0,cuda:1 --prompt 512 --gen 128   (one GPU per stage)
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>

#include "core/log.h"
#include "pool/host.h"
#include "pool/host_local.h"
#include "pool/transport_tcp.h"
#include "pool/worker.h"
#include "pool_delay_network.h"

namespace shoal {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct Options {
  std::string model;
  std::vector<int> stages = {1, 2, 3, 4};
  std::vector<double> delays_ms = {0};
  int n_prompt = 64;
  int n_gen = 32;
  int threads = 1;
  std::string hop = "f16";
  bool processes = false;
  std::string shoal = "shoal";
  std::vector<std::string> devices = {"cpu"};  // stage i on entry i mod size (pool::local_placements)
};

struct Figures {
  double prefill_tps = 0, decode_lps = 0, lap_ms = 0;
  std::string devices;  // the stages' devices, comma-separated (host first)
};

double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

Result<Figures> measure(pool::Host& host, const Options& o) {
  Pipeline& p = host.pipeline();
  std::mt19937 rng(42);
  std::vector<int32_t> prompt(size_t(o.n_prompt));
  for (auto& id : prompt) id = int32_t(rng() % uint32_t(p.config().vocab_size));
  StepOutput out;
  out.mode = HeadMode::kArgmaxLast;
  SHOAL_RETURN_IF_ERROR(p.forward(std::span(prompt).first(16), 0, out));  // warm-up
  SHOAL_RETURN_IF_ERROR(p.rewind(0));
  Figures f;
  auto t0 = SteadyClock::now();
  SHOAL_RETURN_IF_ERROR(p.forward(prompt, 0, out));
  f.prefill_tps = o.n_prompt / seconds_since(t0);
  int32_t next = out.ids.at(0);
  t0 = SteadyClock::now();
  for (int i = 0; i < o.n_gen; ++i) {
    SHOAL_RETURN_IF_ERROR(p.forward(std::span(&next, 1), o.n_prompt + i, out));
    next = out.ids.at(0);
  }
  const double s = seconds_since(t0);
  f.decode_lps = o.n_gen / s;
  f.lap_ms = s / o.n_gen * 1e3;
  return f;
}

Result<Figures> run_config(const Options& o, int n_stages, double delay_ms) {
  bench::DelayNetwork delayed(pool::tcp_network(), std::chrono::microseconds(int64_t(delay_ms * 1000)));
  pool::Network& net = delay_ms > 0 ? static_cast<pool::Network&>(delayed) : pool::tcp_network();
  const std::vector<pool::LocalPlacement> at = pool::local_placements(o.devices, size_t(n_stages));
  pool::HostOptions ho;
  ho.model = o.model;
  ho.device = at[0].device;
  ho.mem_share = at[0].mem_share;
  ho.threads = o.threads;
  ho.n_ctx = o.n_prompt + o.n_gen + 16;
  ho.progress = false;
  ho.tokenizer = false;
  ho.secret = pool::random_secret();
  ho.spread = true;
  ho.hop_dtype = o.hop == "f32" ? pool::HopDType::kF32 : pool::HopDType::kF16;
  ho.hops.dead_after = pool::Millis(10000);
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<pool::Host> host, pool::Host::open(ho, net));
  const size_t n_workers = size_t(n_stages - 1);
  std::vector<std::unique_ptr<pool::Worker>> workers;
  std::vector<std::thread> threads;
  std::unique_ptr<pool::LocalWorkers> procs;
  if (o.processes) {
    pool::LocalWorkerOptions lw;
    lw.exe = o.shoal;
    lw.host = host->address();
    lw.secret = ho.secret;
    lw.model = o.model;
    lw.threads = o.threads;
    lw.log_level = "warning";
    lw.dead_after_ms = 10000;
    lw.workers.assign(at.begin() + 1, at.end());
    SHOAL_ASSIGN_OR_RETURN(procs, pool::LocalWorkers::spawn(lw));
  } else {
    for (size_t i = 0; i < n_workers; ++i) {
      pool::WorkerOptions w;
      w.host = host->address();
      w.secret = ho.secret;
      w.threads = o.threads;
      w.device = at[i + 1].device;
      w.mem_share = at[i + 1].mem_share;
      w.name = "w" + std::to_string(i + 1);
      w.hops.dead_after = pool::Millis(10000);
      workers.push_back(std::make_unique<pool::Worker>(w, net));
      threads.emplace_back([wk = workers.back().get()] { (void)wk->run(); });
    }
  }
  auto check = [&]() { return procs ? procs->check() : Status::Ok(); };
  Status st = host->wait_for_workers(n_workers, pool::Millis(120000), check);
  if (st.ok()) st = host->ensure_plan();
  Result<Figures> f = st.ok() ? measure(*host, o) : Result<Figures>(st);
  host.reset();
  for (auto& t : threads) t.join();
  if (f.ok())
    for (const auto& a : at) f->devices += (f->devices.empty() ? "" : ",") + a.device;
  return f;
}

template <typename T>
std::vector<T> parse_list(const std::string& s) {
  std::vector<T> v;
  size_t start = 0;
  while (start < s.size()) {
    const size_t comma = std::min(s.find(',', start), s.size());
    v.push_back(T(std::stod(s.substr(start, comma - start))));
    start = comma + 1;
  }
  return v;
}

int run(const Options& o) {
  std::printf("| model | stages | devices | one-way delay | hop dtype | prefill tok/s | decode laps/s (tok/s) | tokens/lap | ms/lap | ms/hop |\n");
  std::printf("|---|---:|---|---:|---|---:|---:|---:|---:|---:|\n");
  const std::string name = o.model.substr(o.model.find_last_of('/') + 1);
  for (double d : o.delays_ms) {
    double base_lap = 0;
    for (int n : o.stages) {
      auto f = run_config(o, n, d);
      if (!f.ok()) {
        std::fprintf(stderr, "pool_bench: %d stages, %.1f ms: %s\n", n, d, f.status().to_string().c_str());
        return 1;
      }
      if (n == 1) base_lap = f->lap_ms;
      const int hops = n > 1 ? n : 0;
      const std::string hop = hops > 0 && base_lap > 0 ? fmt::format("{:.3f}", (f->lap_ms - base_lap) / hops) : "-";
      std::printf("| %s | %d%s | %s | %.1f ms | %s | %.1f | %.1f | 1 | %.3f | %s |\n", name.c_str(), n,
                  o.processes ? " procs" : "", f->devices.c_str(), d, o.hop.c_str(), f->prefill_tps, f->decode_lps,
                  f->lap_ms, hop.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  shoal::Options o;
  CLI::App app{"pool_bench: laps/s, tokens/s and time per hop of a pool of 1..N stages"};
  std::string stages = "1,2,3,4", delays = "0", devices = "cpu";
  app.add_option("-m,--model", o.model, "Model file")->required();
  app.add_option("--stages", stages, "Pool sizes (host included), comma-separated")->capture_default_str();
  app.add_option("--delay-ms", delays, "One-way latency per connection, comma-separated (ms)")->capture_default_str();
  app.add_option("--prompt", o.n_prompt, "Prompt tokens (prefill)")->capture_default_str();
  app.add_option("--gen", o.n_gen, "Decode laps")->capture_default_str();
  app.add_option("-t,--threads", o.threads, "CPU threads per stage")->capture_default_str();
  app.add_option("--hop-dtype", o.hop, "f16 or f32")->capture_default_str();
  app.add_flag("--processes", o.processes, "Workers as `shoal join` processes (no injected latency)");
  app.add_option("--shoal", o.shoal, "The shoal binary for --processes")->capture_default_str();
  app.add_option("--device", devices, "Devices, comma-separated: stage i (the host first) on entry i mod their count")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  shoal::init_logging("warning");
  o.stages = shoal::parse_list<int>(stages);
  o.delays_ms = shoal::parse_list<double>(delays);
  auto listed = shoal::pool::device_list(devices);
  if (!listed.ok()) {
    std::fprintf(stderr, "pool_bench: %s\n", listed.status().to_string().c_str());
    return 1;
  }
  o.devices = *listed;
  if (o.processes && o.delays_ms != std::vector<double>{0}) {
    std::fprintf(stderr, "pool_bench: --processes cannot inject latency (no netem here); use threads\n");
    return 1;
  }
  return shoal::run(o);
}
