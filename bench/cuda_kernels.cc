// cuda_kernels: the CUDA backend's kernels against the device's ceilings, measured first on the
// same device: a pure read kernel and a device-to-device copy (GB/s), and a cuBLAS bf16 GEMM
// (TFLOP/s). Then GEMV GB/s per weight dtype for Llama-3-8B matrices, decode attention at
// several context lengths, prefill GEMM TFLOP/s (n = 512), and whole decode steps (every op of
// a Llama-3-8B / Qwen3-0.6B layer stack, weights filled randomly on the device, one CUDA graph
// per step) in tokens/s. Every figure is the median of CUDA-event timings of graph replays.
// --tensor: the tensor cores' rates at the quantized prefill GEMM's widths (wgmma by MMA columns
// and warpgroups per SM, with its waits and promotions) and of mma.sync. --gemm-items: the
// quantized prefill GEMM by work item width and token count.
//
//   cuda_kernels [--device 0] [--reps 20] [--quick] [--prefill] [--sweep] [--gemv] [--attention]
//                [--prefill-attention] [--sampling] [--tensor] [--gemm-items] [--only llama-q4_0]
//                [--position 576 [640 ...]]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/sampling_math.h"
#include "core/log.h"

#ifdef SHOAL_HAVE_CUDA
#include "backend/cuda/cuda_probe.h"

namespace shoal {
namespace {

namespace probe = cuda_probe;

void die(const Status& s) {
  std::fprintf(stderr, "cuda_kernels: %s\n", s.to_string().c_str());
  std::exit(1);
}
template <typename T>
T must(Result<T> r) {
  if (!r.ok()) die(r.status());
  return std::move(*r);
}

/// Device bytes of a weight in the backend's layout (repacked quants + f16 scales).
double weight_bytes(DType t, int64_t rows, int64_t cols) {
  const double n = double(rows) * double(cols);
  switch (t) {
    case DType::kQ4_0:
      return n / 2 + n / 16;
    case DType::kQ8_0:
      return n + n / 16;
    case DType::kF32:
      return 4 * n;
    default:
      return 2 * n;
  }
}

struct Ceilings {
  double read_gbs = 0, copy_gbs = 0, bf16_tflops = 0, bf16_pp_tflops = 0;
};

Tensor weight(Backend& b, DType t, int64_t rows, int64_t cols, uint64_t seed, float scale = 0.05f) {
  Tensor w = must(b.alloc_weight(t, {rows, cols}));
  if (Status s = probe::fill_random(b, w, seed, scale); !s.ok()) die(s);
  return w;
}
// Weights of `shapes` in one alloc_weights block, random with scale 1 / sqrt(cols), seeds from seed on.
std::vector<Tensor> weights(Backend& b, DType t, const std::vector<std::array<int64_t, 2>>& shapes, uint64_t& seed) {
  std::vector<Tensor> ws = must(b.alloc_weights(t, shapes));
  for (Tensor& w : ws)
    if (Status s = probe::fill_random(b, w, seed++, 1.0f / std::sqrt(float(w.cols()))); !s.ok()) die(s);
  return ws;
}
Tensor act(Backend& b, DType t, std::initializer_list<int64_t> shape, uint64_t seed, float scale = 1.0f) {
  Tensor x = must(b.alloc(t, shape));
  if (Status s = probe::fill_random(b, x, seed, scale); !s.ok()) die(s);
  return x;
}

/// Copies of a weight of `wb` bytes to rotate over so the timed products read >= 512 MiB from
/// DRAM, not L2 (at least `at_least`, at most 64).
int rotation_copies(double wb, double at_least) {
  return int(std::max(at_least, std::min(64.0, std::ceil(512.0 * (1 << 20) / wb))));
}

// ---- GEMV -------------------------------------------------------------------------------------
void bench_gemv(Backend& b, const Ceilings& c, int reps) {
  std::printf("\n## GEMV (n = 1 unless noted), weights rotated over >= 512 MiB of copies\n");
  std::printf("| dtype | out x in | rows/block | us | GB/s | %% of read |\n|---|---|---|---|---|---|\n");
  const std::pair<int64_t, int64_t> shapes[] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
  for (DType t : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    for (auto [rows, cols] : shapes) {
      const double wb = weight_bytes(t, rows, cols);
      const int copies = rotation_copies(wb, 2);
      std::vector<Tensor> ws;
      for (int i = 0; i < copies; ++i) ws.push_back(weight(b, t, rows, cols, uint64_t(i + 1)));
      Tensor x = act(b, DType::kF32, {8, cols}, 99), y = must(b.alloc(DType::kF32, {8, rows}));
      const double bytes = wb + 4.0 * double(cols + rows);
      const bool quant = t == DType::kQ8_0 || t == DType::kQ4_0;
      for (int r : quant ? std::vector<int>{0, 16, 32} : std::vector<int>{0, 1, 4}) {
        probe::set_gemv_rows(r);
        Tensor x1 = x.rows_view(0, 1), y1 = y.rows_view(0, 1);
        const double ms = must(probe::time_graph_ms(
                              b,
                              [&] {
                                for (auto& w : ws) b.matmul(w, x1, y1, nullptr);
                              },
                              reps)) /
                          copies;
        const double gbs = bytes / (ms * 1e-3) / 1e9;
        std::printf("| %s | %lldx%lld | %s | %.2f | %.0f | %.0f%% |\n", std::string(dtype_name(t)).c_str(),
                    (long long)rows, (long long)cols, r ? std::to_string(r).c_str() : "default", ms * 1e3, gbs,
                    100 * gbs / c.read_gbs);
      }
      probe::set_gemv_rows(0);
      if (rows == 14336) {  // the FFN shapes: 4 tokens at once, and the fused gate+up+SiLU
        Tensor x4 = x.rows_view(0, 4), y4 = y.rows_view(0, 4);
        double ms = must(probe::time_graph_ms(
                        b,
                        [&] {
                          for (auto& w : ws) b.matmul(w, x4, y4, nullptr);
                        },
                        reps)) /
                    copies;
        std::printf("| %s | %lldx%lld n=4 | default | %.2f | %.0f | %.0f%% |\n", std::string(dtype_name(t)).c_str(),
                    (long long)rows, (long long)cols, ms * 1e3, bytes / (ms * 1e-3) / 1e9,
                    100 * bytes / (ms * 1e-3) / 1e9 / c.read_gbs);
        Tensor x1 = x.rows_view(0, 1), y1 = y.rows_view(0, 1);
        const int pairs = copies / 2;
        ms = must(probe::time_graph_ms(
                 b,
                 [&] {
                   for (int i = 0; i < pairs; ++i)
                     b.matmul_glu(ws[size_t(2 * i)], ws[size_t(2 * i + 1)], x1, Activation::kSilu, y1, y1, y1);
                 },
                 reps)) /
             pairs;
        std::printf("| %s | gate+up %lldx%lld glu | default | %.2f | %.0f | %.0f%% |\n",
                    std::string(dtype_name(t)).c_str(), (long long)rows, (long long)cols, ms * 1e3,
                    2 * bytes / (ms * 1e-3) / 1e9, 100 * 2 * bytes / (ms * 1e-3) / 1e9 / c.read_gbs);
      }
      for (auto& w : ws) b.free(w);
      b.free(x);
      b.free(y);
      b.reset_graphs();
    }
  }
}

// ---- GEMV by row count (--sweep) ------------------------------------------------------------
// Quantized GEMVs of 4096 columns at n = 1, one tile of 16 rows per unit, by tile count: how the
// time follows the rounds of units over the resident blocks (2 per SM) versus the bytes. The
// counts bracket multiples of the H200's 264 resident blocks (docs/cuda.md, v23).
void bench_sweep(Backend& b, const Ceilings& c, int reps) {
  std::printf("\n## Quantized GEMV by row tiles (4096 columns, n = 1, 16 rows per unit)\n");
  std::printf("| dtype | tiles | glu | us | GB/s | %% of read |\n|---|---|---|---|---|---|\n");
  const int64_t cols = 4096;
  for (DType t : {DType::kQ4_0, DType::kQ8_0}) {
    for (int64_t tiles : {128, 256, 264, 265, 330, 384, 396, 448, 528, 529, 660, 792, 896, 1056}) {
      const int64_t rows = 16 * tiles;
      const double wb = weight_bytes(t, rows, cols);
      const int copies = rotation_copies(wb, 4);  // >= 2 gate+up pairs
      std::vector<Tensor> ws;
      for (int i = 0; i < copies; ++i) ws.push_back(weight(b, t, rows, cols, uint64_t(i + 1)));
      Tensor x = act(b, DType::kF32, {1, cols}, 99), y = must(b.alloc(DType::kF32, {1, rows}));
      probe::set_gemv_rows(16);
      for (bool glu : {false, true}) {
        const int per = glu ? 2 : 1;
        const double ms = must(probe::time_graph_ms(
                              b,
                              [&] {
                                for (int i = 0; i + per <= copies; i += per) {
                                  if (glu)
                                    b.matmul_glu(ws[size_t(i)], ws[size_t(i + 1)], x, Activation::kSilu, y, y, y);
                                  else
                                    b.matmul(ws[size_t(i)], x, y, nullptr);
                                }
                              },
                              reps)) /
                          (copies / per);
        const double bytes = per * wb;
        std::printf("| %s | %lld | %s | %.2f | %.0f | %.0f%% |\n", std::string(dtype_name(t)).c_str(),
                    (long long)tiles, glu ? "yes" : "no", ms * 1e3, bytes / (ms * 1e-3) / 1e9,
                    100 * bytes / (ms * 1e-3) / 1e9 / c.read_gbs);
      }
      probe::set_gemv_rows(0);
      for (auto& w : ws) b.free(w);
      b.free(x);
      b.free(y);
      b.reset_graphs();
    }
  }
  std::fflush(stdout);
}

// ---- attention -----------------------------------------------------------------------------
// Decode attention of one token at position `at` in caches of `ctx` rows (the keys attended:
// at + 1), 32 query heads of 128 over kv_heads KV heads, 32 layers in one graph, planned for
// at + 1 keys as a step of Slice is (plan_attention_keys) or, with `for_cache`, for the whole
// cache; us per layer. `cache`: the caches' dtype (F16 or Q8_0).
double attention_us(Backend& b, int reps, int64_t ctx, int64_t at, bool for_cache, int kv_heads = 8,
                    DType cache = DType::kF16) {
  std::vector<Tensor> kc, vc;
  for (int l = 0; l < 32; ++l) {
    kc.push_back(act(b, cache, {ctx, int64_t(kv_heads) * 128}, uint64_t(2 * l + 1)));
    vc.push_back(act(b, cache, {ctx, int64_t(kv_heads) * 128}, uint64_t(2 * l + 2)));
  }
  Tensor q = act(b, DType::kF32, {1, 4096}, 7), out = must(b.alloc(DType::kF32, {1, 4096}));
  Tensor pos = must(b.alloc(DType::kI32, {1}));
  const int32_t p = int32_t(at);
  if (Status s = b.to_device(pos, &p, 4, 0); !s.ok()) die(s);
  const AttentionSpec spec{32, kv_heads, 128, 1.0f / std::sqrt(128.0f), 0, 0.0f};
  b.plan_attention_keys(for_cache ? 0 : at + 1, 1);
  const double ms = must(probe::time_graph_ms(
                        b,
                        [&] {
                          for (int l = 0; l < 32; ++l) b.attention(q, kc[size_t(l)], vc[size_t(l)], pos, spec, out);
                        },
                        reps)) /
                    32;
  b.plan_attention_keys(0, 0);  // later graphs plan for the whole cache unless they announce
  for (auto& t : kc) b.free(t);
  for (auto& t : vc) b.free(t);
  b.free(q);
  b.free(out);
  b.free(pos);
  b.reset_graphs();
  return ms * 1e3;
}

// GB/s and % of read of K + V rows of `keys` keys (kv_heads heads of 128 values of `cache`) read
// in `us`.
std::string attention_rate(const Ceilings& c, int64_t keys, double us, int kv_heads = 8, DType cache = DType::kF16) {
  const double gbs = 2.0 * double(keys) * kv_heads * double(*dtype_bytes(cache, 128)) / (us * 1e-6) / 1e9;
  return fmt::format("{:.0f} | {:.0f}%", gbs, 100 * gbs / c.read_gbs);
}

void bench_attention(Backend& b, const Ceilings& c, int reps) {
  std::printf("\n## Decode attention, Llama-3-8B heads (32 q / 8 kv, head_dim 128), f16 / Q8_0 cache, 32 layers\n");
  std::printf("| context | us / layer | GB/s (K+V read) | %% of read | us, Q8_0 cache | GB/s, Q8_0 | %% of read |\n"
              "|---|---|---|---|---|---|---|\n");
  for (int64_t ctx : {512, 513, 640, 4096, 32768}) {  // 513: the splits' second tile of keys
    const double us = attention_us(b, reps, ctx, ctx - 1, false);
    const double q8 = attention_us(b, reps, ctx, ctx - 1, false, 8, DType::kQ8_0);
    std::printf("| %lld | %.2f | %s | %.2f | %s |\n", (long long)ctx, us, attention_rate(c, ctx, us).c_str(), q8,
                attention_rate(c, ctx, q8, 8, DType::kQ8_0).c_str());
  }
  // A server's cache is sized for its longest request, so most steps attend to a part of it:
  // planned for the step's keys (as Slice does) or for the whole cache.
  std::printf("\n## Decode attention by cache rows and keys attended (same heads)\n");
  std::printf("| cache rows | keys | us / layer | GB/s (K+V read) | %% of read | us, planned for the cache |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int64_t ctx : {2048, 4096, 32768})
    for (int64_t keys : {576, 1536, 2048, 4096, 8192})
      if (keys <= ctx) {
        const double us = attention_us(b, reps, ctx, keys - 1, false);
        const double cache_us = attention_us(b, reps, ctx, keys - 1, true);
        std::printf("| %lld | %lld | %.2f | %s | %.2f |\n", (long long)ctx, (long long)keys, us,
                    attention_rate(c, keys, us).c_str(), cache_us);
      }
  // Without GQA (Llama-2-7B heads): 32 KV heads fill the GPU with fewer splits per head.
  std::printf("\n## Decode attention without GQA (32 q / 32 kv heads of 128), 8192-row caches\n");
  std::printf("| keys | us / layer | GB/s (K+V read) | %% of read |\n|---|---|---|---|\n");
  for (int64_t keys : {576, 1536, 2048, 4096, 8192}) {
    const double us = attention_us(b, reps, 8192, keys - 1, false, 32);
    std::printf("| %lld | %.2f | %s |\n", (long long)keys, us, attention_rate(c, keys, us, 32).c_str());
  }
  std::fflush(stdout);
}

// Prefill attention alone: n tokens at positions 0..n-1 attending causally to an f16 cache of
// n rows (what a prompt's layer does after its KV write), 8 calls in one graph; us per call and
// the rate of the causal products (4 n (n + 1) / 2 head_dim FLOP per query head), exact and with
// --prefill-precision half (q and p as one f16 part).
double prefill_attention_us(Backend& b, int reps, int heads, int kv, int64_t n, DType cache = DType::kF16) {
  Tensor kc = act(b, cache, {n, int64_t(kv) * 128}, 1), vc = act(b, cache, {n, int64_t(kv) * 128}, 2);
  Tensor q = act(b, DType::kF32, {n, int64_t(heads) * 128}, 3);
  Tensor out = must(b.alloc(DType::kF32, {n, int64_t(heads) * 128}));
  Tensor pos = must(b.alloc(DType::kI32, {n}));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t(i);
  if (Status s = b.to_device(pos, p.data(), uint64_t(n) * 4, 0); !s.ok()) die(s);
  const AttentionSpec spec{heads, kv, 128, 1.0f / std::sqrt(128.0f), 0, 0.0f};
  const double ms = must(probe::time_graph_ms(
                        b,
                        [&] {
                          for (int l = 0; l < 8; ++l) b.attention(q, kc, vc, pos, spec, out);
                        },
                        reps)) /
                    8;
  for (Tensor* t : {&kc, &vc, &q, &out, &pos}) b.free(*t);
  b.reset_graphs();
  return ms * 1e3;
}

void bench_prefill_attention(Backend& b, Backend& half, int reps) {
  std::printf("\n## Prefill attention (causal, f16 cache, head_dim 128), one call\n");
  std::printf("(us, 1 / 2 sets: the key tiles taken by one set of warps or shared by two, forced; Q8_0: a Q8_0 cache)\n");
  std::printf("| heads (q / kv) | tokens | us | TFLOP/s | us, 1 set | us, 2 sets | us, half | TFLOP/s, half | us, Q8_0 |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  for (auto [heads, kv] : {std::pair{32, 8}, std::pair{16, 8}})
    for (int64_t n : {64, 128, 256, 512, 1024, 2048, 4096}) {
      const double us = prefill_attention_us(b, reps, heads, kv, n);
      double forced[2];
      for (int h = 1; h <= 2; ++h) {
        probe::set_prefill_halves(h);
        forced[h - 1] = prefill_attention_us(b, reps, heads, kv, n);
      }
      probe::set_prefill_halves(0);
      const double half_us = prefill_attention_us(half, reps, heads, kv, n);
      const double q8_us = prefill_attention_us(b, reps, heads, kv, n, DType::kQ8_0);
      const double tflop = 4.0 * double(n) * double(n + 1) / 2 * 128 * heads / 1e12;
      std::printf("| %d / %d | %lld | %.2f | %.0f | %.2f | %.2f | %.2f | %.0f | %.2f |\n", heads, kv, (long long)n, us,
                  tflop / (us * 1e-6), forced[0], forced[1], half_us, tflop / (half_us * 1e-6), q8_us);
    }
  std::fflush(stdout);
}

// ---- sampling ------------------------------------------------------------------------------
// The head's sampling ops of one decode step, each alone in a graph: argmax (greedy), top-k,
// and top-k with the draw from its candidates (top_k_sample: a sampled step of a chained decode).
void bench_sampling(Backend& b, int reps) {
  std::printf("\n## Sampling ops of a decode step (us)\n| vocab | argmax | top-k 40 | top-k 40 + draw | top-k 256 + draw |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int64_t vocab : {128256, 151936}) {
    Tensor logits = act(b, DType::kF32, {1, vocab}, 11);
    Tensor best = must(b.alloc(DType::kI32, {1})), ids = must(b.alloc(DType::kI32, {256, 1}));
    Tensor vals = must(b.alloc(DType::kF32, {256, 1})), out = must(b.alloc(DType::kI32, {1}));
    Tensor state = must(b.alloc(DType::kI32, {8}));
    const DeviceSampling s{0.8f, 0.95f, 0.05f, 0, 1, 0};
    if (Status st = b.to_device(state, &s, sizeof s, 0); !st.ok()) die(st);
    auto us = [&](const std::function<void()>& f) { return must(probe::time_graph_ms(b, f, reps)) * 1e3; };
    auto draw = [&](int k) {
      return [&, k] {
        Tensor i = ids.rows_view(0, k).reshaped({k}), v = vals.rows_view(0, k).reshaped({k});
        b.top_k_sample(logits, k, i, v, state, out);
      };
    };
    const double am = us([&] { b.argmax(logits, best); });
    const double t40 = us([&] {
      Tensor i = ids.rows_view(0, 40).reshaped({40}), v = vals.rows_view(0, 40).reshaped({40});
      b.top_k(logits, 40, i, v);
    });
    const double d40 = us(draw(40)), d256 = us(draw(256));
    std::printf("| %lld | %.1f | %.1f | %.1f | %.1f |\n", (long long)vocab, am, t40, d40, d256);
    for (Tensor* t : {&logits, &best, &ids, &vals, &out, &state}) b.free(*t);
    b.reset_graphs();
  }
  std::fflush(stdout);
}

// ---- prefill GEMM --------------------------------------------------------------------------
void bench_gemm(Backend& b, const Ceilings& c, int reps) {
  std::printf(
      "\n## Prefill GEMM, 512 tokens x [14336, 4096] (F16 / BF16 on cuBLAS; Q8_0 / Q4_0 on gemm_quant's "
      "wgmma where the device has it, else cuBLAS on dequantized tiles)\n");
  std::printf("| dtype | ms | TFLOP/s | %% of cuBLAS bf16 at this shape |\n|---|---|---|---|\n");
  for (DType t : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    Tensor w = weight(b, t, 14336, 4096, 5);
    Tensor x = act(b, DType::kF32, {512, 4096}, 6), y = must(b.alloc(DType::kF32, {512, 14336}));
    const double ms = must(probe::time_graph_ms(
        b, [&] { b.matmul(w, x, y, nullptr); }, reps));
    const double tf = 2.0 * 512 * 14336 * 4096 / (ms * 1e-3) / 1e12;
    std::printf("| %s | %.3f | %.0f | %.0f%% |\n", std::string(dtype_name(t)).c_str(), ms, tf,
                100 * tf / c.bf16_pp_tflops);
    b.free(w);
    b.free(x);
    b.free(y);
    b.reset_graphs();
  }
}

// ---- Quantized prefill GEMM by work item width (--gemm-items) ---------------------------------
// Llama-3-8B's products (q / k / v in one launch, wo, gate / up with SiLU in one launch, down) at
// several token counts, exact (two activation parts), with items of 64 and of 128 tokens, and the
// width gemm_quant chooses (docs/cuda.md v53): what its rule on rounds of items is set from.
void bench_gemm_items(Backend& b, int reps) {
  std::printf("\n## Quantized prefill GEMM by work item (Llama-3-8B products, two parts): ms\n");
  if (!probe::quant_gemm_available(b)) {
    std::printf("(no gemm_quant on this device)\n");
    return;
  }
  std::printf(
      "| weights | tokens | product | items of 64 | items of 128 | 64 / 128 | chosen |\n|---|---|---|---|---|---|---|\n");
  for (DType t : {DType::kQ4_0, DType::kQ8_0}) {
    uint64_t seed = 1;
    std::vector<Tensor> qkv = weights(b, t, {{4096, 4096}, {1024, 4096}, {1024, 4096}}, seed);
    std::vector<Tensor> wo = weights(b, t, {{4096, 4096}}, seed);
    std::vector<Tensor> gu = weights(b, t, {{14336, 4096}, {14336, 4096}}, seed);
    std::vector<Tensor> down = weights(b, t, {{4096, 14336}}, seed);
    for (const int64_t n : {160, 192, 256, 320, 384, 512, 768, 1024, 2048}) {
      Tensor x = act(b, DType::kF32, {n, 4096}, seed++), ff = act(b, DType::kF32, {n, 14336}, seed++);
      Tensor yq = must(b.alloc(DType::kF32, {n, 4096})), yk = must(b.alloc(DType::kF32, {n, 1024}));
      Tensor yv = must(b.alloc(DType::kF32, {n, 1024})), yf = must(b.alloc(DType::kF32, {n, 14336}));
      Tensor tmp = must(b.alloc(DType::kF32, {n, 14336}));
      const MatmulOut q_k_v[3] = {{&qkv[0], &yq}, {&qkv[1], &yk}, {&qkv[2], &yv}};
      const MatmulOut o{&wo[0], &yq}, dn{&down[0], &yq};
      MatmulOut glu{&gu[0], &yf, nullptr, &gu[1], Activation::kSilu};
      glu.tmp = &tmp;
      const std::pair<const char*, std::function<void()>> products[] = {
          {"q / k / v", [&] { b.matmuls(x, InputNorm{}, q_k_v); }},
          {"wo", [&] { b.matmuls(x, InputNorm{}, {&o, 1}); }},
          {"gate / up", [&] { b.matmuls(x, InputNorm{}, {&glu, 1}); }},
          {"down", [&] { b.matmuls(ff, InputNorm{}, {&dn, 1}); }}};
      double sum[3] = {0, 0, 0};
      for (const auto& [name, fn] : products) {
        double ms[2];
        for (int i = 0; i < 2; ++i) {
          probe::set_quant_gemm_item_tokens(b, i == 0 ? 64 : 128);
          ms[i] = must(probe::time_graph_ms(b, fn, reps));
          b.reset_graphs();
        }
        probe::set_quant_gemm_item_tokens(b, 0);
        const int64_t wide = probe::quant_gemm_wide_launches(b);
        fn();
        const bool chose_wide = probe::quant_gemm_wide_launches(b) > wide;
        sum[0] += ms[0], sum[1] += ms[1], sum[2] += ms[chose_wide ? 1 : 0];
        std::printf("| %s | %lld | %s | %.4f | %.4f | %.3f | %d |\n", std::string(dtype_name(t)).c_str(),
                    (long long)n, name, ms[0], ms[1], ms[0] / ms[1], chose_wide ? 128 : 64);
      }
      std::printf("| %s | %lld | layer's four | %.4f | %.4f | %.3f | %.4f ms |\n", std::string(dtype_name(t)).c_str(),
                  (long long)n, sum[0], sum[1], sum[0] / sum[1], sum[2]);
      std::fflush(stdout);
      for (Tensor* tp : {&x, &ff, &yq, &yk, &yv, &yf, &tmp}) b.free(*tp);
    }
    for (auto* ws : {&qkv, &wo, &gu, &down})
      for (Tensor& w : *ws) b.free(w);
    b.reset_graphs();
  }
}

// ---- whole decode steps --------------------------------------------------------------------
struct ModelShape {
  const char* name;
  int n_layers, d, ff, heads, kv_heads, head_dim, vocab;
  bool qk_norm, tied;
  bool interleaved;  // RoPE pairs (2i, 2i + 1), as shoal reads GGUF `llama` files; else rotate_half
};

struct Layer {
  Tensor attn_norm, ffn_norm, q_norm, k_norm, wq, wk, wv, wo, wg, wu, wd, kc, vc;
};

// A layer of m: weights from W(shapes) (weights of those shapes in one alloc_weights block, as
// the loader allocates a layer's q / k / v and its gate / up), norm vectors from norm(n), an f16
// KV cache of ctx rows (random).
template <class MakeW, class MakeNorm>
Layer make_layer(Backend& b, const ModelShape& m, int64_t ctx, uint64_t& seed, MakeW W, MakeNorm norm) {
  const int64_t kvw = int64_t(m.kv_heads) * m.head_dim, qw = int64_t(m.heads) * m.head_dim;
  Layer L;
  L.attn_norm = norm(m.d);
  L.ffn_norm = norm(m.d);
  if (m.qk_norm) L.q_norm = norm(m.head_dim), L.k_norm = norm(m.head_dim);
  const std::vector<Tensor> qkv = W({{qw, m.d}, {kvw, m.d}, {kvw, m.d}}), o = W({{m.d, qw}});
  const std::vector<Tensor> gu = W({{m.ff, m.d}, {m.ff, m.d}}), down = W({{m.d, m.ff}});
  L.wq = qkv[0], L.wk = qkv[1], L.wv = qkv[2], L.wo = o[0];
  L.wg = gu[0], L.wu = gu[1], L.wd = down[0];
  L.kc = act(b, DType::kF16, {ctx, kvw}, seed++), L.vc = act(b, DType::kF16, {ctx, kvw}, seed++);
  return L;
}

void free_layer(Backend& b, Layer& L) {
  for (Tensor* tp : {&L.attn_norm, &L.ffn_norm, &L.q_norm, &L.k_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.wg, &L.wu, &L.wd,
                     &L.kc, &L.vc})
    if (tp->data) b.free(*tp);
}

// RoPE inverse frequencies of m (base 500000), on the device.
Tensor rope_freqs(Backend& b, const ModelShape& m) {
  std::vector<float> f(size_t(m.head_dim / 2));
  for (int i = 0; i < m.head_dim / 2; ++i) f[size_t(i)] = float(std::pow(500000.0, -2.0 * i / m.head_dim));
  Tensor freq = must(b.alloc(DType::kF32, {m.head_dim / 2}));
  if (Status s = b.to_device(freq, f.data(), f.size() * 4, 0); !s.ok()) die(s);
  return freq;
}

// The ops of one layer of the graph of model/forward.cc (norms and residual adds inside the
// matmuls, q/k/v in one call, qk-norm + RoPE + KV write + attention in one), on activations of
// one step.
struct LayerOps {
  Backend& b;
  const ModelShape& m;
  const Tensor &pos, &freq;
  Tensor &x, &h, &delta, &q, &k, &v, &att, &ff, &ff2;

  void qkv(Layer& L) const {
    const MatmulOut outs[3] = {{&L.wq, &q}, {&L.wk, &k}, {&L.wv, &v}};
    b.matmuls(x, InputNorm{&L.attn_norm, 1e-5f, &h}, outs);
  }
  RopeSpec rope_spec() const { return RopeSpec{m.heads, m.head_dim, m.head_dim, m.interleaved, 1.0f}; }
  void rope_kv(Layer& L) const {
    b.rope_kv_write(q, k, v, m.qk_norm ? &L.q_norm : nullptr, m.qk_norm ? &L.k_norm : nullptr, 1e-6f, pos, freq,
                    rope_spec(), m.kv_heads, L.kc, L.vc);
  }
  AttentionSpec attn_spec() const {
    return AttentionSpec{m.heads, m.kv_heads, m.head_dim, 1.0f / std::sqrt(float(m.head_dim)), 0, 0.0f};
  }
  void attention(Layer& L) const { b.attention(q, L.kc, L.vc, pos, attn_spec(), att); }
  // y += w * in (the residual add); next: the norm of the block after it (MatmulOut::next).
  MatmulOut residual_out(const Tensor& w, const InputNorm* next) const {
    MatmulOut o{&w, &x};
    o.accumulate = true;
    o.tmp = &delta;
    o.next = next;
    return o;
  }
  void residual(const Tensor& w, const Tensor& in, const InputNorm* next = nullptr) const {
    const MatmulOut o = residual_out(w, next);
    b.matmuls(in, InputNorm{}, {&o, 1});
  }
  void wo(Layer& L) const { residual(L.wo, att); }
  MatmulOut glu(Layer& L) const {
    MatmulOut o{&L.wg, &ff, nullptr, &L.wu, Activation::kSilu};
    o.tmp = &ff2;
    return o;
  }
  void gate_up(Layer& L) const {
    const MatmulOut o = glu(L);
    b.matmuls(x, InputNorm{&L.ffn_norm, 1e-5f, &h}, {&o, 1});
  }
  void down(Layer& L) const { residual(L.wd, ff); }
  // gate / up, SiLU and down as one op, as model/forward.cc asks for them (CUDA prefill of F16 /
  // BF16 weights: the GLU writes down's input parts, ff left unwritten).
  void ffn(Layer& L, const InputNorm* next = nullptr) const {
    b.gated_ffn(x, InputNorm{&L.ffn_norm, 1e-5f, &h}, glu(L), residual_out(L.wd, next));
  }
  // The q/k/v products and attention as one op, as model/forward.cc asks for them (CUDA: RoPE
  // and the KV write in the GEMV's epilogue for one token of plain weights, interleaved pairs).
  void qkv_attention(Layer& L) const {
    const MatmulOut outs[3] = {{&L.wq, &q}, {&L.wk, &k}, {&L.wv, &v}};
    b.qkv_attention(x, InputNorm{&L.attn_norm, 1e-5f, &h}, outs, m.qk_norm ? &L.q_norm : nullptr,
                    m.qk_norm ? &L.k_norm : nullptr, 1e-6f, pos, freq, rope_spec(), L.kc, L.vc, attn_spec(), att);
  }
  // The layer as model/forward.cc runs it, the residual adds told the norm after them (the
  // next layer's: L's own attention norm here; hints = false: not told).
  void all(Layer& L, bool hints = true) const {
    qkv_attention(L);
    const InputNorm fn{&L.ffn_norm, 1e-5f, &h}, an{&L.attn_norm, 1e-5f, &h};
    residual(L.wo, att, hints ? &fn : nullptr);
    ffn(L, hints ? &an : nullptr);
  }
};

// ---- prefill, op by op -----------------------------------------------------------------------
// One layer of the prefill graph (model/forward.cc at n = 512 tokens, the ops' default
// compositions where the backend fuses only GEMVs) timed op group by op group, times the layers:
// where pp512 spends its time. `note` goes after the title (e.g. the backend's options).
// --prefill-tokens / --prefill-start: the prefill tables' step (512 tokens at positions 0..511 by
// default; a pool's 16-token frame later in a prompt: 16 from 496).
int64_t g_prefill_tokens = 512, g_prefill_start = 0;

void bench_prefill(Backend& b, const ModelShape& m, DType t, int reps, const char* note = "") {
  const int64_t n = g_prefill_tokens, p0 = g_prefill_start, ctx = p0 + n + 129;
  const int64_t kvw = int64_t(m.kv_heads) * m.head_dim, qw = int64_t(m.heads) * m.head_dim;
  uint64_t seed = 5000;
  auto W = [&](std::vector<std::array<int64_t, 2>> shapes) { return weights(b, t, shapes, seed); };
  auto norm = [&](int64_t k) { return act(b, DType::kF32, {k}, seed++, 0.1f); };
  Layer L = make_layer(b, m, ctx, seed, W, norm);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t(p0 + i);
  Tensor freq = rope_freqs(b, m), pos = must(b.alloc(DType::kI32, {n}));
  if (Status s = b.to_device(pos, p.data(), p.size() * 4, 0); !s.ok()) die(s);
  auto A = [&](int64_t k) { return act(b, DType::kF32, {n, k}, seed++, 0.5f); };
  Tensor x = A(m.d), h = A(m.d), delta = A(m.d), q = A(qw), k = A(kvw), v = A(kvw), att = A(qw);
  Tensor ff = A(m.ff), ff2 = A(m.ff);
  const LayerOps ops{b, m, pos, freq, x, h, delta, q, k, v, att, ff, ff2};
  const std::pair<const char*, std::function<void()>> groups[] = {
      {"norm + q/k/v", [&] { ops.qkv(L); }},          {"rope + KV write", [&] { ops.rope_kv(L); }},
      {"attention", [&] { ops.attention(L); }},        {"wo + residual", [&] { ops.wo(L); }},
      {"norm + gate/up + SiLU", [&] { ops.gate_up(L); }}, {"down + residual", [&] { ops.down(L); }},
  };
  std::printf("\n## Prefill of %s %s, %lld tokens from position %lld, one layer op by op (x %d layers)%s\n", m.name,
              std::string(dtype_name(t)).c_str(), (long long)n, (long long)p0, m.n_layers, note);
  std::printf("| ops | us / layer | ms / prompt |\n|---|---|---|\n");
  double total = 0;
  const int64_t stacked0 = probe::stacked_products(b);
  for (const auto& [name, fn] : groups) {
    const double ms = must(probe::time_graph_ms(b, fn, reps));
    total += ms;
    std::printf("| %s | %.1f | %.2f |\n", name, ms * 1e3, ms * m.n_layers);
    b.reset_graphs();
  }
  std::printf("| all layers | %.1f | %.2f (%.0f tokens/s without embedding and LM head) |\n", total * 1e3,
              total * m.n_layers, double(n) / (total * m.n_layers * 1e-3));
  const int64_t stacked = probe::stacked_products(b) - stacked0;
  // The FFN as model/forward.cc asks for it (gated_ffn), against the two rows above it.
  const double ffn_ms = must(probe::time_graph_ms(b, [&] { ops.ffn(L); }, reps));
  std::printf("| norm + gate/up + SiLU + down + residual as one op (gated_ffn) | %.1f | %.2f |\n", ffn_ms * 1e3,
              ffn_ms * m.n_layers);
  b.reset_graphs();
  // The layer as model/forward.cc runs it: q/k/v with attention as qkv_attention (the prefill's
  // RoPE + KV write summing q/k/v's partial products) and the handoffs between ops, two layers in
  // one graph (so the second takes its input from the first's residual add), per layer.
  // Against the same without MatmulOut::next (each block's input split from x), alternated.
  double layer_ms = 0, plain_ms = 0;
  for (int round = 0; round < 2; ++round)
    for (const bool hints : {true, false}) {
      const double ms = must(probe::time_graph_ms(b, [&] { ops.all(L, hints), ops.all(L, hints); }, reps)) / 2;
      double& best = hints ? layer_ms : plain_ms;
      best = round == 0 ? ms : std::min(best, ms);
      b.reset_graphs();
    }
  std::printf("| one layer as model/forward.cc (two in one graph, best of 2) | %.1f | %.2f (%.0f tokens/s) |\n",
              layer_ms * 1e3, layer_ms * m.n_layers, double(n) / (layer_ms * m.n_layers * 1e-3));
  std::printf("| the same, each block's input split from x (no MatmulOut::next) | %.1f | %.2f |\n", plain_ms * 1e3,
              plain_ms * m.n_layers);
  if (t == DType::kF16 || t == DType::kBF16)  // (gemm_matmuls: weights back to back share a GEMM)
    std::printf("(products of a layer sharing a GEMM with weights next to theirs in device memory: %lld; q/k/v 3, "
                "gate/up 2)\n",
                (long long)stacked);
  std::fflush(stdout);
  free_layer(b, L);
  for (Tensor* tp : {&freq, &pos, &x, &h, &delta, &q, &k, &v, &att, &ff, &ff2}) b.free(*tp);
  b.reset_graphs();
}

// The decode steps' positions (--position; 576: a tg128 token after a 512-token prompt), each
// timed on the same weights; the cache holds max(1024, largest position + 1) rows.
std::vector<int32_t> g_positions = {576};
// --gemv-rows: GEMV rows per block in the decode steps (probe::set_gemv_rows); 0: the defaults.
int g_gemv_rows = 0;
// --chain: steps of the chained decode (time_chain_ms) after the replays; 0: none.
int g_chain_steps = 0;

// fused: the graph of model/forward.cc (norms and residual adds inside the GEMVs, q/k/v in one
// launch with attention as qkv_attention: RoPE and the KV write in the GEMV's epilogue for the
// Llama shape, qk-norm + RoPE + KV write inside decode attention for Qwen3-0.6B); else the
// op-by-op sequence of the first CUDA version, for comparison.
void bench_decode(Backend& b, const Ceilings& c, const ModelShape& m, DType t, int reps, const char* note,
                  bool fused = true) {
  const int32_t largest = *std::max_element(g_positions.begin(), g_positions.end());
  const int64_t ctx = std::max<int64_t>(1024, largest + 1 + g_chain_steps), kvw = int64_t(m.kv_heads) * m.head_dim,
                qw = int64_t(m.heads) * m.head_dim;
  double wbytes = 0;
  uint64_t seed = 1000;
  std::vector<Layer> layers(size_t(m.n_layers));
  auto W = [&](std::vector<std::array<int64_t, 2>> shapes) {
    for (const auto& [r, cols] : shapes) wbytes += weight_bytes(t, r, cols);
    return weights(b, t, shapes, seed);
  };
  auto norm = [&](int64_t n) { return act(b, DType::kF32, {n}, seed++, 0.1f); };
  for (auto& L : layers) L = make_layer(b, m, ctx, seed, W, norm);
  Tensor embd = weight(b, t, m.vocab, m.d, seed++);
  Tensor head = m.tied ? embd : W({{m.vocab, m.d}})[0];
  if (m.tied) wbytes += weight_bytes(t, m.vocab, m.d);
  Tensor out_norm = norm(m.d);
  Tensor freq = rope_freqs(b, m);
  Tensor ids = must(b.alloc(DType::kI32, {1})), pos = must(b.alloc(DType::kI32, {1}));
  const int32_t id = 17;
  if (Status s = b.to_device(ids, &id, 4, 0); !s.ok()) die(s);
  auto A = [&](int64_t n) { return must(b.alloc(DType::kF32, {1, n})); };
  Tensor x = A(m.d), h = A(m.d), delta = A(m.d), q = A(qw), k = A(kvw), v = A(kvw), att = A(qw);
  Tensor ff = A(m.ff), ff2 = A(m.ff), logits = A(m.vocab), best = must(b.alloc(DType::kI32, {1}));
  const AttentionSpec spec{m.heads, m.kv_heads, m.head_dim, 1.0f / std::sqrt(float(m.head_dim)), 0, 0.0f};
  const RopeSpec rq{m.heads, m.head_dim, m.head_dim, m.interleaved, 1.0f},
      rk{m.kv_heads, m.head_dim, m.head_dim, m.interleaved, 1.0f};
  auto unfused_step = [&] {
    b.embed(embd, ids, x);
    b.rms_norm(x, layers[0].attn_norm, 1e-5f, h);
    for (size_t l = 0; l < layers.size(); ++l) {
      Layer& L = layers[l];
      if (l > 0) b.add_rms_norm(x, delta, L.attn_norm, 1e-5f, h);
      b.matmul(L.wq, h, q, nullptr);
      b.matmul(L.wk, h, k, nullptr);
      b.matmul(L.wv, h, v, nullptr);
      if (m.qk_norm) {
        b.rms_norm(q, L.q_norm, 1e-6f, q);
        b.rms_norm(k, L.k_norm, 1e-6f, k);
      }
      b.rope(q, pos, freq, rq);
      b.rope(k, pos, freq, rk);
      b.kv_write(L.kc, L.vc, k, v, pos);
      b.attention(q, L.kc, L.vc, pos, spec, att);
      b.matmul(L.wo, att, delta, nullptr);
      b.add_rms_norm(x, delta, L.ffn_norm, 1e-5f, h);
      b.matmul_glu(L.wg, L.wu, h, Activation::kSilu, ff, ff, ff);
      b.matmul(L.wd, ff, delta, nullptr);
    }
    b.add_rms_norm(x, delta, out_norm, 1e-5f, h);
    b.matmul(head, h, logits, nullptr);
    b.argmax(logits, best);
  };
  const LayerOps ops{b, m, pos, freq, x, h, delta, q, k, v, att, ff, ff2};
  auto fused_step = [&] {
    b.embed(embd, ids, x);
    for (Layer& L : layers) ops.all(L);
    const MatmulOut lm{&head, &logits};
    b.matmuls(x, InputNorm{&out_norm, 1e-5f, &h}, {&lm, 1});
    b.argmax(logits, best);
  };
  const std::function<void()> step = fused ? std::function<void()>(fused_step) : std::function<void()>(unfused_step);
  for (const int32_t position : g_positions) {
    if (Status s = b.to_device(pos, &position, 4, 0); !s.ok()) die(s);
    b.plan_attention_keys(position + 1, 1);  // as Slice plans a step
    const double ms = must(probe::time_graph_ms(b, step, reps));
    const double kv_bytes = 2.0 * (position + 1) * double(kvw) * 2 * m.n_layers;
    const double gbs = (wbytes + kv_bytes) / (ms * 1e-3) / 1e9;
    const std::string at = g_positions.size() > 1 ? fmt::format(" @{}", position) : "";
    std::printf("| %s%s%s | %s | %.2f GB | %.3f | %.0f | %.0f | %.0f%% |\n", m.name, note, at.c_str(),
                std::string(dtype_name(t)).c_str(), wbytes / 1e9, ms, 1e3 / ms, gbs, 100 * gbs / c.read_gbs);
    std::fflush(stdout);
  }
  if (g_chain_steps > 0) {  // the step as Slice::decode chains it, position by position
    auto chained = [&] {
      fused_step();
      b.advance_decode(best, ids, pos);
    };
    for (const int32_t position : g_positions) {
      auto reset = [&]() -> Status {
        SHOAL_RETURN_IF_ERROR(b.to_device(pos, &position, 4, 0));
        return b.to_device(ids, &id, 4, 0);
      };
      b.plan_attention_keys(position + g_chain_steps, 1);  // one graph for the chain: its last step's keys
      const auto t = must(probe::time_chain_ms(b, chained, best, position, reset, g_chain_steps));
      std::printf("| chain of %d from @%d, ms per step | graphs %.4f | + copy %.4f | host waits %.4f | graphs %.4f |\n",
                  g_chain_steps, position, t.graphs, t.copy, t.host, t.graphs_again);
      std::fflush(stdout);
    }
  }
  b.plan_attention_keys(0, 0);  // (withdrawn, as Slice does after a step)
  for (auto& L : layers) free_layer(b, L);
  if (!m.tied) b.free(head);
  for (Tensor* tp : {&embd, &out_norm, &freq, &ids, &pos, &x, &h, &delta, &q, &k, &v, &att, &ff, &ff2, &logits, &best})
    b.free(*tp);
  b.reset_graphs();
}

// ---- Tensor-core rates (--tensor) -------------------------------------------------------------
// What the quantized prefill GEMM's instruction can give at each width (its products are 32, 64
// or 128 columns; 16 is what stacking the parts at 16 tokens would take, docs/cuda.md v52), with
// the product's waits and promotions, against mma.sync.
void bench_tensor(int device, int reps) {
  // A cell: the rate, or "-" where the device runs no sm_90a code (or 3 warpgroups at 128 columns,
  // which do not fit the registers); other errors end the run.
  auto cell = [](Result<double> r) {
    if (!r.ok() && r.status().code() == Code::kUnavailable) return std::string("-");
    return fmt::format("{:.0f}", must(std::move(r)));
  };
  std::printf("\n## wgmma.m64nNk16 f16, A in registers, one block per SM: TFLOP/s (modes: 0 rate, 1 the GEMM's waits, "
              "2 + promotions)\n| N | 1 wg: 0 / 1 / 2 | 2 wg: 0 / 1 / 2 | 3 wg: 0 / 1 / 2 |\n|---|---|---|---|\n");
  for (int n : {16, 32, 64, 128}) {
    std::string line = fmt::format("| {} |", n);
    for (int wg = 1; wg <= 3; ++wg)
      for (int mode = 0; mode <= 2; ++mode)
        line += " " + (n == 128 && wg == 3 ? std::string("-") : cell(probe::wgmma_tflops(device, n, wg, mode, reps))) +
                (mode < 2 ? " /" : " |");
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  std::printf("\n## mma.sync.m16n8k16 f16, one block per SM: TFLOP/s\n| warps | 4 | 8 | 16 |\n|---|---|---|---|\n|  |");
  for (int w : {4, 8, 16}) std::printf(" %.0f |", must(probe::mma_sync_tflops(device, w, reps)));
  std::printf("\n");
  std::fflush(stdout);
}

int run(int device, int reps, bool quick, bool prefill, bool sweep, bool attention, bool gemv, bool prefill_attention,
        bool sampling, bool tensor, bool gemm_items, const std::string& only) {
  auto info = must(probe::device_info(device));
  std::printf("# cuda_kernels on cuda:%d %s (%d SMs, L2 %.0f MiB, %.1f GiB)\n", device, info.name.c_str(), info.sms,
              double(info.l2_bytes) / (1 << 20), double(info.memory_bytes) / (1 << 30));
  Ceilings c;
  c.read_gbs = must(probe::read_bandwidth_gbs(device, 4ull << 30, reps));
  c.copy_gbs = must(probe::copy_bandwidth_gbs(device, 2ull << 30, reps));
  c.bf16_tflops = must(probe::cublas_bf16_tflops(device, 8192, 8192, 8192, reps));
  c.bf16_pp_tflops = must(probe::cublas_bf16_tflops(device, 14336, 512, 4096, reps));
  std::printf(
      "\n## Ceilings\n| read kernel GB/s | d2d copy GB/s (r+w) | cuBLAS bf16 8192^3 TFLOP/s | cuBLAS bf16 "
      "14336x512x4096 TFLOP/s |\n");
  std::printf("|---|---|---|---|\n| %.0f | %.0f | %.0f | %.0f |\n", c.read_gbs, c.copy_gbs, c.bf16_tflops,
              c.bf16_pp_tflops);
  std::fflush(stdout);

  if (tensor) {
    bench_tensor(device, reps);
    return 0;
  }
  auto backend = must(create_backend("cuda:" + std::to_string(device)));
  Backend& b = *backend;
  probe::set_gemv_rows(g_gemv_rows);
  const ModelShape llama{"Llama-3-8B", 32, 4096, 14336, 32, 8, 128, 128256, false, false, true};
  const ModelShape qwen{"Qwen3-0.6B", 28, 1024, 3072, 16, 8, 128, 151936, true, true, false};
  if (sweep) {
    bench_sweep(b, c, reps);
    return 0;
  }
  if (gemm_items) {
    bench_gemm_items(b, reps);
    return 0;
  }
  auto half_backend = [&] {  // the same device with --prefill-precision half
    BackendOptions half;
    half.half_prefill = true;
    return must(create_backend("cuda:" + std::to_string(device), half));
  };
  if (attention || prefill_attention) {
    if (attention) bench_attention(b, c, reps);
    bench_prefill_attention(b, *half_backend(), reps);
    return 0;
  }
  if (gemv) {
    bench_gemv(b, c, reps);
    return 0;
  }
  if (sampling) {
    bench_sampling(b, reps);
    return 0;
  }
  if (prefill) bench_gemm(b, c, reps);
  if (prefill && !only.empty()) {  // one model's tables, exact and half
    const ModelShape& m = only.starts_with("qwen") ? qwen : llama;
    const DType t = only.ends_with("q4_0") ? DType::kQ4_0 : only.ends_with("q8_0") ? DType::kQ8_0 : DType::kF16;
    bench_prefill(b, m, t, reps);
    bench_prefill(*half_backend(), m, t, reps, ", --prefill-precision half");
    return 0;
  }
  if (prefill || !quick) {
    for (DType t : {DType::kF16, DType::kQ8_0, DType::kQ4_0}) bench_prefill(b, llama, t, reps);
    bench_prefill(b, qwen, DType::kF16, reps);
    // The tables again on a backend with one activation part (--prefill-precision half; Q8_0 /
    // Q4_0 take it where gemm_quant runs).
    auto hb = half_backend();
    for (DType t : {DType::kF16, DType::kQ8_0, DType::kQ4_0})
      bench_prefill(*hb, llama, t, reps, ", --prefill-precision half");
    bench_prefill(*hb, qwen, DType::kF16, reps, ", --prefill-precision half");
    hb.reset();
    if (prefill) return 0;
  }
  if (!only.empty()) {  // one decode step, e.g. for a profiler
    const ModelShape& m = only.starts_with("qwen") ? qwen : llama;
    const DType t = only.ends_with("q4_0") ? DType::kQ4_0 : only.ends_with("q8_0") ? DType::kQ8_0 : DType::kF16;
    std::printf("| shape | weights | bytes/token | ms/token | tokens/s | GB/s | %% of read |\n|---|---|---|---|---|---|---|\n");
    bench_decode(b, c, m, t, reps, "");
    return 0;
  }
  if (!quick) {
    bench_gemv(b, c, reps);
    bench_attention(b, c, reps);
    bench_prefill_attention(b, *half_backend(), reps);
    bench_gemm(b, c, reps);
  }
  bench_sampling(b, reps);
  std::printf("\n## Decode step (one CUDA graph: every layer op, LM head, argmax), position %s\n",
              fmt::format("{}", fmt::join(g_positions, ", ")).c_str());
  std::printf(
      "| shape | weights | bytes/token | ms/token | tokens/s | GB/s | %% of read |\n|---|---|---|---|---|---|---|\n");
  for (DType t : {DType::kQ4_0, DType::kQ8_0, DType::kF16}) bench_decode(b, c, llama, t, reps, "");
  bench_decode(b, c, qwen, DType::kF16, reps, "");
  // The op-by-op graph of the first version: what the fusion is worth.
  bench_decode(b, c, llama, DType::kQ4_0, reps, " (unfused)", false);
  bench_decode(b, c, qwen, DType::kF16, reps, " (unfused)", false);
  // The same without programmatic dependent launch: what the launch-gap hiding is worth.
  probe::set_pdl(false);
  bench_decode(b, c, llama, DType::kQ4_0, reps, " (no PDL)");
  bench_decode(b, c, qwen, DType::kF16, reps, " (no PDL)");
  if (Status s = b.synchronize(); !s.ok()) die(s);
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  CLI::App app{"CUDA kernel benchmarks against the device's measured ceilings"};
  int device = 0, reps = 20;
  bool quick = false;
  app.add_option("--device", device, "CUDA device index")->capture_default_str();
  app.add_option("--reps", reps, "Timed repetitions per figure (median reported)")->capture_default_str();
  std::string only;
  app.add_flag("--quick", quick, "Ceilings and decode steps only");
  bool prefill = false, sweep = false, attention = false, gemv = false, prefill_attention = false, sampling = false,
       tensor = false, gemm_items = false;
  app.add_flag("--sweep", sweep, "Ceilings and the quantized GEMVs by row count only");
  app.add_flag("--gemv", gemv, "Ceilings and the GEMV table of Llama-3-8B shapes only");
  app.add_flag("--attention", attention,
               "Ceilings, decode attention (Llama-3-8B heads, several contexts) and prefill attention only");
  app.add_flag("--prefill-attention", prefill_attention,
               "Ceilings and prefill attention (Llama-3-8B and Qwen3-0.6B heads, 512-4096 tokens) only");
  app.add_flag("--prefill", prefill, "Ceilings and the prefill breakdowns only");
  app.add_flag("--tensor", tensor, "Ceilings and the tensor-core rates (wgmma by width and warpgroups, mma.sync) only");
  app.add_flag("--gemm-items", gemm_items,
               "Ceilings and the quantized prefill GEMM of Llama-3-8B's products by work item width (64 or 128 "
               "tokens) and token count only");
  app.add_flag("--sampling", sampling, "Ceilings and the sampling ops of a decode step (argmax, top-k, draw) only");
  CLI::Option* only_opt =
      app.add_option("--only", only,
                     "Ceilings and one decode step: llama-q4_0, llama-q8_0, llama-f16 or qwen-f16 (with --prefill: "
                     "that model's prefill tables)");
  app.add_option("--position", shoal::g_positions,
                 "Positions of the decode steps, each timed on the same weights (the cache holds at least 1024 rows)")
      ->capture_default_str()
      ->expected(1, 64)
      ->check(CLI::Range(0, 32767));
  app.add_option("--prefill-tokens", shoal::g_prefill_tokens, "With --prefill: the tables' step in tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--prefill-start", shoal::g_prefill_start,
                 "With --prefill: the step's first position (its tokens attend to as many cache rows before it)")
      ->capture_default_str()
      ->check(CLI::Range(0, 32768));
  app.add_option("--gemv-rows", shoal::g_gemv_rows,
                 "With --only: GEMV rows per block in the decode step (plain weights 1, 2 or 4; quantized 16 or "
                 "32), 0 for the per-dtype defaults")
      ->capture_default_str()
      ->check(CLI::IsMember({0, 1, 2, 4, 16, 32}))
      ->needs(only_opt);
  app.add_option("--chain", shoal::g_chain_steps,
                 "With --only: also time this many chained steps from each position (graphs back to back, "
                 "with a copy of the id after each, with the host waiting for each id as generation does)")
      ->check(CLI::Range(0, 4096));
  CLI11_PARSE(app, argc, argv);
  shoal::init_logging("warn");
  return shoal::run(device, reps, quick, prefill, sweep, attention, gemv, prefill_attention, sampling, tensor,
                    gemm_items, only);
}

#else  // no CUDA backend in this build

int main() {
  std::printf("cuda_kernels: this build has no CUDA backend\n");
  return 0;
}

#endif
