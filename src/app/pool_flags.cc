#include "app/pool_flags.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/log.h"
#include "pool/address.h"
#include "pool/transport_tcp.h"

namespace shoal::app {

namespace {
constexpr pool::Millis kLocalJoinTimeout{120000};  // local workers load nothing before they join
}  // namespace

void add_pool_flags(CLI::App* cmd, PoolFlags& f, bool local_pool) {
  if (local_pool) {
    cmd->add_option("--pool", f.pool, "Run as a pool of N local processes: the host and N-1 workers on loopback")
        ->capture_default_str()
        ->transform(int_range(1, 64));
  }
  cmd->add_option("--hop-dtype", f.hop_dtype, "Hidden states between stages: f16 (half the bytes) or f32 (exact)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "f32"}))
      ->each([&f](const std::string&) { f.hop_dtype_set = true; });
  cmd->add_option("--dead-after", f.dead_after_ms,
                  local_pool ? "A peer silent this long (ms) counts as dead; unless set, a local pool of more than "
                               "two processes per core waits longer: 2000 x ceil(processes / (2 x cores))"
                             : "A peer silent this long (ms) counts as dead")
      ->capture_default_str()
      ->transform(int_range(100, 3600000))
      ->each([&f](const std::string&) { f.dead_after_set = true; });
  // Both are checked as they are parsed (a usage error); what they ask of the model, when the host opens.
  cmd->add_option("--layers-local", f.layers_local, "Layers the host holds itself: N, or auto (the planner chooses)")
      ->capture_default_str()
      ->check([](const std::string& text) {
        if (text == "auto") return std::string();
        const auto n = parse_layers_local(text);
        return n.ok() ? std::string() : n.status().message();
      });
  cmd->add_option("--split", f.split, "Force the plan: layer ranges for the host, then the workers (0-3,4-7,8-11)")
      ->check([](const std::string& text) {
        // In order, forwards, without overlaps or gaps, whatever the model (its layer count is not known yet).
        auto r = pool::parse_split(text);
        Status st = r.status();
        if (r.ok()) {
          uint32_t end = 0;
          for (const pool::LayerRange& x : *r) end = std::max(end, x.last + 1);
          st = pool::check_split(*r, end);
        }
        std::string m = st.ok() ? std::string() : st.message();
        if (m.starts_with("--split ")) m.erase(0, 8);  // (CLI11 names the option)
        return m;
      });
}

Result<uint32_t> parse_layers_local(const std::string& text) {
  char* end = nullptr;
  const long n = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != 0 || n < 0 || n > 65536) {
    return make_error(Code::kInvalidArgument, "'{}' is not a layer count (0 to 65536) or auto", text);
  }
  return uint32_t(n);
}

CLI::Validator address_check(bool allow_port_zero) {
  return CLI::Validator(
      [allow_port_zero](std::string& text) -> std::string {
        auto a = pool::parse_address(text, allow_port_zero);
        return a.ok() ? std::string() : a.status().message();
      },
      "HOST:PORT");
}

namespace {

// --layers-local and --split into o.layers_local and o.split. kInvalidArgument naming the flag.
Status parse_plan_flags(const PoolFlags& p, pool::HostOptions& o) {
  if (p.layers_local != "auto") {
    auto n = parse_layers_local(p.layers_local);
    if (!n.ok()) return n.status().with_context("--layers-local");
    o.layers_local = *n;
  }
  if (!p.split.empty()) {
    SHOAL_ASSIGN_OR_RETURN(o.split, pool::parse_split(p.split));
  }
  return Status::Ok();
}

}  // namespace

Result<pool::HostOptions> host_options(const ModelFlags& m, const PoolFlags& p) {
  SHOAL_ASSIGN_OR_RETURN(LocalModelOptions lo, local_options(m));
  pool::HostOptions o;
  o.model = m.model;
  o.device = lo.device;
  o.threads = lo.threads;
  o.n_ctx = lo.n_ctx;
  o.kv_dtype = lo.kv_dtype;
  o.max_tokens = lo.max_tokens;
  o.half_prefill = lo.half_prefill;
  o.warm_up = lo.warm_up;
  o.hop_dtype = p.hop_dtype == "f32" ? pool::HopDType::kF32 : pool::HopDType::kF16;
  o.hops.dead_after = pool::Millis(p.dead_after_ms);
  o.hops.ping_interval = pool::Millis(std::max(50, p.dead_after_ms / 4));
  SHOAL_RETURN_IF_ERROR(parse_plan_flags(p, o));
  return o;
}

Status check_pool_flags_alone(const PoolFlags& p) {
  pool::HostOptions o;
  SHOAL_RETURN_IF_ERROR(parse_plan_flags(p, o));
  std::vector<std::string> given;  // the pool's flags, which one process has no use for
  if (o.layers_local) given.push_back("--layers-local");
  if (!o.split.empty()) given.push_back("--split");
  if (p.hop_dtype_set) given.push_back("--hop-dtype");
  if (p.dead_after_set) given.push_back("--dead-after");
  if (!given.empty()) {
    spdlog::warn("{} {} a pool of several processes; without --pool N (N > 1) {} ignored", fmt::join(given, ", "),
                 given.size() == 1 ? "shapes" : "shape", given.size() == 1 ? "it is" : "they are");
  }
  return Status::Ok();
}

Result<PoolFlags> local_pool_flags(const ModelFlags& m, const PoolFlags& p) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> devices, pool::device_list(m.device));
  const int listed = int(devices.size());
  if (listed > 64) return make_error(Code::kInvalidArgument, "--device lists {} devices (at most 64)", listed);
  if (p.pool > 1 && listed > p.pool)
    return make_error(Code::kInvalidArgument,
                      "--device lists {} devices but --pool {} starts {} processes: a device would hold nothing "
                      "(leave --pool out for one process per device)",
                      listed, p.pool, p.pool);
  PoolFlags out = p;
  if (p.pool == 1) out.pool = listed;
  return out;
}

Result<std::string> room_secret(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("SHOAL_SECRET");
  if (env && *env) return std::string(env);
  return make_error(Code::kInvalidArgument, "no room secret: pass --secret or set SHOAL_SECRET");
}

Result<uint64_t> parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  uint64_t unit = 1;
  std::string rest = end ? std::string(end) : "";
  if (!rest.empty() && (rest.back() == 'B' || rest.back() == 'b')) rest.pop_back();
  if (rest == "K" || rest == "k") unit = 1ull << 10;
  else if (rest == "M" || rest == "m") unit = 1ull << 20;
  else if (rest == "G" || rest == "g") unit = 1ull << 30;
  else if (rest == "T" || rest == "t") unit = 1ull << 40;
  else if (!rest.empty()) unit = 0;
  if (text.empty() || end == text.c_str() || unit == 0 || !(v >= 0) || v * double(unit) > 1.8e19) {
    return make_error(Code::kInvalidArgument, "'{}' is not a byte count (e.g. 8G, 512M, 1073741824)", text);
  }
  return uint64_t(v * double(unit));
}

Result<std::unique_ptr<LocalPool>> start_local_pool(const ModelFlags& m, const PoolFlags& p, bool tokenizer,
                                                    const std::function<Status(pool::Host&)>& before_workers) {
  SHOAL_ASSIGN_OR_RETURN(const std::vector<std::string> devices, pool::device_list(m.device));
  const std::vector<pool::LocalPlacement> at = pool::local_placements(devices, size_t(std::max(1, p.pool)));
  ModelFlags host_flags = m;
  host_flags.device = at[0].device;
  PoolFlags pf = p;
  // Processes that share few cores answer heartbeats late while they load: more than twice as
  // many as cores get 2 s of silence per such multiple (64 on 2 cores: 32 s), unless set.
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  if (!p.dead_after_set && p.pool > 2 * cores)
    pf.dead_after_ms = std::min(3600000, p.dead_after_ms * ((p.pool + 2 * cores - 1) / (2 * cores)));
  SHOAL_ASSIGN_OR_RETURN(pool::HostOptions o, host_options(host_flags, pf));
  o.max_pending = size_t(p.pool) + 32;  // (the local workers join at once: none is refused)
  const int threads = m.threads > 0 ? m.threads : std::max(1, cores / p.pool);
  o.threads = threads;
  o.tokenizer = tokenizer;
  o.listen = "127.0.0.1:0";
  o.secret = pool::random_secret();
  o.spread = true;
  o.workers = at.size() - 1;
  o.mem_share = at[0].mem_share;  // the processes on the host's device share its memory
  auto lp = std::make_unique<LocalPool>();
  SHOAL_ASSIGN_OR_RETURN(lp->host, pool::Host::open(o, pool::tcp_network()));
  if (before_workers) SHOAL_RETURN_IF_ERROR(before_workers(*lp->host));
  pool::LocalWorkerOptions w;
  w.host = lp->host->address();
  w.secret = o.secret;
  w.model = m.model;
  w.workers.assign(at.begin() + 1, at.end());
  w.threads = threads;
  w.half_prefill = o.half_prefill;
  w.warm_up = o.warm_up;
  const auto level = spdlog::level::to_string_view(spdlog::get_level());
  w.log_level = std::string(level.data(), level.size());
  w.dead_after_ms = pf.dead_after_ms;
  SHOAL_ASSIGN_OR_RETURN(lp->workers, pool::LocalWorkers::spawn(w));
  // A worker that does not join (a process frozen, a machine that swaps) is said every 10 s.
  const auto start = std::chrono::steady_clock::now();
  auto next_note = start + std::chrono::seconds(10);
  auto alive = [&] {
    if (std::chrono::steady_clock::now() >= next_note) {
      next_note += std::chrono::seconds(10);
      spdlog::info("waiting for the local workers to join: {} of {} so far ({:.0f} s; at most {} s)",
                   lp->host->n_workers(), w.workers.size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                   kLocalJoinTimeout.count() / 1000);
    }
    return lp->workers->check();
  };
  SHOAL_RETURN_IF_ERROR(lp->host->wait_for_workers(w.workers.size(), kLocalJoinTimeout, alive));
  SHOAL_RETURN_IF_ERROR(lp->host->ensure_plan());
  return lp;
}

}  // namespace shoal::app
