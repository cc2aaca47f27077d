// Prefill GEMM (kQuantGemmMinTokens tokens or more) for Q8_0 / Q4_0 weights on the Hopper
// warpgroup tensor cores (wgmma, sm_90a): y = W x for the activation parts of
// split_activations (x = hi + lo in f16: the n hi rows, then the n lo rows), exact like the GEMV;
// or, with BackendOptions::half_prefill, for x as one f16 part (kParts = 1).
//
// Why: the cuBLAS path (cuda_gemm.cc) dequantizes W into f16 hi + lo (d * (q - 8) needs 15
// significant bits) and runs three f16 products, w_hi [x_hi x_lo] + w_lo x_hi. Here each value
// q - 8 (Q4_0) or q (Q8_0) is an exact f16 small integer, converted in registers from the tile
// layout (cuda_util.h; per warp it is the A fragment of wgmma's register operand, the layout of
// mma.m16n8k16), so one product per activation part: two instead of three, and no dequantized
// copy. The f16 products are exact and accumulate in f32 over a 32-value block (from 32 tokens
// both parts' products in one accumulator); each block's sum is then multiplied by its f32 scale
// and added to the row's total ("promotion").
//
// Work split: a work item is 128 rows (8 16-row tiles; with glu 64 rows of gate and the same 64 of
// up) x 64 tokens of y, whose B operand holds the hi and lo parts of those tokens (a stage's 128
// rows of B, two m64n64 products per k-step; calls of many items take 128 tokens, 256 rows of B and
// two m64n128 products, where that takes fewer rounds over the SMs; with one part,
// --prefill-precision half, 128 tokens' f16 x and half the MMAs per token; calls of few tokens take
// items of 32 or 64 rows of B), so the parts are summed in the kernel, which writes y itself:
// 1 / scale, the bias, the residual add, or act(gate) * up, in the order of combine_parts / combine_glu
// (gemm_prep.cu), with no combine kernel (and no f32 scratch but split K's, below). One block per
// SM (two for Q4_0 at 32 columns) loops over the items (persistent). Warpgroup 0 streams the stages
// through a ring (3-5 stages at 256 columns, 6 at 128, 8 at 64, 12 at 32, 10-12 with two blocks per
// SM; one thread issues the TMA copies of a stage: the tokens' hi and lo activations, at 128
// columns 2 x 64 x 64 f16 in the 128-byte swizzle wgmma reads, as one 3-D box (one part: 1 x 128 x
// 64), and the tiles' quants and scales), counted over all of the block's items, so it runs into
// the next item while the computing warps write one out; it gives its registers to warpgroups 1 and
// 2, which compute 64 rows each (warp 4 + w holds tile w). Per stage a warpgroup puts its two
// 32-value blocks on the tensor cores as two groups and promotes block 0 while block 1's products
// run; the stages pass between the warpgroups on shared-memory barriers (full / empty), so they
// drift apart and one's promotion also overlaps the other's MMAs. The activation of glu is a
// template parameter: the epilogue holds one activation's code, not three unrolled 32 times. Where
// the items would leave most SMs idle (few tokens over few rows), each item's K is split into
// ranges on several blocks, the last of which adds their partial sums in order (QuantGemmSplit;
// H100, Llama-3-8B Q4_0 steps of 16 tokens: 9.9 -> 4.2 ms with the narrow items and split K,
// docs/cuda.md v50). PTX ISA: "asynchronous warpgroup level matrix multiply-accumulate"
// (wgmma.mma_async, matrix descriptors, register fragments), "mbarrier", "cp.async.bulk.tensor",
// "setmaxnreg".
// Twin: ref::matmul (src/backend/cpu/ref_ops.cc); tests: tests/cuda/cuda_gemm_quant_test.cc.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant_mma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace shoal::cuda {
namespace {

// A block's B operand: a stage's kN rows of shared memory (128, or 64 / 32 for calls of few
// tokens, 256 with two parts for calls of many work items), the hi rows then the lo rows of
// Parts<2, kN>::kTokens = kN / 2 tokens, or with one part (--prefill-precision half) kN tokens;
// kK: a stage's columns of K.
constexpr int kK = 64;
constexpr int kTiles = 8;                    // 16-row tiles of a block: a computing warp each
constexpr int kThreads = 128 + 32 * kTiles;  // the producer warpgroup, then the computing warps
// Blocks per SM: two for Q4_0 at 32 columns (calls of up to 16 tokens, 32 with one part), so that
// one block's waits on its stages, its epilogue and its split-K handoff overlap the other's
// products: a computing warp's stage is a chain of dependent steps, and one block gives a
// scheduler only two such warps (H100, Llama-3-8B Q4_0 steps of 16 tokens 1.08x). Q8_0's stages
// are 1.4x larger: two blocks of 8 were 2% slower than one of 12 (docs/cuda.md v51).
constexpr int blocks_per_sm(bool q4, int n) { return q4 && n == 32 ? 2 : 1; }
}  // namespace

// (In a named namespace: in the unnamed one nvcc warns of each member that a kN leaves unused.)
namespace qgemm {
template <int kParts, int kN>
struct Parts {
  static_assert(kParts == 1 || kParts == 2);
  // (256: items of 128 tokens, only with the parts stacked: two m64n128 products per k-step into
  // 64 accumulators a thread, as many as one part's 128-token items hold.)
  static_assert(kN == 32 || kN == 64 || kN == 128 || (kN == 256 && kParts == 2));
  static constexpr int kTokens = kN / kParts;   // of a work item
  // Two parts of 32 to 128 tokens are stacked along K: each k-step runs one m64 x kTokens product
  // per part into the same accumulators (the A fragment reused), so a block's sum is hi + lo and a
  // thread promotes kTokens / 2 values per block, not kN / 2 (H100, Llama-3-8B pp512 Q4_0 / Q8_0
  // 1.07x / 1.07-1.13x). At 16 tokens the parts stay side by side in one m64 x 32 product: 16
  // columns run at about half the tensor cores' 32-column rate (steps of 16 tokens 3% slower
  // stacked; docs/cuda.md, v52).
  static constexpr bool kStacked = kParts == 2 && kTokens >= 32;
  static constexpr bool kSideBySide = kParts == 2 && !kStacked;  // hi and lo in separate accumulators
  static constexpr int kMmaN = kStacked ? kTokens : kN;  // the wgmma's columns
  static constexpr int kAcc = kMmaN / 2;        // a thread's accumulators of a 64 x kMmaN product
  static constexpr int kVals = kTokens / 2;     // a thread's outputs of an item (its rows g, g + 8)
  static constexpr int kGroups = kVals / 4;     // of 8 tokens
  static constexpr int kProducts = kStacked ? 2 : 1;           // per k-step
  static constexpr unsigned kPartDesc = kTokens * 128 >> 4;  // the lo part's rows in descriptor units
  static constexpr int kExchangeBytes = 2 * 4 * kVals * 32 * 4;  // glu: up's values for the gate warps, 2 buffers
};
}  // namespace qgemm

namespace {

using qgemm::Parts;

struct QGemmArgs {
  // Tensor maps (TMA) of the activations x16 as [parts][n][k] f16 (boxes of parts x kTokens x 64
  // in the 128-byte swizzle: hi, then lo) and of each weight's quants [tiles, chunks x 512 bytes] and
  // scales [tiles, chunks x 64 / 32 bytes] (boxes of a stage's chunks x an item's tiles of that
  // weight); out-of-range parts load as zeros.
  CUtensorMap tx, tq[kGemvMaxOuts], ts[kGemvMaxOuts];
  QuantGemmOut out[kGemvMaxOuts];
  int64_t rows[kGemvMaxOuts];
  unsigned block_end[kGemvMaxOuts];  // row blocks of the weights so far (with glu: of gate)
  int count;
  int64_t k, n;
  const float* inv_scale;  // [n] or null
  // Split K (QuantGemmSplit): each (row block, token block) item's stages in `splits` ranges, work
  // item u taking range u % splits; partial [item][range][kTokens][128 rows] f32, counters [item].
  int splits;
  float* partial;
  unsigned* counters;
};

template <bool kQ4, int kN>
struct Stage {
  static constexpr int kChunks = kQ4 ? 1 : 2;                // weight chunks per stage and tile
  static constexpr int kScaleBytes = kQ4 ? 64 : 32;          // a chunk's f16 scales: 8 g x 2 blocks x 2 halves (Q4_0), 8 g x 2 halves
  // A stage's box of one tile row in 4-byte words (the tensor maps' unit): quants and scales.
  static constexpr int kQuantWords = kChunks * 512 / 4, kScaleWords = kChunks * kScaleBytes / 4;
  static constexpr int kB = kN * kK * 2;                     // activations: 16 KiB at 128 columns
  static constexpr int kA = kTiles * kChunks * 512;          // quants of the tiles
  static constexpr int kS = kTiles * kChunks * kScaleBytes;  // their scales
  static constexpr int kBytes = (kB + kA + kS + 1023) / 1024 * 1024;  // (B stays 1024-byte aligned)
};

// Stages of the ring: at 256 columns as many of 5 as fit a block's shared memory beside the glu
// exchange (37 / 41 KiB stages: Q4_0 5, with glu 4; Q8_0 5, with glu 3); 6 at 128 columns (150 KiB
// of Q8_0 stages), 8 at 64, 12 at 32; with two blocks per SM as many of 12 as fit half of an SM's
// shared memory beside the glu exchange, the ring's alignment and the barriers (Q4_0: 12, with
// glu 11, with glu and one part 10).
constexpr int kSmemPerSm = 228 * 1024;     // sm_90 (H100, H200)
constexpr int kSmemPerBlock = 227 * 1024;  // sm_90's most dynamic shared memory per block
constexpr int kSmemReservedPerBlock = 1024;  // the system's share of each block
constexpr int kStaticSmem = 512;           // the ring's barriers and the split flag, at most
template <bool kQ4, bool kGlu, int kParts, int kN>
constexpr int ring_stages() {
  if constexpr (kN == 256) {
    constexpr int ex = kGlu ? Parts<kParts, kN>::kExchangeBytes : 0;
    return std::min(5, (kSmemPerBlock - 1024 /* alignment */ - kStaticSmem - ex) / Stage<kQ4, kN>::kBytes);
  }
  if constexpr (kN == 128) return 6;
  if constexpr (kN == 64) return 8;
  if constexpr (blocks_per_sm(kQ4, kN) == 1) return 12;
  constexpr int budget = kSmemPerSm / 2 - kSmemReservedPerBlock - 1024 /* alignment */ - kStaticSmem;
  constexpr int ex = kGlu ? Parts<kParts, kN>::kExchangeBytes : 0;
  return std::min(12, (budget - ex) / Stage<kQ4, kN>::kBytes);
}

// kGlu: gate (warps 0..3) and up (4..7) of the same 64 rows, out[0] = kAct(gate) * up. kParts:
// the activation parts in x16 (2: hi + lo, exact; 1: one f16 part). kN: a stage's rows of B
// (Parts: the MMA's columns kN, or kN / 2 per part where the parts are stacked).
template <bool kQ4, bool kGlu, Act kAct, int kParts, int kN>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(kQ4, kN))
    gemm_quant_kernel(const __grid_constant__ QGemmArgs a) {
  pdl_prologue();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using St = Stage<kQ4, kN>;
  using P = Parts<kParts, kN>;
  constexpr int kStages = ring_stages<kQ4, kGlu, kParts, kN>(), kAcc = P::kAcc;
  static_assert(kStages >= 2 && 2 * kStages * 8 + 8 <= kStaticSmem, "the ring and its barriers");
  extern __shared__ uint8_t smem_raw[];  // (one spare KiB: the ring starts 1024-byte aligned)
  uint8_t* const smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full[kStages], empty[kStages];  // a stage landed / every consumer warp is done with it
  __shared__ bool split_last;                         // split K: this block adds the item's ranges
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t stages = div_up(a.k, kK), n_tok = div_up(a.n, P::kTokens);
  // (row block, token block, K range) triples
  const int64_t n_work = int64_t(a.block_end[a.count - 1]) * n_tok * a.splits;
  // Work item u: K range u % splits (stages [s0, s1)) of token block (u / splits) % n_tok of row
  // block u / splits / n_tok (a wave's blocks share row blocks: their weights once through L2);
  // its weight and first tile.
  auto item = [&](int64_t u, int& wi, int64_t& tok0, int64_t& tile0, int& s0, int& s1) {
    const int sp = int(u % a.splits);
    s0 = int(stages * sp / a.splits);
    s1 = int(stages * (sp + 1) / a.splits);
    u /= a.splits;
    const unsigned rb = unsigned(u / n_tok);
    unsigned first = 0;
    wi = 0;
#pragma unroll
    for (int i = 1; i < kGemvMaxOuts; ++i)
      if (i < a.count && rb >= a.block_end[i - 1]) wi = i, first = a.block_end[i - 1];
    tok0 = (u % n_tok) * P::kTokens;
    tile0 = int64_t(rb - first) * (kGlu ? kTiles / 2 : kTiles);
  };
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kTiles);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  // The ring's stages are counted over all of the block's work items, so the producer runs
  // into the next item while the computing warps finish one and write it out.
  if (tid < 128) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      int slot = 0;
      unsigned round = 0;  // the ring's: the block's stage j is slot j % kStages of round j / kStages
#pragma unroll 1
      for (int64_t u = blockIdx.x; u < n_work; u += gridDim.x) {
        int wi, s0, s1;
        int64_t tok0, tile0;
        item(u, wi, tok0, tile0, s0, s1);
#pragma unroll 1
        for (int s = s0; s < s1; ++s) {
          if (round > 0) mbar_wait(&empty[slot], (round - 1) & 1);
          uint8_t* base = smem + slot * St::kBytes;
          mbar_expect(&full[slot], St::kB + St::kA + St::kS);
          tma_3d(base, &a.tx, int(s * kK), int(tok0), 0, &full[slot]);  // hi, then lo (or the one part)
          if constexpr (kGlu) {  // gate into tiles 0..3, up into 4..7
            for (int w = 0; w < 2; ++w) {
              tma_2d(base + St::kB + w * St::kA / 2, &a.tq[w], int(s * St::kQuantWords), int(tile0), &full[slot]);
              tma_2d(base + St::kB + St::kA + w * St::kS / 2, &a.ts[w], int(s * St::kScaleWords), int(tile0),
                     &full[slot]);
            }
          } else {
            tma_2d(base + St::kB, &a.tq[wi], int(s * St::kQuantWords), int(tile0), &full[slot]);
            tma_2d(base + St::kB + St::kA, &a.ts[wi], int(s * St::kScaleWords), int(tile0), &full[slot]);
          }
          if (++slot == kStages) slot = 0, ++round;
        }
      }
    }
    return;
  }
  // The producer's registers to the computing warps: of 168 per thread at one block per SM (65536
  // / 384, rounded down to 8) up to 232; of 80 at two, up to 96.
  if constexpr (blocks_per_sm(kQ4, kN) == 2)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 96;\n" ::: "memory");
  else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int warp = (tid >> 5) - 4;  // 0..7: the tile

  // The A fragments (two k-steps) and the scales (rows g, g + 8) of block b of the stage at base.
  auto fetch = [&](const uint8_t* base, int b, uint32_t(&f)[2][4], uint32_t& dbits) {
    if constexpr (kQ4) {
      const uint4 w = *reinterpret_cast<const uint4*>(base + St::kB + warp * 512 + lane * 16);
      const uint2 sc = *reinterpret_cast<const uint2*>(base + St::kB + St::kA + warp * 64 + g * 8);
      q4_fragment(b ? w.z : w.x, f[0]);
      q4_fragment(b ? w.w : w.y, f[1]);
      dbits = b ? sc.y : sc.x;
    } else {
      const uint4 w = *reinterpret_cast<const uint4*>(base + St::kB + (warp * 2 + b) * 512 + lane * 16);
      dbits = *reinterpret_cast<const uint32_t*>(base + St::kB + St::kA + (warp * 2 + b) * 32 + g * 4);
      q8_fragment(w.x, w.y, f[0]);
      q8_fragment(w.z, w.w, f[1]);
    }
  };
  float total[kAcc], acc[2][kAcc];
  auto promote = [&](const float(&c)[kAcc], uint32_t dbits) {
    const float2 d = bits_half2(dbits);  // rows g (0, 1) and g + 8 (2, 3)
#pragma unroll
    for (int i = 0; i < kAcc; i += 4) {
      total[i] = fmaf(d.x, c[i], total[i]);
      total[i + 1] = fmaf(d.x, c[i + 1], total[i + 1]);
      total[i + 2] = fmaf(d.y, c[i + 2], total[i + 2]);
      total[i + 3] = fmaf(d.y, c[i + 3], total[i + 3]);
    }
  };
  int slot = 0;
  unsigned round = 0;
  int parity = 0;  // glu: the exchange buffer of this item
#pragma unroll 1
  for (int64_t u = blockIdx.x; u < n_work; u += gridDim.x, parity ^= 1) {
    int wi, s0, s1;
    int64_t tok0, tile0;
    item(u, wi, tok0, tile0, s0, s1);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] = 0.0f;
    // The stage's two 32-value blocks go on the tensor cores as two groups, and block 0 is
    // promoted while block 1's products run. (Block 1 promoted during the next stage's block 0,
    // i.e. a group in flight across iterations, made ptxas serialize the wgmma: C7514.)
#pragma unroll 1
    for (int s = s0; s < s1; ++s) {
      mbar_wait(&full[slot], round & 1);
      const uint8_t* base = smem + slot * St::kBytes;
      const uint64_t desc = sw128_desc(base);
      uint32_t frag[2][2][4], dbits[2];
      fetch(base, 0, frag[0], dbits[0]);
      fetch(base, 1, frag[1], dbits[1]);
      // Block b's k-steps j (32 bytes of a 128-byte row apart) times each part (its rows of B).
      auto products = [&](float(&c)[kAcc], const uint32_t(&f)[2][4], int b) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int p = 0; p < P::kProducts; ++p)
            wgmma<P::kMmaN>(c, f[j], desc + uint64_t((64 * b + 32 * j) >> 4) + p * P::kPartDesc, j + p);
      };
      wgmma_fence();
      products(acc[0], frag[0], 0);
      wgmma_commit();
      products(acc[1], frag[1], 1);
      wgmma_commit();
      wgmma_wait<1>();  // block 0
      promote(acc[0], dbits[0]);
      wgmma_wait<0>();  // block 1
      if (lane == 0) mbar_arrive(&empty[slot]);
      promote(acc[1], dbits[1]);
      if (++slot == kStages) slot = 0, ++round;
    }
    // Thread (warp, g, t): rows 16 warp + g (+ 8) of the item (with glu: 16 (warp % 4) + g (+ 8)
    // of gate or up), tokens 8 i + 2 t (+ 1) in total[4 i + e] (e: row g / g + 8, token + 0 / 1),
    // stacked: hi + lo; side by side: hi, and lo of the same tokens in total[4 (i + kGroups) + e].
    // The epilogue as combine_parts / combine_glu (gemm_prep.cu): (hi + lo) * inv_scale, then +
    // bias, then + y.
    constexpr int kVals = P::kVals, kGroups = P::kGroups;
    const int tw = kGlu ? warp & 3 : warp;
    const int64_t r0 = (tile0 + tw) * 16 + g, rows = a.rows[wi];
    float v[kVals];
#pragma unroll
    for (int i = 0; i < kGroups; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t tok = tok0 + 8 * i + 2 * t + (e & 1);
        const float inv = a.inv_scale && tok < a.n ? a.inv_scale[tok] : 1.0f;
        v[4 * i + e] = (P::kSideBySide ? total[4 * i + e] + total[4 * (i + kGroups) + e] : total[4 * i + e]) * inv;
      }
    if constexpr (kGlu) {  // up's values to the gate warps through shared memory (a buffer per item parity)
      float* const ex = reinterpret_cast<float*>(smem + kStages * St::kBytes) + parity * (P::kExchangeBytes / 8);
      if (warp >= 4) {
#pragma unroll
        for (int i = 0; i < kVals; ++i) ex[((warp - 4) * kVals + i) * 32 + lane] = v[i];
      }
      asm volatile("bar.sync 1, %0;" ::"n"(32 * kTiles) : "memory");  // the computing warps only
      if (warp >= 4) continue;
#pragma unroll
      for (int i = 0; i < kVals; ++i) v[i] = apply_act(v[i], kAct) * ex[(warp * kVals + i) * 32 + lane];
    }
    // (Compiled only where the host may split: its code cost registers, and spills, elsewhere.)
    if constexpr (!kGlu && P::kTokens <= 64) if (a.splits > 1) {
      // This K range's sums to its place in `partial` (each thread its own values; every slot of
      // the item written, rows and tokens past the ends too); the last range to finish, by the
      // item's counter, adds all of them in range order.
      float* const pi = a.partial + (u / a.splits) * int64_t(a.splits) * (P::kTokens * 128) + (tw * 16 + g);
      float* const mine = pi + (u % a.splits) * (P::kTokens * 128);
#pragma unroll
      for (int i = 0; i < kGroups; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(8 * i + 2 * t + (e & 1)) * 128 + 8 * (e >> 1)] = v[4 * i + e];
      __threadfence();
      asm volatile("bar.sync 1, %0;" ::"n"(32 * kTiles) : "memory");  // the computing warps only
      if (warp == 0 && lane == 0) {
        unsigned* const c = a.counters + u / a.splits;
        const bool last = atomicAdd(c, 1u) == unsigned(a.splits - 1);
        if (last) *c = 0;  // (for the next launch: every range of this one has counted)
        split_last = last;
      }
      asm volatile("bar.sync 1, %0;" ::"n"(32 * kTiles) : "memory");
      if (!split_last) continue;
      __threadfence();
#pragma unroll
      for (int i = 0; i < kGroups; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int at = (8 * i + 2 * t + (e & 1)) * 128 + 8 * (e >> 1);
          float sum = 0.0f;
          for (int sp = 0; sp < a.splits; ++sp) sum += __ldcg(pi + sp * (P::kTokens * 128) + at);
          v[4 * i + e] = sum;
        }
    }
    const QuantGemmOut& o = a.out[wi];
    if (o.bias) {
      float b[2] = {0.0f, 0.0f};
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (r0 + 8 * h < rows) b[h] = o.bias[r0 + 8 * h];
#pragma unroll
      for (int i = 0; i < kVals; ++i) v[i] += b[(i >> 1) & 1];
    }
    // Every old value loaded before any store (the stores could alias them for the compiler).
    // Addresses from one pointer: element (token 8 i + 2 t + (e & 1), row 8 (e >> 1)) of the
    // thread's corner (token tok0, row r0) is at yb[...] (offsets < P::kTokens * rows: 32-bit).
    float* const yb = o.y + (tok0 * rows + r0);
    const int irows = int(rows);
    const bool row_in[2] = {r0 < rows, r0 + 8 < rows};
    float old[kVals];
#pragma unroll
    for (int i = 0; i < kGroups; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int dt = 8 * i + 2 * t + (e & 1);
        old[4 * i + e] = o.accumulate && row_in[e >> 1] && tok0 + dt < a.n ? yb[dt * irows + 8 * (e >> 1)] : 0.0f;
      }
#pragma unroll
    for (int i = 0; i < kGroups; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int dt = 8 * i + 2 * t + (e & 1);
        if (row_in[e >> 1] && tok0 + dt < a.n)
          yb[dt * irows + 8 * (e >> 1)] = o.accumulate ? old[4 * i + e] + v[4 * i + e] : v[4 * i + e];
      }
  }
#endif
}

// 1 when the code the driver runs for this device has the sm_90a kernels.
__global__ void wgmma_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

// cuTensorMapEncodeTiled from the driver (through the runtime: no link to libcuda), once.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) p = nullptr;
    (void)cudaGetLastError();
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 3-D tensor map of [outer][rows][inner] elements (strides in bytes), boxes of box[0..2]; false
// if the driver refuses it.
bool tensor_map_3d(CUtensorMap& m, CUtensorMapDataType type, const void* base, const cuuint64_t (&dims)[3],
                   const cuuint64_t (&strides)[2], const cuuint32_t (&box)[3], CUtensorMapSwizzle swizzle) {
  const auto encode = encode_tiled();
  if (!encode) return false;
  const cuuint32_t elem[3] = {1, 1, 1};
  return encode(&m, type, 3, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A 2-D tensor map of rows x inner elements (row stride `stride` bytes), boxes of box_inner x
// box_rows; false if the driver refuses it.
bool tensor_map_2d(CUtensorMap& m, CUtensorMapDataType type, const void* base, uint64_t inner, uint64_t rows,
                   uint64_t stride, uint32_t box_inner, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  const auto encode = encode_tiled();
  if (!encode) return false;
  const cuuint64_t dims[2] = {inner, rows}, strides[1] = {stride};
  const cuuint32_t box[2] = {box_inner, box_rows}, elem[2] = {1, 1};
  return encode(&m, type, 2, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Blocks per SM of each kernel on each device, once known (0: not yet asked).
std::mutex occupancy_mu;
std::map<std::pair<int, const void*>, int> occupancies;
int occupancy_known(int device, const void* kernel) {
  std::lock_guard<std::mutex> lock(occupancy_mu);
  const auto it = occupancies.find({device, kernel});
  return it == occupancies.end() ? 0 : it->second;
}
void remember_occupancy(int device, const void* kernel, int per_sm) {
  std::lock_guard<std::mutex> lock(occupancy_mu);
  occupancies[{device, kernel}] = per_sm;
}

}  // namespace

bool gemm_quant_available() {
  static std::mutex mu;
  static int known[64];  // per device: 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return false;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (known[dev] == 0) {
    int ok = 0, major = 0, minor = 0;
    int* flag = nullptr;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
        minor == 0 && cudaMalloc(&flag, sizeof(int)) == cudaSuccess) {
      if (cudaMemset(flag, 0, sizeof(int)) == cudaSuccess) {
        wgmma_probe_kernel<<<1, 1>>>(flag);
        if (cudaGetLastError() != cudaSuccess || cudaMemcpy(&ok, flag, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess)
          ok = 0;
      }
      cudaFree(flag);
    }
    (void)cudaGetLastError();
    known[dev] = ok == 1 && encode_tiled() ? 1 : 2;
  }
  return known[dev] == 1;
}

namespace {

// Whether a call of `parts` parts may take items of `tokens` tokens: a stage's rows of B
// (tokens x parts) of 32, 64 or 128, or with two parts 256.
bool item_tokens_allowed(int tokens, int parts) {
  if (tokens < 1 || tokens > 128) return false;
  const int cols = tokens * parts;
  return cols == 32 || cols == 64 || cols == 128 || (parts == 2 && cols == 256);
}

// A work item's tokens for n tokens in `parts` parts over `row_blocks` row blocks on `sms` SMs,
// for weights of at most max_rows rows.
// A stage's rows of B (parts x an item's tokens): the narrowest of 32 / 64 / 128 that holds the
// call's tokens and parts, so that a call of few tokens (a pool's 16-token frames, a prompt's last
// chunk) computes and stages less padding and keeps more weights in flight (H100, Llama-3-8B Q4_0,
// 16-token steps: 9.9 ms with 128 columns, docs/cuda.md v50); 128 for longer calls (64 tokens, or
// 128 with one part). With two parts, items of 128 tokens (256 rows: two stacked m64n128 products
// per k-step) where they take fewer rounds over the SMs by enough: each SM holds one block at
// either width, and a 128-token item takes about 1.6x a 64-token one's time (the stage's weights
// unpacked once for twice the tokens; H100, Llama-3-8B's products at 1024-2048 tokens: 1.40-1.71x),
// so half as many items win only where they take fewer rounds. On cuda_kernels --gemm-items
// (160-2048 tokens, Q4_0 / Q8_0) this picks the faster width for every product but q / k / v at
// 384 tokens (2.6% slower); pp512 1.22x, 256-token chunks 1.07x (docs/cuda.md v53). Not where a
// weight's rows exceed what the epilogue's 32-bit offsets address at 128 tokens.
constexpr int kWideItemCostNum = 8, kWideItemCostDen = 5;  // 1.6
int item_tokens(int64_t n, int parts, int64_t row_blocks, int sms, int64_t max_rows) {
  const int64_t cols = n * parts <= 32 ? 32 : n * parts <= 64 ? 64 : 128;
  if (parts != 2 || n <= 128 || max_rows > INT32_MAX / 128) return int(cols / parts);
  const int64_t rounds64 = div_up(div_up(n, 64) * row_blocks, sms);
  const int64_t rounds128 = div_up(div_up(n, 128) * row_blocks, sms);
  return rounds128 * kWideItemCostNum < rounds64 * kWideItemCostDen ? 128 : 64;
}

}  // namespace

cudaError_t gemm_quant(const WeightRef* w, const QuantGemmOut* out, int count, const uint16_t* x16, int parts,
                       const float* inv_scale, int64_t n, bool glu, Act act, cudaStream_t stream,
                       const QuantGemmSplit& split) {
  if (!gemm_quant_available()) return cudaErrorNotSupported;
  if (count < 1 || count > kGemvMaxOuts || (glu && count != 2) || (parts != 1 && parts != 2))
    return cudaErrorInvalidValue;
  const bool q4 = w[0].kind == WKind::kQ4_0;
  for (int i = 0; i < count; ++i)
    if (w[i].kind != w[0].kind || w[i].cols != w[0].cols || (glu && w[i].rows != w[0].rows))
      return cudaErrorInvalidValue;
  if ((!q4 && w[0].kind != WKind::kQ8_0) || w[0].cols % 32 != 0 || reinterpret_cast<uintptr_t>(x16) % 16 != 0)
    return cudaErrorInvalidValue;
  if (glu && (out[0].bias || out[0].accumulate)) return cudaErrorInvalidValue;
  if (split.item_tokens != 0 && !item_tokens_allowed(split.item_tokens, parts)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  QGemmArgs a{};
  a.count = count;
  a.k = w[0].cols;
  const int64_t chunks = quant_chunks(q4, a.k);
  a.n = n;
  a.inv_scale = inv_scale;
  const uint64_t row_quants = uint64_t(chunks) * 512;
  using Q4 = Stage<true, 128>;  // (the weights' part of a stage is the same at every width)
  using Q8 = Stage<false, 128>;
  const uint64_t row_scales = uint64_t(chunks) * (q4 ? Q4::kScaleBytes : Q8::kScaleBytes);
  const uint32_t quant_words = q4 ? Q4::kQuantWords : Q8::kQuantWords;  // (a stage's box)
  const uint32_t scale_words = q4 ? Q4::kScaleWords : Q8::kScaleWords;
  const int block_tiles = glu ? kTiles / 2 : kTiles;  // a block's tiles of one weight
  int64_t total_blocks = 0, max_rows = 0;
  for (int i = 0; i < count; ++i) {
    max_rows = std::max(max_rows, w[i].rows);
    const int64_t tiles = div_up(w[i].rows, 16);
    a.out[i] = out[glu ? 0 : i];
    a.rows[i] = w[i].rows;
    if (!glu || i == 0) total_blocks += div_up(tiles, block_tiles);
    a.block_end[i] = unsigned(total_blocks);
    if (w[i].rows == 0) continue;  // (no blocks: its maps are never read)
    if (!tensor_map_2d(a.tq[i], CU_TENSOR_MAP_DATA_TYPE_UINT32, w[i].data, row_quants / 4, uint64_t(tiles), row_quants,
                       quant_words, uint32_t(block_tiles), CU_TENSOR_MAP_SWIZZLE_NONE) ||
        !tensor_map_2d(a.ts[i], CU_TENSOR_MAP_DATA_TYPE_UINT32, w[i].scales, row_scales / 4, uint64_t(tiles), row_scales,
                       scale_words, uint32_t(block_tiles), CU_TENSOR_MAP_SWIZZLE_NONE))
      return cudaErrorInvalidValue;
  }
  if (total_blocks == 0) return cudaSuccess;
  DeviceLimits limits;
  if (cudaError_t e = device_limits(limits); e != cudaSuccess) return e;
  const int sms = limits.sms;
  const int tokens =
      split.item_tokens != 0 ? split.item_tokens : item_tokens(n, parts, total_blocks, sms, max_rows);
  const int cols = tokens * parts;  // a stage's rows of B
  if (max_rows > INT32_MAX / tokens) return cudaErrorInvalidValue;  // (the epilogue's offsets are 32-bit)
  if (!tensor_map_3d(a.tx, CU_TENSOR_MAP_DATA_TYPE_UINT16, x16, {uint64_t(a.k), uint64_t(n), uint64_t(parts)},
                     {uint64_t(a.k) * 2, uint64_t(n) * uint64_t(a.k) * 2},
                     {kK, cuuint32_t(tokens), cuuint32_t(parts)}, CU_TENSOR_MAP_SWIZZLE_128B))
    return cudaErrorInvalidValue;
  const int64_t items = div_up(n, tokens) * total_blocks, stages = div_up(a.k, kK);
  if (split.item_tokens_used) *split.item_tokens_used = tokens;
  a.partial = split.partial;
  a.counters = split.counters;
  auto run = [&](auto kernel, int stage_bytes, int n_stages, int exchange_bytes) -> cudaError_t {
    const size_t smem = size_t(n_stages) * size_t(stage_bytes) + (glu ? exchange_bytes : 0) + 1024;
    // The kernel's shared memory, and the carveout that lets two blocks fit at 32 columns (per
    // launch: the limits are per device, and host calls are nothing beside a prefill GEMM).
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        e != cudaSuccess)
      return e;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             int(cudaSharedmemCarveoutMaxShared));
        e != cudaSuccess)
      return e;
    // Blocks of this kernel an SM holds (two for Q4_0 at 32 columns, blocks_per_sm), asked once
    // per kernel and device.
    int per_sm = occupancy_known(limits.device, reinterpret_cast<const void*>(kernel));
    if (per_sm == 0) {
      if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
          e != cudaSuccess)
        return e;
      if (per_sm < 1) return cudaErrorInvalidConfiguration;  // (a ring that fits no SM: a bug)
      remember_occupancy(limits.device, reinterpret_cast<const void*>(kernel), per_sm);
    }
    const int64_t slots = int64_t(sms) * per_sm;
    // Split K where the items would leave more than half the block slots idle (few tokens over
    // few rows: Llama-3-8B's wo and down have 32 row blocks, q / k / v 48), into as many ranges
    // as fill the slots, at most 8, of at least 8 stages, while the scratch holds their sums
    // (items of at most 64 tokens). (Not glu: gate / up has 3.5x wo's row blocks.)
    a.splits = 1;
    if (!glu && tokens <= 64 && split.partial && split.counters && items <= split.counter_count &&
        items * 2 <= slots) {
      const uint64_t item_floats = uint64_t(tokens) * 128;
      a.splits = int(std::min<int64_t>({8, slots / items, stages / 8,
                                        int64_t(split.partial_floats / (item_floats * uint64_t(items)))}));
      a.splits = std::max(a.splits, 1);
    }
    if (split.used) *split.used = a.splits;
    if (split.blocks_per_sm) *split.blocks_per_sm = per_sm;
    // Persistent blocks, as many as the SMs hold, each looping over work items.
    const dim3 grid(unsigned(std::min<int64_t>(items * a.splits, slots)));
    SHOAL_TRY_LAUNCH(launch(kernel, grid, kThreads, smem, stream, a));
    return cudaGetLastError();
  };
  auto pick = [&](auto q4c, auto parts_c, auto cols_c) -> cudaError_t {
    constexpr bool kQ4 = decltype(q4c)::value;
    constexpr int kP = decltype(parts_c)::value, kN = decltype(cols_c)::value;
    using P = Parts<kP, kN>;
    using S = Stage<kQ4, kN>;
    static_assert(P::kTokens * kP == kN && P::kGroups * 8 == P::kTokens, "8-token groups of an item");
    static_assert(S::kQuantWords == Stage<kQ4, 128>::kQuantWords && S::kScaleWords == Stage<kQ4, 128>::kScaleWords,
                  "the tensor maps' boxes are the same at every width");
    constexpr int bytes = S::kBytes, ex = P::kExchangeBytes;
    constexpr int st = ring_stages<kQ4, false, kP, kN>(), st_glu = ring_stages<kQ4, true, kP, kN>();
    if (!glu) return run(gemm_quant_kernel<kQ4, false, Act::kSilu, kP, kN>, bytes, st, ex);
    switch (act) {
      case Act::kSilu:
        return run(gemm_quant_kernel<kQ4, true, Act::kSilu, kP, kN>, bytes, st_glu, ex);
      case Act::kGeluTanh:
        return run(gemm_quant_kernel<kQ4, true, Act::kGeluTanh, kP, kN>, bytes, st_glu, ex);
      case Act::kGeluErf:
        return run(gemm_quant_kernel<kQ4, true, Act::kGeluErf, kP, kN>, bytes, st_glu, ex);
    }
    return cudaErrorInvalidValue;
  };
  auto by_cols = [&](auto q4c, auto parts_c) -> cudaError_t {
    if (cols == 32) return pick(q4c, parts_c, std::integral_constant<int, 32>{});
    if (cols == 64) return pick(q4c, parts_c, std::integral_constant<int, 64>{});
    if constexpr (decltype(parts_c)::value == 2)
      if (cols == 256) return pick(q4c, parts_c, std::integral_constant<int, 256>{});
    return pick(q4c, parts_c, std::integral_constant<int, 128>{});
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (parts == 1) return q4 ? by_cols(std::true_type{}, One{}) : by_cols(std::false_type{}, One{});
  return q4 ? by_cols(std::true_type{}, Two{}) : by_cols(std::false_type{}, Two{});
}

}  // namespace shoal::cuda
