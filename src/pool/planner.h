// The planner deals contiguous layer ranges to the devices of a pool (DESIGN.md "Roles").
// Chain: host -> w1 -> ... -> wN -> host. The host always is stage 0: it embeds, runs its own
// layers (possibly none) first, and gets the last hidden state back for the LM head.
//
// Cost model (decode is bound by memory bandwidth): a stage holding B bytes of layers takes
// B / bandwidth seconds per token (B x 2 / GFLOP/s when only the matmul figure is known), and each
// hop takes its link latency (PlanOptions::default_hop_s when unknown). The hop into a worker and,
// for the last worker, the hop back to the host take that worker's latency. The planner chooses,
// over chains ordered host first then workers fastest first, the layer counts that minimise the
// time per token (an exact dynamic program over devices x layers); among equal times it takes the
// fewest hops. So the fastest devices fill first, and a slower or farther device joins only when
// the model does not fit without it or it pays for its hop. Devices left out are guests: those
// that cannot hold one layer, and spares the plan is faster without.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.h"
#include "core/status.h"

namespace shoal::pool {

/// What the planner knows about one device (from its hello, or measured by the host).
struct DeviceFacts {
  std::string name;            // "host (cpu)", "box2 (cuda)"
  uint64_t mem_bytes = 0;      // memory lent to the pool
  double mem_gbps = 0;         // measured read bandwidth, GB/s; 0 = unknown
  double matmul_gflops = 0;    // measured matmul speed, GFLOP/s; used when mem_gbps is 0
  double hop_latency_s = -1;   // one-way time of a hop to this device (~ half the ping RTT); < 0 = unknown
  bool is_host = false;        // exactly one device is the host
  bool holds_layers = false;   // a worker with layers in the current plan: kept unless one is >10% faster
};

/// Inclusive layer range [first, last].
struct LayerRange {
  uint32_t first = 0;
  uint32_t last = 0;
};

struct PlanInput {
  std::vector<DeviceFacts> devices;
  std::vector<uint64_t> layer_bytes;  // per layer: weights + KV cache at the chosen context, bytes
  uint64_t host_bytes = 0;            // held by the host besides layers: embedding, LM head, norm
};

struct PlanOptions {
  std::optional<uint32_t> layers_local;  // --layers-local N (exactly N layers on the host); nullopt = auto
  std::vector<LayerRange> split;         // --split: ranges for host then workers in input order
                                         // (workers only when layers_local == 0); empty = choose
  double default_hop_s = 0.5e-3;         // hop time assumed when a latency is unknown
};

/// One stage of the chain: a device and its layers.
struct Stage {
  size_t device = 0;       // index into PlanInput::devices
  uint32_t first = 0;      // first layer
  uint32_t n_layers = 0;   // 0 only for a host that holds no layers
  uint64_t bytes = 0;      // layer bytes on this device
  double seconds = 0;      // expected compute time per token
  double share = 0;        // seconds / plan's seconds_per_token
  uint32_t last() const { return first + n_layers - 1; }
};

/// A device outside the chain and why.
struct Guest {
  size_t device = 0;
  std::string reason;
};

struct Plan {
  std::vector<Stage> stages;  // chain order; stages[0] is the host
  std::vector<Guest> guests;
  size_t n_hops = 0;          // workers + 1 when there are workers, else 0
  double hop_seconds = 0;     // all hops of one lap
  double seconds_per_token = 0;
  /// The plan as a table: stage, device, layers, bytes, lent, speed, share of time; then hops,
  /// guests and the expected time per token.
  std::string to_string(const PlanInput& in) const;
};

/// Deals the layers. kInvalidArgument for malformed input (no host, two hosts, no layers, a
/// device without speed figures) or a bad forced split (ranges that leave a gap, overlap, run
/// past the last layer, outnumber the devices, or give a device more than it lends);
/// kOutOfMemory when the pool cannot hold the model, with the bytes needed and lent per device.
Result<Plan> make_plan(const PlanInput& in, const PlanOptions& opts = {});

/// Checks a forced split's shape against the model: ranges in order that run forwards, neither
/// overlap nor leave a gap, and cover layers 0 .. n_layers - 1. kInvalidArgument naming the range.
/// (make_plan checks this too; a host checks it before it waits for workers.)
Status check_split(const std::vector<LayerRange>& ranges, uint32_t n_layers);

/// Checks --layers-local and --split against the model and, when given, the workers the pool
/// will have (the host counts as a device unless --layers-local 0): layers_local <= n_layers, a
/// split that check_split takes, no more ranges than devices, and a host range of layers_local
/// layers. kInvalidArgument naming the flag. (make_plan checks this too; a host checks it when it
/// opens, before any worker joins.)
Status check_plan_flags(const PlanOptions& opts, uint32_t n_layers, std::optional<size_t> n_workers = std::nullopt);

/// Parses "--split 0-3,4-7,8-11" ("5" alone is 5-5). kInvalidArgument naming the bad item.
Result<std::vector<LayerRange>> parse_split(std::string_view text);

using shoal::format_bytes;  // core/log.h

}  // namespace shoal::pool
