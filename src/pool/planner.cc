#include "pool/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "pool/messages.h"

namespace shoal::pool {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Time and hops of a partial plan; lower time wins, then fewer hops.
struct Cost {
  double s = kInf;
  uint32_t hops = 0;
};
bool better(const Cost& a, const Cost& b) {
  if (std::isinf(b.s)) return !std::isinf(a.s);
  const double tol = 1e-9 * std::max(std::abs(a.s), std::abs(b.s));
  if (a.s < b.s - tol) return true;
  if (a.s > b.s + tol) return false;
  return a.hops < b.hops;
}

double bytes_per_second(const DeviceFacts& d) {
  return d.mem_gbps > 0 ? d.mem_gbps * 1e9 : d.matmul_gflops * 1e9 / 2.0;  // ~2 FLOP per weight byte
}
// The speed a plan is chosen by: a worker that holds layers now counts kKeepBonus faster, so that a
// newcomer within the speed probe's noise does not take its layers (a load and a replay of the
// cached tokens for no gain). The plan's printed times use bytes_per_second.
constexpr double kKeepBonus = 1.1;
double planning_bps(const DeviceFacts& d) { return bytes_per_second(d) * (d.holds_layers ? kKeepBonus : 1.0); }
double hop_seconds(const DeviceFacts& d, const PlanOptions& o) {
  return d.hop_latency_s >= 0 ? d.hop_latency_s : o.default_hop_s;
}

// Everything make_plan needs, checked.
struct Prepared {
  size_t host = 0;
  std::vector<size_t> workers;   // input order
  std::vector<uint64_t> prefix;  // prefix[l] = bytes of layers [0, l)
  std::vector<uint64_t> cap;     // per device: bytes it can hold for layers
  uint64_t min_layer = 0;
  uint32_t n_layers() const { return static_cast<uint32_t>(prefix.size() - 1); }
  uint64_t bytes(uint32_t first, uint32_t count) const { return prefix[first + count] - prefix[first]; }
};

Result<Prepared> prepare(const PlanInput& in, const PlanOptions& opts) {
  Prepared p;
  if (in.devices.empty()) return make_error(Code::kInvalidArgument, "plan: no devices");
  if (in.layer_bytes.empty()) return make_error(Code::kInvalidArgument, "plan: the model has no layers");
  if (in.layer_bytes.size() > kMaxLayers) {
    return make_error(Code::kInvalidArgument, "plan: {} layers, limit {}", in.layer_bytes.size(), kMaxLayers);
  }
  if (!std::isfinite(opts.default_hop_s) || opts.default_hop_s < 0) {
    return make_error(Code::kInvalidArgument, "plan: default hop time {} s", opts.default_hop_s);
  }
  size_t n_hosts = 0;
  for (size_t i = 0; i < in.devices.size(); ++i) {
    const DeviceFacts& d = in.devices[i];
    if (d.is_host) {
      p.host = i;
      ++n_hosts;
    } else {
      p.workers.push_back(i);
    }
    const bool speed_ok = std::isfinite(d.mem_gbps) && std::isfinite(d.matmul_gflops) && d.mem_gbps >= 0 &&
                          d.matmul_gflops >= 0 && bytes_per_second(d) > 0;
    if (!speed_ok) {
      return make_error(Code::kInvalidArgument, "plan: device '{}' has no usable speed ({} GB/s, {} GFLOP/s)",
                        d.name, d.mem_gbps, d.matmul_gflops);
    }
    if (!std::isfinite(d.hop_latency_s)) {
      return make_error(Code::kInvalidArgument, "plan: device '{}' has latency {}", d.name, d.hop_latency_s);
    }
  }
  if (n_hosts != 1) return make_error(Code::kInvalidArgument, "plan: {} devices are marked host, expected 1", n_hosts);
  p.prefix.assign(1, 0);
  p.min_layer = std::numeric_limits<uint64_t>::max();
  for (size_t l = 0; l < in.layer_bytes.size(); ++l) {
    const uint64_t b = in.layer_bytes[l];
    if (b == 0) return make_error(Code::kInvalidArgument, "plan: layer {} has 0 bytes", l);
    if (p.prefix.back() > std::numeric_limits<uint64_t>::max() - b) {
      return make_error(Code::kInvalidArgument, "plan: layer sizes overflow 64 bits");
    }
    p.prefix.push_back(p.prefix.back() + b);
    p.min_layer = std::min(p.min_layer, b);
  }
  const DeviceFacts& h = in.devices[p.host];
  if (h.mem_bytes < in.host_bytes) {
    return make_error(Code::kOutOfMemory,
                      "plan: the host '{}' lends {} but needs {} for the embedding, LM head and output norm",
                      h.name, format_bytes(h.mem_bytes), format_bytes(in.host_bytes));
  }
  for (size_t i = 0; i < in.devices.size(); ++i) {
    p.cap.push_back(i == p.host ? in.devices[i].mem_bytes - in.host_bytes : in.devices[i].mem_bytes);
  }
  return p;
}

// "host 'h' 2.0 GiB after embedding and head, 'box2' 4.0 GiB, ..."
std::string lent_list(const PlanInput& in, const Prepared& p) {
  std::string s = fmt::format("'{}' {} after embedding and head", in.devices[p.host].name, format_bytes(p.cap[p.host]));
  for (size_t w : p.workers) s += fmt::format(", '{}' {}", in.devices[w].name, format_bytes(p.cap[w]));
  return s;
}

Status not_enough_memory(const PlanInput& in, const PlanOptions& opts, const Prepared& p) {
  // --layers-local limits the host whatever it lends: say so, or its share looks unused.
  const std::string local = opts.layers_local ? fmt::format(" (--layers-local {} keeps the host to {} layer{})",
                                                            *opts.layers_local, *opts.layers_local,
                                                            *opts.layers_local == 1 ? "" : "s")
                                              : "";
  uint64_t lent = 0;
  for (uint64_t c : p.cap) lent = c > std::numeric_limits<uint64_t>::max() - lent ? lent : lent + c;
  const uint64_t need = p.prefix.back();
  if (lent < need) {
    return make_error(Code::kOutOfMemory,
                      "plan: the model's {} layers need {} (and {} on the host for embedding and head); "
                      "the pool lends {} for layers ({}): {} short{}",
                      p.n_layers(), format_bytes(need), format_bytes(in.host_bytes), format_bytes(lent),
                      lent_list(in, p), format_bytes(need - lent), local);
  }
  return make_error(Code::kOutOfMemory,
                    "plan: the pool lends {} for layers ({}), enough for the {} layers' {} in total but not "
                    "in whole contiguous layers per device{}",
                    format_bytes(lent), lent_list(in, p), p.n_layers(), format_bytes(need), local);
}

// Fills stages, times, hops and guests from per-device layer counts along `chain`.
Plan build_plan(const PlanInput& in, const PlanOptions& opts, const Prepared& p, const std::vector<size_t>& chain,
                const std::vector<uint32_t>& counts, std::string_view spare_reason) {
  Plan plan;
  uint32_t next = 0;
  double compute = 0;
  for (size_t i = 0; i < chain.size(); ++i) {
    if (i > 0 && counts[i] == 0) continue;
    Stage s;
    s.device = chain[i];
    s.first = next;
    s.n_layers = counts[i];
    s.bytes = p.bytes(next, counts[i]);
    s.seconds = double(s.bytes) / bytes_per_second(in.devices[s.device]);
    next += counts[i];
    compute += s.seconds;
    plan.stages.push_back(s);
  }
  for (size_t i = 1; i < plan.stages.size(); ++i) plan.hop_seconds += hop_seconds(in.devices[plan.stages[i].device], opts);
  if (plan.stages.size() > 1) {
    plan.n_hops = plan.stages.size();
    plan.hop_seconds += hop_seconds(in.devices[plan.stages.back().device], opts);
  }
  plan.seconds_per_token = compute + plan.hop_seconds;
  for (Stage& s : plan.stages) s.share = plan.seconds_per_token > 0 ? s.seconds / plan.seconds_per_token : 0;
  for (size_t w : p.workers) {
    const bool used = std::any_of(plan.stages.begin(), plan.stages.end(), [&](const Stage& s) { return s.device == w; });
    if (used) continue;
    if (p.cap[w] < p.min_layer) {
      plan.guests.push_back({w, fmt::format("too little memory (lends {}, the smallest layer needs {})",
                                            format_bytes(p.cap[w]), format_bytes(p.min_layer))});
    } else {
      plan.guests.push_back({w, std::string(spare_reason)});
    }
  }
  return plan;
}

Result<Plan> plan_forced(const PlanInput& in, const PlanOptions& opts, const Prepared& p) {
  const bool host_holds = !(opts.layers_local && *opts.layers_local == 0);
  std::vector<size_t> slots;
  if (host_holds) slots.push_back(p.host);
  slots.insert(slots.end(), p.workers.begin(), p.workers.end());
  const auto& r = opts.split;
  SHOAL_RETURN_IF_ERROR(check_plan_flags(opts, p.n_layers(), p.workers.size()));
  std::vector<size_t> chain{p.host};
  std::vector<uint32_t> counts{0};
  for (size_t i = 0; i < r.size(); ++i) {
    const size_t d = slots[i];
    const uint32_t n = r[i].last - r[i].first + 1;
    const uint64_t b = p.bytes(r[i].first, n);
    if (b > p.cap[d]) {
      return make_error(Code::kInvalidArgument, "--split gives '{}' layers {}-{} ({}) but it lends {}{}",
                        in.devices[d].name, r[i].first, r[i].last, format_bytes(b), format_bytes(p.cap[d]),
                        d == p.host ? " after embedding and head" : "");
    }
    if (d == p.host) {
      counts[0] = n;
    } else {
      chain.push_back(d);
      counts.push_back(n);
    }
  }
  return build_plan(in, opts, p, chain, counts, "no layer range left for it");
}

Result<Plan> plan_auto(const PlanInput& in, const PlanOptions& opts, const Prepared& p) {
  const uint32_t L = p.n_layers();
  std::vector<size_t> chain{p.host};
  std::vector<size_t> by_speed = p.workers;
  std::stable_sort(by_speed.begin(), by_speed.end(), [&](size_t a, size_t b) {
    return planning_bps(in.devices[a]) > planning_bps(in.devices[b]);
  });
  chain.insert(chain.end(), by_speed.begin(), by_speed.end());
  if (opts.layers_local) {
    const uint32_t n = *opts.layers_local;
    SHOAL_RETURN_IF_ERROR(check_plan_flags(opts, L));
    if (p.bytes(0, n) > p.cap[p.host]) {
      return make_error(Code::kOutOfMemory, "--layers-local {} needs {} on the host '{}', which lends {} after embedding and head",
                        n, format_bytes(p.bytes(0, n)), in.devices[p.host].name, format_bytes(p.cap[p.host]));
    }
  }
  // f[i][l]: best cost of placing layers [0, l) on chain[0..i]; take[i][l]: layers chain[i] holds.
  // Row 0 is the host, whose layers come first; a worker may hold nothing (it is left out).
  const size_t k = chain.size();
  std::vector<std::vector<Cost>> f(k, std::vector<Cost>(L + 1));
  std::vector<std::vector<uint32_t>> take(k, std::vector<uint32_t>(L + 1, 0));
  const double host_bps = bytes_per_second(in.devices[p.host]);
  for (uint32_t l = 0; l <= L; ++l) {
    if (opts.layers_local && l != *opts.layers_local) continue;
    if (p.bytes(0, l) > p.cap[p.host]) break;
    f[0][l] = Cost{double(p.bytes(0, l)) / host_bps, 0};
    take[0][l] = l;
  }
  for (size_t i = 1; i < k; ++i) {
    const DeviceFacts& d = in.devices[chain[i]];
    const double bps = planning_bps(d);
    const double hop = hop_seconds(d, opts);
    for (uint32_t l = 0; l <= L; ++l) {
      Cost best = f[i - 1][l];  // this worker holds nothing
      uint32_t best_n = 0;
      for (uint32_t n = 1; n <= l; ++n) {
        const uint64_t b = p.bytes(l - n, n);
        if (b > p.cap[chain[i]]) break;  // longer ranges only grow
        const Cost& before = f[i - 1][l - n];
        if (std::isinf(before.s)) continue;
        Cost c{before.s + double(b) / bps + hop, before.hops + 1};
        if (l == L) c.s += hop, c.hops += 1;  // the last worker also pays the way back to the host
        if (better(c, best)) best = c, best_n = n;
      }
      f[i][l] = best;
      take[i][l] = best_n;
    }
  }
  if (std::isinf(f[k - 1][L].s)) {
    if (opts.layers_local && *opts.layers_local < L && p.workers.empty()) {
      return make_error(Code::kUnavailable,
                        "plan: the host holds {} layer{} (--layers-local) and no worker is in the pool for layers {}-{}; "
                        "start a worker with `shoal join`",
                        *opts.layers_local, *opts.layers_local == 1 ? "" : "s", *opts.layers_local, L - 1);
    }
    return not_enough_memory(in, opts, p);
  }
  std::vector<uint32_t> counts(k, 0);
  uint32_t l = L;
  for (size_t i = k; i-- > 0;) {
    counts[i] = take[i][l];
    l -= counts[i];
  }
  return build_plan(in, opts, p, chain, counts, "spare (the plan is faster without another hop)");
}

}  // namespace

Status check_plan_flags(const PlanOptions& opts, uint32_t n_layers, std::optional<size_t> n_workers) {
  if (opts.layers_local && *opts.layers_local > n_layers) {
    return make_error(Code::kInvalidArgument, "--layers-local {} but the model has {} layers", *opts.layers_local,
                      n_layers);
  }
  const auto& r = opts.split;
  if (r.empty()) return Status::Ok();
  const bool host_holds = !(opts.layers_local && *opts.layers_local == 0);
  if (n_workers) {
    const size_t devices = *n_workers + (host_holds ? 1 : 0);
    if (r.size() > devices) {
      const std::string workers = fmt::format("{} worker{}", *n_workers, *n_workers == 1 ? "" : "s");
      return make_error(Code::kInvalidArgument, "--split has {} ranges but the pool has {} device{} ({})", r.size(),
                        devices, devices == 1 ? "" : "s",
                        !host_holds ? workers + " besides the host, --layers-local 0"
                                    : *n_workers == 0 ? std::string("the host alone") : "the host and " + workers);
    }
  }
  SHOAL_RETURN_IF_ERROR(check_split(r, n_layers));
  if (opts.layers_local && host_holds && r[0].last + 1 != *opts.layers_local) {
    return make_error(Code::kInvalidArgument, "--layers-local {} disagrees with the host's --split range {}-{}",
                      *opts.layers_local, r[0].first, r[0].last);
  }
  return Status::Ok();
}

Status check_split(const std::vector<LayerRange>& r, uint32_t L) {
  if (r.empty()) return make_error(Code::kInvalidArgument, "--split has no ranges");
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i].first > r[i].last) {
      return make_error(Code::kInvalidArgument, "--split range {}-{} runs backwards", r[i].first, r[i].last);
    }
    if (r[i].last >= L) {
      return make_error(Code::kInvalidArgument, "--split range {}-{} is past the last layer {}", r[i].first,
                        r[i].last, L - 1);
    }
    const uint32_t want = i == 0 ? 0 : r[i - 1].last + 1;
    // A gap that a later range starts to fill: the ranges are listed out of order.
    for (size_t j = i + 1; j < r.size() && r[i].first > want; ++j) {
      if (r[j].first == want) {
        return make_error(Code::kInvalidArgument,
                          "--split lists {}-{} before {}-{}: the ranges go in layer order (the host's first)",
                          r[i].first, r[i].last, r[j].first, r[j].last);
      }
    }
    if (r[i].first < want) {
      return make_error(Code::kInvalidArgument, "--split range {}-{} overlaps the range before it", r[i].first, r[i].last);
    }
    if (r[i].first > want) {
      return make_error(Code::kInvalidArgument, "--split leaves layers {}-{} to nobody", want, r[i].first - 1);
    }
  }
  if (r.back().last != L - 1) {
    return make_error(Code::kInvalidArgument, "--split leaves layers {}-{} to nobody", r.back().last + 1, L - 1);
  }
  return Status();
}

Result<Plan> make_plan(const PlanInput& in, const PlanOptions& opts) {
  SHOAL_ASSIGN_OR_RETURN(Prepared p, prepare(in, opts));
  if (!opts.split.empty()) return plan_forced(in, opts, p);
  return plan_auto(in, opts, p);
}

Result<std::vector<LayerRange>> parse_split(std::string_view text) {
  std::vector<LayerRange> out;
  auto number = [](std::string_view s, uint32_t& v) {
    if (s.empty() || s.size() > 9) return false;
    v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + uint32_t(c - '0');
    }
    return true;
  };
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const size_t dash = item.find('-');
    LayerRange r;
    const bool ok = dash == std::string_view::npos
                        ? number(item, r.first) && ((r.last = r.first), true)
                        : number(item.substr(0, dash), r.first) && number(item.substr(dash + 1), r.last);
    if (!ok) {
      return make_error(Code::kInvalidArgument, "--split '{}': item '{}' is not FIRST-LAST or LAYER", text, item);
    }
    out.push_back(r);
    start = comma + 1;
  }
  return out;
}

std::string Plan::to_string(const PlanInput& in) const {
  std::string s = fmt::format("plan: {} stage{}, {} hop{}, about {:.2f} ms per token (decode, full context)\n",
                              stages.size(), stages.size() == 1 ? "" : "s", n_hops, n_hops == 1 ? "" : "s",
                              seconds_per_token * 1e3);
  s += fmt::format("  {:<6} {:<24} {:>11} {:>11} {:>11} {:>12} {:>6}\n", "stage", "device", "layers", "bytes",
                   "lends", "speed", "share");
  for (size_t i = 0; i < stages.size(); ++i) {
    const Stage& st = stages[i];
    const DeviceFacts& d = in.devices[st.device];
    const std::string layers = st.n_layers == 0 ? "-" : fmt::format("{}-{}", st.first, st.last());
    const int digits = (d.mem_gbps > 0 ? d.mem_gbps : d.matmul_gflops) < 10 ? 1 : 0;
    const std::string speed = d.mem_gbps > 0 ? fmt::format("{:.{}f} GB/s", d.mem_gbps, digits)
                                             : fmt::format("{:.{}f} GFLOP/s", d.matmul_gflops, digits);
    s += fmt::format("  {:<6} {:<24} {:>11} {:>11} {:>11} {:>12} {:>5.1f}%\n", i, d.name, layers,
                     format_bytes(st.bytes), format_bytes(d.mem_bytes), speed, st.share * 100);
  }
  if (n_hops > 0) {
    s += fmt::format("  {:<6} {:<24} {:>11} {:>11} {:>11} {:>12} {:>5.1f}%\n", "hops",
                     fmt::format("{} x {:.2f} ms", n_hops, hop_seconds / double(n_hops) * 1e3), "", "", "", "",
                     hop_seconds / seconds_per_token * 100);
  }
  for (const Guest& g : guests) s += fmt::format("  guest  {}: {}\n", in.devices[g.device].name, g.reason);
  return s;
}

}  // namespace shoal::pool
