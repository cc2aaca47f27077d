// The planner: expected plans are worked out by hand from the cost model in pool/planner.h
// (stage time = bytes / bandwidth, each hop its latency or the default), not read from the code.
#include <gtest/gtest.h>

#include "pool/planner.h"
#include "test_util.h"

namespace shoal::pool {
namespace {

using test::expect_error;

constexpr uint64_t GiB = 1ull << 30;
constexpr double kHop = 0.5e-3;  // PlanOptions::default_hop_s

DeviceFacts dev(std::string name, uint64_t mem, double gbps, bool host = false, double latency = -1) {
  DeviceFacts d;
  d.name = std::move(name);
  d.mem_bytes = mem;
  d.mem_gbps = gbps;
  d.is_host = host;
  d.hop_latency_s = latency;
  return d;
}

PlanInput uniform(std::vector<DeviceFacts> devices, size_t n_layers, uint64_t layer = GiB, uint64_t host_bytes = GiB) {
  return PlanInput{std::move(devices), std::vector<uint64_t>(n_layers, layer), host_bytes};
}

struct Expect {
  size_t device;
  uint32_t first;
  uint32_t n_layers;
};

void expect_stages(const Plan& p, const std::vector<Expect>& want) {
  ASSERT_EQ(p.stages.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(p.stages[i].device, want[i].device);
    EXPECT_EQ(p.stages[i].first, want[i].first);
    EXPECT_EQ(p.stages[i].n_layers, want[i].n_layers);
  }
}

TEST(Planner, OneDeviceHoldsEverything) {
  PlanInput in = uniform({dev("host", 20 * GiB, 100, true)}, 12);
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  expect_stages(*p, {{0, 0, 12}});
  EXPECT_EQ(p->n_hops, 0u);
  EXPECT_EQ(p->stages[0].bytes, 12 * GiB);
  EXPECT_DOUBLE_EQ(p->seconds_per_token, 12.0 * GiB / 100e9);
  EXPECT_DOUBLE_EQ(p->stages[0].share, 1.0);
  EXPECT_TRUE(p->guests.empty());
}

TEST(Planner, HeterogeneousMemoryFillsFastestFirst) {
  // host: 4 layers after its 1 GiB head, 100 GB/s; a: 3 layers at 200 GB/s; b: 20 layers at 50 GB/s.
  PlanInput in = uniform({dev("host", 5 * GiB, 100, true), dev("b", 20 * GiB, 50), dev("a", 3 * GiB, 200)}, 10);
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  // Chain: host, then workers fastest first: a (3 layers, full), b (the 3 left).
  expect_stages(*p, {{0, 0, 4}, {2, 4, 3}, {1, 7, 3}});
  EXPECT_EQ(p->n_hops, 3u);
  const double want = 4.0 * GiB / 100e9 + 3.0 * GiB / 200e9 + 3.0 * GiB / 50e9 + 3 * kHop;
  EXPECT_NEAR(p->seconds_per_token, want, 1e-12);
  EXPECT_NEAR(p->stages[1].share, (3.0 * GiB / 200e9) / want, 1e-12);
  EXPECT_NEAR(p->hop_seconds, 3 * kHop, 1e-15);
}

TEST(Planner, NonUniformLayersPackByBytes) {
  // Layers of 1,1,3,1 GiB; the host holds 2 GiB of layers, the worker 4 GiB.
  PlanInput in{{dev("host", 3 * GiB, 100, true), dev("w", 4 * GiB, 100)}, {GiB, GiB, 3 * GiB, GiB}, GiB};
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  expect_stages(*p, {{0, 0, 2}, {1, 2, 2}});
}

TEST(Planner, TooLittleMemoryIsAClearError) {
  PlanInput in = uniform({dev("host", 3 * GiB, 100, true), dev("w", 4 * GiB, 100)}, 10);
  // Layers need 10 GiB; the pool lends 2 + 4 = 6 GiB for layers.
  expect_error(make_plan(in), Code::kOutOfMemory,
               "the model's 10 layers need 10.0 GiB (and 1.00 GiB on the host for embedding and head); "
               "the pool lends 6.00 GiB for layers ('host' 2.00 GiB after embedding and head, 'w' 4.00 GiB): "
               "4.00 GiB short");
}

TEST(Planner, EnoughInTotalButNotInWholeLayers) {
  PlanInput in = uniform({dev("host", 3 * GiB, 100, true), dev("w1", 2 * GiB, 100), dev("w2", 2 * GiB, 100)}, 2,
                         3 * GiB);
  expect_error(make_plan(in), Code::kOutOfMemory, "not in whole contiguous layers per device");
}

TEST(Planner, LayersLocalIsNamedWhenItLeavesTooLittle) {
  PlanInput in = uniform({dev("host", 20 * GiB, 100, true), dev("tiny", 1024, 100)}, 4);
  PlanOptions o;
  o.layers_local = 0;  // the host lends plenty, but may hold none of it
  expect_error(make_plan(in, o), Code::kOutOfMemory,
               "not in whole contiguous layers per device (--layers-local 0 keeps the host to 0 layers)");
  EXPECT_TRUE(make_plan(in).ok());  // without it the host takes the layers
}

TEST(Planner, HostMustHoldEmbeddingAndHead) {
  PlanInput in = uniform({dev("host", GiB / 2, 100, true), dev("w", 40 * GiB, 100)}, 4);
  expect_error(make_plan(in), Code::kOutOfMemory, "the host 'host' lends 512.0 MiB but needs 1.00 GiB");
}

TEST(Planner, MoreDevicesThanLayers) {
  // The host holds no layer (no room after its head); four workers of one layer each, two layers.
  PlanInput in = uniform({dev("host", GiB, 100, true), dev("w1", GiB, 100), dev("w2", GiB, 100),
                          dev("w3", GiB, 100), dev("w4", GiB, 100)},
                         2);
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  expect_stages(*p, {{0, 0, 0}, {1, 0, 1}, {2, 1, 1}});
  EXPECT_EQ(p->n_hops, 3u);
  ASSERT_EQ(p->guests.size(), 2u);
  EXPECT_EQ(p->guests[0].device, 3u);
  EXPECT_EQ(p->guests[1].device, 4u);
  EXPECT_NE(p->guests[0].reason.find("spare"), std::string::npos);
}

TEST(Planner, DeviceThatCannotHoldALayerIsAGuest) {
  PlanInput in = uniform({dev("host", 8 * GiB, 100, true), dev("tiny", GiB / 4, 1000)}, 4);
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  expect_stages(*p, {{0, 0, 4}});
  ASSERT_EQ(p->guests.size(), 1u);
  EXPECT_EQ(p->guests[0].reason, "too little memory (lends 256.0 MiB, the smallest layer needs 1.00 GiB)");
}

TEST(Planner, FewestHopsAmongEqualDevices) {
  // Everything fits on the host; equally fast workers would only add hops.
  PlanInput in = uniform({dev("host", 20 * GiB, 100, true), dev("w1", 20 * GiB, 100), dev("w2", 20 * GiB, 100)}, 8);
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 8}});
  EXPECT_EQ(p->guests.size(), 2u);
  // The host too small: one worker takes the rest rather than two sharing it.
  in.devices[0].mem_bytes = 3 * GiB;
  p = make_plan(in);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 2}, {1, 2, 6}});
}

TEST(Planner, FasterWorkerWinsOverLocalLayersWhenItPaysForItsHops) {
  // Host 10 GB/s could hold all 4 layers (429 ms); a 1000 GB/s worker costs 2 hops of 0.5 ms.
  PlanInput in = uniform({dev("host", 20 * GiB, 10, true), dev("gpu", 20 * GiB, 1000)}, 4);
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 0}, {1, 0, 4}});
  EXPECT_NEAR(p->seconds_per_token, 4.0 * GiB / 1000e9 + 2 * kHop, 1e-12);
}

TEST(Planner, AWorkerHoldingLayersKeepsThemAgainstOneLessThanATenthFaster) {
  // --layers-local 0: one worker takes all 4 layers. w1 holds them now; w2 came later.
  PlanInput in = uniform({dev("host", 20 * GiB, 100, true), dev("w1", 20 * GiB, 100), dev("w2", 20 * GiB, 105)}, 4);
  in.devices[1].holds_layers = true;
  PlanOptions o;
  o.layers_local = 0;
  auto p = make_plan(in, o);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 0}, {1, 0, 4}});
  EXPECT_NEAR(p->seconds_per_token, 4.0 * GiB / 100e9 + 2 * kHop, 1e-12);  // at w1's own speed
  in.devices[2].mem_gbps = 120;  // 20% faster: worth a new load
  p = make_plan(in, o);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 0}, {2, 0, 4}});
  in.devices[1].holds_layers = false;  // a new pool: the faster one, as before
  in.devices[2].mem_gbps = 105;
  p = make_plan(in, o);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 0}, {2, 0, 4}});
}

TEST(Planner, LatencyAwareChoice) {
  // Two equal workers but one is 50 ms away: the near one gets the layers.
  PlanInput in = uniform({dev("host", 3 * GiB, 100, true), dev("far", 20 * GiB, 100, false, 50e-3),
                          dev("near", 20 * GiB, 100, false, 0.1e-3)},
                         6);
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 2}, {2, 2, 4}});
  EXPECT_NEAR(p->hop_seconds, 2 * 0.1e-3, 1e-15);
  // A far device 1000x faster than the near one is worth its 2 x 50 ms: all 6 layers take 0.6 ms
  // there (+100 ms of hops), against 21 ms on the host plus 429 ms near. The host keeps none.
  in.devices[1].mem_gbps = 10000;
  in.devices[2].mem_gbps = 10;
  p = make_plan(in);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 0}, {1, 0, 6}});
  EXPECT_NEAR(p->seconds_per_token, 6.0 * GiB / 10000e9 + 2 * 50e-3, 1e-12);
}

TEST(Planner, LayersLocal) {
  PlanInput in = uniform({dev("host", 20 * GiB, 1000, true), dev("w", 20 * GiB, 100)}, 8);
  PlanOptions o;
  o.layers_local = 3;
  auto p = make_plan(in, o);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 3}, {1, 3, 5}});
  o.layers_local = 0;
  p = make_plan(in, o);
  ASSERT_TRUE(p.ok());
  expect_stages(*p, {{0, 0, 0}, {1, 0, 8}});
  o.layers_local = 9;
  expect_error(make_plan(in, o), Code::kInvalidArgument, "--layers-local 9 but the model has 8 layers");
  PlanInput alone = uniform({dev("host", 20 * GiB, 1000, true)}, 8);
  o.layers_local = 3;
  expect_error(make_plan(alone, o), Code::kUnavailable, "no worker is in the pool for layers 3-7");
  in.devices[0].mem_bytes = 3 * GiB;
  o.layers_local = 4;
  expect_error(make_plan(in, o), Code::kOutOfMemory, "--layers-local 4 needs 4.00 GiB on the host 'host'");
}

TEST(Planner, ForcedSplitValid) {
  PlanInput in = uniform({dev("host", 20 * GiB, 100, true), dev("w1", 20 * GiB, 100), dev("w2", 20 * GiB, 100),
                          dev("w3", 20 * GiB, 100)},
                         12);
  PlanOptions o;
  o.split = *parse_split("0-3,4-7,8-11");
  auto p = make_plan(in, o);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  expect_stages(*p, {{0, 0, 4}, {1, 4, 4}, {2, 8, 4}});
  ASSERT_EQ(p->guests.size(), 1u);
  EXPECT_EQ(p->guests[0].reason, "no layer range left for it");
  // With --layers-local 0 the ranges go to the workers.
  o.layers_local = 0;
  o.split = *parse_split("0-5,6-11");
  p = make_plan(in, o);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  expect_stages(*p, {{0, 0, 0}, {1, 0, 6}, {2, 6, 6}});
}

TEST(Planner, ForcedSplitInvalid) {
  PlanInput in = uniform({dev("host", 20 * GiB, 100, true), dev("w1", 20 * GiB, 100), dev("w2", 3 * GiB, 100)}, 12);
  struct Case {
    const char* split;
    const char* needle;
  };
  const Case cases[] = {
      {"0-3,5-11", "--split leaves layers 4-4 to nobody"},
      {"1-11", "--split leaves layers 0-0 to nobody"},
      {"0-3,4-7", "--split leaves layers 8-11 to nobody"},
      {"0-4,4-11", "--split range 4-11 overlaps the range before it"},
      {"0-3,8-11,4-7", "--split lists 8-11 before 4-7: the ranges go in layer order"},
      {"4-11,0-3", "--split lists 4-11 before 0-3: the ranges go in layer order"},
      {"0-3,2-5,4-11", "--split range 2-5 overlaps the range before it"},
      {"0-5,2-3,6-11", "--split range 2-3 overlaps the range before it"},
      {"0-3,4-12", "--split range 4-12 is past the last layer 11"},
      {"0-3,7-4,8-11", "--split range 7-4 runs backwards"},
      {"0-1,2-3,4-5,6-11", "--split has 4 ranges but the pool has 3 devices"},
      {"0-3,4-7,8-11", "--split gives 'w2' layers 8-11 (4.00 GiB) but it lends 3.00 GiB"},
      {"0-19,20-20", "past the last layer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.split);
    PlanOptions o;
    o.split = *parse_split(c.split);
    expect_error(make_plan(in, o), Code::kInvalidArgument, c.needle);
  }
  PlanOptions o;
  o.split = *parse_split("0-3,4-11");
  o.layers_local = 5;
  expect_error(make_plan(in, o), Code::kInvalidArgument, "--layers-local 5 disagrees with the host's --split range 0-3");
  PlanOptions alone;  // one device: the count is singular
  alone.split = *parse_split("0-5,6-11");
  expect_error(make_plan(uniform({dev("host", 20 * GiB, 100, true)}, 12), alone), Code::kInvalidArgument,
               "--split has 2 ranges but the pool has 1 device");
  EXPECT_EQ(make_plan(uniform({dev("host", 20 * GiB, 100, true)}, 12), alone).status().message().find("devices"),
            std::string::npos);
}

TEST(Planner, PlanFlagsAreCheckedAgainstTheModelAndTheWorkersToCome) {
  PlanOptions o;
  o.layers_local = 6;
  test::expect_status(check_plan_flags(o, 5), Code::kInvalidArgument, "--layers-local 6 but the model has 5 layers");
  o.layers_local = std::nullopt;
  o.split = *parse_split("0-1,2-3,4-4");
  EXPECT_TRUE(check_plan_flags(o, 5).ok());  // the workers not known: the count is make_plan's
  EXPECT_TRUE(check_plan_flags(o, 5, 2).ok());
  test::expect_status(check_plan_flags(o, 5, 1), Code::kInvalidArgument,
                      "--split has 3 ranges but the pool has 2 devices (the host and 1 worker)");
  test::expect_status(check_plan_flags(o, 5, 0), Code::kInvalidArgument,
                      "--split has 3 ranges but the pool has 1 device (the host alone)");
  o.layers_local = 0;
  test::expect_status(check_plan_flags(o, 5, 2), Code::kInvalidArgument,
                      "--split has 3 ranges but the pool has 2 devices (2 workers besides the host, --layers-local 0)");
  EXPECT_TRUE(check_plan_flags(o, 5, 3).ok());
  o.layers_local = 3;
  test::expect_status(check_plan_flags(o, 5, 2), Code::kInvalidArgument,
                      "--layers-local 3 disagrees with the host's --split range 0-1");
  test::expect_status(check_plan_flags(o, 4, 2), Code::kInvalidArgument, "--split range 4-4 is past the last layer 3");
}

TEST(Planner, ParseSplit) {
  auto r = parse_split("0-3,4,5-11");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[1].first, 4u);
  EXPECT_EQ((*r)[1].last, 4u);
  EXPECT_EQ((*r)[2].last, 11u);
  for (const char* bad : {"", "0-3,", ",0-3", "a-b", "0-", "-3", "0-3-4", "1 - 2", "0-1234567890"}) {
    auto b = parse_split(bad);
    EXPECT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(Planner, MalformedInput) {
  expect_error(make_plan(uniform({dev("w", GiB, 1)}, 2)), Code::kInvalidArgument, "0 devices are marked host");
  expect_error(make_plan(uniform({dev("a", GiB, 1, true), dev("b", GiB, 1, true)}, 2)), Code::kInvalidArgument,
               "2 devices are marked host");
  expect_error(make_plan(uniform({dev("h", GiB, 1, true)}, 0)), Code::kInvalidArgument, "no layers");
  expect_error(make_plan(uniform({}, 2)), Code::kInvalidArgument, "no devices");
  expect_error(make_plan(uniform({dev("h", 9 * GiB, 100, true), dev("slow", GiB, 0)}, 2)), Code::kInvalidArgument,
               "device 'slow' has no usable speed");
  PlanInput zero = uniform({dev("h", 9 * GiB, 100, true)}, 2);
  zero.layer_bytes[1] = 0;
  expect_error(make_plan(zero), Code::kInvalidArgument, "layer 1 has 0 bytes");
}

TEST(Planner, MatmulFigureWhenBandwidthUnknown) {
  // 200 GFLOP/s counts as 100 GB/s (2 FLOP per weight byte).
  PlanInput in = uniform({dev("host", 20 * GiB, 0, true)}, 2);
  in.devices[0].matmul_gflops = 200;
  auto p = make_plan(in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_DOUBLE_EQ(p->seconds_per_token, 2.0 * GiB / 100e9);
}

TEST(Planner, PrintsTheTable) {
  PlanInput in = uniform({dev("host (cpu)", 5 * GiB, 100, true), dev("box2 (cuda)", 30 * GiB, 1000),
                          dev("pi (cpu)", GiB / 8, 5)},
                         10);
  PlanOptions o;
  o.layers_local = 2;
  auto p = make_plan(in, o);
  ASSERT_TRUE(p.ok());
  const std::string s = p->to_string(in);
  EXPECT_NE(s.find("plan: 2 stages, 2 hops"), std::string::npos) << s;
  EXPECT_NE(s.find("host (cpu)"), std::string::npos) << s;
  EXPECT_NE(s.find("0-1"), std::string::npos) << s;
  EXPECT_NE(s.find("2-9"), std::string::npos) << s;
  EXPECT_NE(s.find("1000 GB/s"), std::string::npos) << s;
  EXPECT_NE(s.find("2 x 0.50 ms"), std::string::npos) << s;
  EXPECT_NE(s.find("guest  pi (cpu): too little memory"), std::string::npos) << s;
}

TEST(Planner, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(300ull << 20), "300.0 MiB");
  EXPECT_EQ(format_bytes(12ull << 30), "12.0 GiB");
}

}  // namespace
}  // namespace shoal::pool
