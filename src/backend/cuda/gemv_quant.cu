// GEMV (n <= 8 tokens) for Q8_0 and Q4_0 weights on the f16 tensor cores (mma.m16n8k16 with
// f32 accumulation), with the fusions of gemv.cu (input RMSNorm, several products, gate+up+act,
// bias, residual add).
//
// Why tensor cores at batch 1: converting each quantized value to f32 and multiplying on the
// CUDA cores took about 3.5 instructions per weight, which capped Q4_0 at half the memory
// bandwidth. Here a Q4_0 value costs ~1.1 instructions to become an exact f16 (a nibble placed
// under the exponent of 1024 with one lop3 per two values, then one f16x2 subtract or fma), and
// the MMA does the products: 16 rows x 16 columns per instruction.
//
// Exactness: the weight values q - 8 (Q4_0) and q (Q8_0) are small integers, exact in f16. The
// activations are split into x = hi + lo, two f16 parts carrying 22 significant bits, placed
// as two columns of the MMA's B operand (columns 2j and 2j + 1 for token j; 4 tokens per MMA,
// a second MMA for tokens 4..7). The f16 products are exact and accumulate in f32; each 32-value
// block's f32 sum is multiplied by the block scale. Before the split, each block of 32
// activations (per token) is scaled by a power of two that puts its max |x| in [2^14, 2^15): no
// f16 overflow, and lo stays clear of the f16 subnormals; the scale is undone with the block
// scale. So the result is the f32 dot product to within ~2^-22 relative (the tests compare with
// the CPU reference at 2e-5). Limits (the power of two is clamped to 2^+-100): a block whose max
// |x| is above 2^115 overflows to inf, one below ~2^-86 loses precision progressively, an inf
// input gives NaN (the reference gives inf or NaN).
//
// Work split: a unit is RT tiles of 16 rows over all columns, computed by the 8 warps of a
// block: warp w takes the chunks w, w + 8, ... (cuda_util.h: one 16-byte load per lane per tile
// and chunk). The block writes the activation fragments (each lane's two B registers of two
// k-steps as one 16-byte word) into shared memory first; when they fit (one stage) it does so
// once and then loops over units (as many blocks as fit at once); otherwise it handles one unit
// in stages of columns. The RMSNorm's sum of squares is taken while writing the fragments.
// Weights stream through a ring of shared memory per warp with cp.async, by pairs of chunks,
// up to 8 loads per lane in flight while a pair is computed, on across stages and units: the
// loads stay in flight while fragments are built and partial sums reduced, hold no registers,
// and cost a pointer step and a counter per pair (register double buffers cost ~40 warp
// instructions per chunk in index arithmetic and checks, and the kernel is bound by
// instructions per byte as much as by bytes). The first are issued before the wait on the
// previous kernel (PDL): weights never depend on it. Partial sums are reduced in a fixed order:
// results are deterministic.
//
// Fragment handoff (one token; GemvOpts::frags_out / frags_in): a gate / up GLU also writes its
// output in fragment form to global memory, each block taking the two tiles of a 32-row word
// one after the other (the word's power-of-two scale needs all 32 values), and the down GEMV
// that reads it next copies them with cp.async instead of building them from x (H200,
// Llama-3-8B decode step: Q8_0 2.65 -> 2.58 ms, Q4_0 1.96 -> 1.95; docs/cuda.md v24).
// Twin: ref::matmul (src/backend/cpu/ref_ops.cc); tests: tests/cuda/cuda_matmul_test.cc,
// tests/cuda/cuda_frags_test.cc (the handoff).
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <type_traits>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant_mma.cuh"

namespace shoal::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Dynamic shared memory per block, at most: the weight rings and a stage of activation fragments
// (one token's fragments of a 14336-value row fit beside the rings); lowered to what the device
// allows (sm_86 / sm_89: 99 KiB per block in all). Two blocks fit on an SM of sm_90 (228 KiB);
// on sm_80 (164 KiB) two fit while the fragments stay under ~30 KiB (one token, ~7k columns;
// a 3-slot ring is taken only where it keeps as many blocks per SM as 2 slots, launch_quant).
constexpr int64_t kSmemBytes = 110 * 1024;

struct QSeg {
  const uint4* w[2];  // quants of gate (or the only weight) and up
  const void* s[2];   // their scales
  int64_t rows, tiles;
  const float* bias;  // [rows] or null
  float* y;           // [n, rows]
  float* y2;          // kSplit: the second column half's partial [rows]
  unsigned block_end;
};

struct QArgs {
  QSeg seg[kGemvMaxOuts];
  int n_segs;
  int64_t cols;
  int64_t units;         // RT tiles each, over all segments (seg.block_end counts units); kSplit: twice, halves
  int64_t chunks;        // per row (cuda_util.h)
  int64_t stage_chunks;  // chunks whose activation fragments fit in one stage
  int slots;             // pair slots of each warp's weight ring: Shape::kMaxSlots or 2
  const float* x;        // [n, cols]
  int n;
  const float* norm_w;  // [cols] or null
  float eps;
  bool accumulate;
  bool early_epilogue;  // bias and old y may be read before the PDL wait (GemvOpts)
  Act act;
  // GemvOpts::frags_in / frags_out (one token): fragments [word][kLanes] and 1 / scales [word]
  // (gemv_frag_bytes). With frag_out a block takes the units (tiles) of a 32-row word in turn,
  // 2 b, 2 b + 1, then 2 (b + grid), ... (one segment, RT == 1).
  const uint4* frag_in;
  const float* inv_in;
  uint4* frag_out;
  float* inv_out;
  bool split;      // GemvOpts::split_k (host side: picks the kSplit instance)
  float* ss_out;   // kSplit with norm_w: the halves' sums of squares [2] (GemvOpts::split_ss)
};

// The activation fragments of one lane column t of a 32-value word (a quant block) for one token
// (the B operand words of its two k-steps): v holds the lane's 8 values, pairs at 2t + 8p
// (p = 0..3). The 4 lanes of the word (t = 0..3, adjacent lanes of one quad, all calling) share
// its power-of-two scale, which puts max |x| of the 32 values in [2^14, 2^15): no f16 overflow,
// lo clear of the subnormals. Writes the f16 hi and lo parts (x * scale = hi + lo); returns
// 1 / scale. The same function for fragments built by a GEMV from its input and for those a
// GEMV writes of its output (GemvOpts::frags_out), so both are the same bit for bit.
__device__ __forceinline__ float fragment_word(const float2 (&v)[4], int lane, uint4& hi4, uint4& lo4) {
  float mx = 0.0f;
#pragma unroll
  for (int p = 0; p < 4; ++p) mx = fmaxf(mx, fmaxf(fabsf(v[p].x), fabsf(v[p].y)));
  const unsigned quad = 0xfu << (lane & ~3);
  mx = fmaxf(mx, __shfl_xor_sync(quad, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(quad, mx, 2));
  // mx = f * 2^e with f in [0.5, 1) (e from the exponent bits; 0 for zero, inf, NaN); the scale
  // 2^(15 - e) and its inverse are built from exponent bits too.
  const int eb = int(__float_as_uint(mx) >> 23) & 0xff;
  const int e = (eb == 0 || eb == 0xff) ? 0 : eb - 126;
  const int sh = max(-100, min(100, 15 - e));
  const float scale = __uint_as_float(uint32_t(127 + sh) << 23);
  uint32_t hi[4], lo[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const float x0 = v[p].x * scale, x1 = v[p].y * scale;
    hi[p] = half2_bits(x0, x1);
    const float2 h = bits_half2(hi[p]);
    lo[p] = half2_bits(x0 - h.x, x1 - h.y);
  }
  hi4 = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  lo4 = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  return __uint_as_float(uint32_t(127 - sh) << 23);
}

// (mma(), half2_bits(), cp_async(): mma.cuh. Each lane reads back only the ring words it copied
// itself, so cp.async.wait_group alone makes the data visible: no barrier.)

template <bool kQ4, int S, int RT, int NT>
struct Shape {
  static constexpr int kSets = (NT + 3) / 4;            // MMAs per k-step (4 tokens each)
  static constexpr int kLanes = 8 * (NT < 4 ? NT : 4);  // lanes of a set whose B registers are stored
  static constexpr int kWords = kQ4 ? 2 : 1;            // 16-byte fragment words per chunk (2 k-steps each)
  static constexpr int kLoads = S * RT;                 // 16-byte weight loads per lane and chunk
  // Slots of a warp's ring, a pair of chunks each (the chunks c and c + 8 of a warp): at most
  // 4 with one load per lane and chunk and NT < 4 (one weight, one tile, n <= 2 tokens); else
  // 3 for Q8_0 (gate+up, two-tile units as in LM heads, n >= 3) and 2 for Q4_0. 2 also when the
  // row needs several stages, or would with more slots (one stage, looping over units, beats a
  // deeper ring), and for 3 when it would hold fewer blocks per SM (launch_quant). While a pair
  // is computed, the other slots' (slots - 1) * 2 * kLoads loads are in flight. (H200,
  // Llama-3-8B decode step, with slots - 1 pairs issued before the PDL wait: Q8_0 with 3 slots
  // 0.8% faster than with 2 or 4; Q4_0 gate+up no faster with 3, and its 4-token GEMV slower.
  // H100, with every slot filled first (v47): Q4_0 with 3 slots for gate+up and the LM head
  // 2% slower.)
  static constexpr int kMaxSlots = NT >= 4 || kLoads > 1 ? (kQ4 ? 2 : 3) : 4;
  // The ring slot after slot i of a ring of `slots` (kMaxSlots or 2): a mask for powers of two
  // (the Q4_0 decode step was 1% slower with the compare in every kernel).
  __device__ static int next_slot(int i, int slots) {
    if constexpr (kMaxSlots == 3)
      return i + 1 == slots ? 0 : i + 1;
    else
      return (i + 1) & (slots - 1);
  }
  static constexpr int64_t kChunkBytes = int64_t(kWords) * kSets * kLanes * 16;
  using Scale = std::conditional_t<kQ4, uint2, uint32_t>;  // a lane's scales of one chunk
  // The rings of all warps: [warp][slot][chunk of the pair][load][lane] quants (uint4), then
  // the same of scales.
  static constexpr int64_t ring_quants(int slots) { return int64_t(kWarps) * slots * 2 * kLoads * 32; }
  static constexpr int64_t ring_bytes(int slots) { return ring_quants(slots) * int64_t(16 + sizeof(Scale)); }
};

// kFrags (one token, one tile per unit): a GLU (S == 2) writes its output as fragments too, with
// units in word pairs (frag_out); a single product (S == 1) copies its input fragments (frag_in).
// kSplit (GemvOpts::split_k; Q8_0 only, one token, one weight, one tile per unit, no bias): unit
// u is half u & 1 of the columns of tile unit u >> 1; the grid is even, so a block keeps one half
// (blockIdx.x & 1) and builds only its fragments. It stores the partial sums as they are (no
// 1 / rms), and blocks 0 and 1 store their half's sum of squares (the RMSNorm's) for the reader.
// Separate instances, so the other kernels carry none of that code.
template <bool kQ4, int S, int RT, int NT, bool kFrags = false, bool kSplit = false>
__global__ void __launch_bounds__(kThreads, 2) gemv_quant_kernel(const QArgs a) {
  static_assert(!kFrags || (RT == 1 && NT == 1), "fragment handoffs: one token, one tile per unit");
  static_assert(!kSplit || (S == 1 && RT == 1 && NT == 1 && !kFrags && !kQ4),
                "split-K: Q8_0, one token, one weight, one tile");
  constexpr bool kOut = kFrags && S == 2, kIn = kFrags && S == 1;
  using Sh = Shape<kQ4, S, RT, NT>;
  using Scale = typename Sh::Scale;
  constexpr int kSets = Sh::kSets, kLanes = Sh::kLanes, kWords = Sh::kWords, kLoads = Sh::kLoads;
  const int slots = a.slots;
  extern __shared__ uint4 smem[];  // weight ring, scale ring, fragments, inv_scale
  Scale* ring_s_all = reinterpret_cast<Scale*>(smem + Sh::ring_quants(slots));
  uint4* frag = reinterpret_cast<uint4*>(smem + Sh::ring_bytes(slots) / 16);  // [stage chunk][word][set][kLanes]
  float* inv_scale = reinterpret_cast<float*>(frag + a.stage_chunks * kWords * kSets * kLanes);  // [word][NT]
  __shared__ float red[2][kWarps][S][RT * 16][NT];  // by unit parity: one barrier per unit
  __shared__ float sq[kWarps][NT];
  __shared__ float word_out[kOut ? 32 : 1][NT];  // a word's outputs (frag_out): tiles 2w, 2w + 1

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // The block's columns: chunks [c_begin, c_end) (kSplit: one half, by the block's parity).
  const int half = kSplit ? int(blockIdx.x & 1u) : 0;
  const int64_t c_begin = kSplit ? half * (a.chunks / 2) : 0, c_end = kSplit ? c_begin + a.chunks / 2 : a.chunks;

  // The unit (RT tiles of one segment) u (kSplit: half u & 1 of tile unit u >> 1).
  auto unit_of = [&](int64_t u_in, QSeg& sg, int64_t& tile0) {
    const int64_t u = kSplit ? u_in >> 1 : u_in;
    int64_t base = 0;
    sg = a.seg[0];
#pragma unroll
    for (int i = 1; i < kGemvMaxOuts; ++i)
      if (i < a.n_segs && u >= a.seg[i - 1].block_end) {
        base = a.seg[i - 1].block_end;
        sg = a.seg[i];
      }
    tile0 = (u - base) * RT;
  };
  // The EpilogueIn of output element threadIdx.x = rl * NT + j (row rl of the unit, token j).
  static_assert(RT * 16 * NT <= kThreads, "a thread per output element of a unit");
  auto unit_epilogue = [&](int64_t u) {
    QSeg sg;
    int64_t tile0;
    unit_of(u, sg, tile0);
    const int rl = int(threadIdx.x) / NT, j = int(threadIdx.x) % NT;
    const int64_t row = tile0 * 16 + rl;
    if (int(threadIdx.x) >= RT * 16 * NT || row >= sg.rows || j >= a.n) return EpilogueIn{};
    return load_epilogue(kSplit ? nullptr : sg.bias, row, kSplit ? false : a.accumulate,
                         sg.y + int64_t(j) * sg.rows + row);
  };

  // The warp's weight stream: chunks warp, warp + 8, ... (m_chunks of them) of each of the
  // block's units in turn, by pairs (c, c + 8), into this lane's ring slots: every slot is
  // filled before the PDL wait, and a slot is refilled (with the pair `slots` ahead) as soon as
  // its pair is computed. It runs on across stages and units, so the loads stay in flight while
  // fragments are built and partial sums reduced. (A 4-slot ring holds a warp's whole share of
  // a one-tile unit of 4096 Q4_0 columns, so the Llama-3-8B wo and q/k/v blocks have all their
  // first unit's weights loading before the previous kernel ends; Q8_0 half of it.)
  const int m_chunks = warp < c_end - c_begin ? int((c_end - c_begin - warp + kWarps - 1) / kWarps) : 0;
  constexpr int kPairLoads = 2 * kLoads;
  uint4* ring_w = smem + warp * slots * kPairLoads * 32 + lane;  // + ((slot * 2 + h) * kLoads + load) * 32
  Scale* ring_s = ring_s_all + warp * slots * kPairLoads * 32 + lane;
  const uint4* pw[kLoads];  // the next pair's quants and scales (this lane's)
  const Scale* psc[kLoads];
  // The block's units: b, b + grid, ...; with kOut (pairs) 2 b, 2 b + 1, 2 (b + grid), ...
  const int64_t first_unit = kOut ? 2 * int64_t(blockIdx.x) : int64_t(blockIdx.x);
  auto next_unit = [&](int64_t u) {
    if constexpr (kOut)
      return (u & 1) ? u - 1 + 2 * int64_t(gridDim.x) : u + 1;
    else
      return u + int64_t(gridDim.x);
  };
  int64_t p_unit = first_unit;
  int p_left = 0, p_slot = 0;  // chunks of p_unit still to copy; ring slot of the next pair
  auto point = [&](int64_t u) {
    QSeg sg;
    int64_t tile0;
    unit_of(u, sg, tile0);
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const int64_t tile = min(tile0 + r, sg.tiles - 1);  // spare tiles redo the last; not stored
        pw[s * RT + r] = sg.w[s] + (tile * a.chunks + c_begin + warp) * 32 + lane;
        psc[s * RT + r] = static_cast<const Scale*>(sg.s[s]) + (tile * a.chunks + c_begin + warp) * 8 + g;
      }
    p_left = m_chunks;
  };
  auto issue = [&]() {  // one commit group per call (empty past the end), so wait_group counts pairs
    if (p_left > 0) {
      const bool second = p_left > 1;
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        cp_async(ring_w + (p_slot * kPairLoads + l) * 32, pw[l], std::integral_constant<int, 16>{});
        cp_async(ring_s + (p_slot * kPairLoads + l) * 32, psc[l], std::integral_constant<int, int(sizeof(Scale))>{});
        if (second) {
          cp_async(ring_w + (p_slot * kPairLoads + kLoads + l) * 32, pw[l] + kWarps * 32,
                   std::integral_constant<int, 16>{});
          cp_async(ring_s + (p_slot * kPairLoads + kLoads + l) * 32, psc[l] + kWarps * 8,
                   std::integral_constant<int, int(sizeof(Scale))>{});
        }
        pw[l] += 2 * kWarps * 32;
        psc[l] += 2 * kWarps * 8;
      }
      p_left -= second ? 2 : 1;
      if (p_left == 0) {
        p_unit = next_unit(p_unit);
        if (p_unit < a.units) point(p_unit);
      }
    }
    cp_async_commit();
    p_slot = Sh::next_slot(p_slot, slots);
  };
  if (p_unit < a.units) point(p_unit);
#pragma unroll 1
  for (int i = 0; i < slots; ++i) issue();  // before the wait: weights never depend on it
  EpilogueIn e;  // of the unit: loaded at its start (the first one's before the wait, if allowed)
  if (a.early_epilogue && first_unit < a.units) e = unit_epilogue(first_unit);
  pdl_prologue();

  float ss[NT];  // this thread's share of each token's sum of squares (RMSNorm)
#pragma unroll
  for (int j = 0; j < NT; ++j) ss[j] = 0.0f;
  // Lanes past the stored ones (B columns of no token) read a stored lane's fragments, and
  // lanes of tokens past n read what is there: their columns of the products are never used.
  // Likewise each lane's token for the 1 / scale of its columns is clamped to a stored one.
  int inv_j[kSets];
#pragma unroll
  for (int q = 0; q < kSets; ++q) inv_j[q] = min(4 * q + t, NT - 1);
  const bool single_stage = a.stage_chunks >= c_end - c_begin;
  bool built = false;  // the fragments of the only stage are in shared memory
  int parity = 0, c_slot = 0;
  for (int64_t unit = first_unit; unit < a.units; unit = next_unit(unit)) {
    QSeg sg;
    int64_t tile0;
    unit_of(unit, sg, tile0);
    if (unit != first_unit || !a.early_epilogue) e = unit_epilogue(unit);
    float acc[S][RT][kSets][4];
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int q = 0; q < kSets; ++q)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[s][r][q][i] = 0.0f;

    for (int64_t c0 = c_begin; c0 < c_end; c0 += a.stage_chunks) {
      const int64_t c1 = min(c0 + a.stage_chunks, c_end);
      if (kIn && (!built || !single_stage)) {
        // This warp's chunks of [c0, c1) as the GEMV before wrote them (frags_out): c0 + warp +
        // kWarps m, each kE fragment words and kEI 1 / scales, in the layout of `frag` and
        // `inv_scale` (stage-local).
        __syncwarp();  // the previous stage's fragments are read
        constexpr int kE = kWords * kSets * kLanes, kEI = kWords * NT;
        const int m = int((c1 - c0 - warp + kWarps - 1) / kWarps);
        // per: elements per chunk (a power of two); dst / src: the stage's first chunk; element i
        // of the warp's chunks is at at(i, per) of both.
        auto at = [&](int i, int per) { return (warp + kWarps * (i / per)) * per + i % per; };
        auto copy = [&](auto* dst, const auto* src, auto per) {
          for (int i = lane; i < m * per; i += 32)
            cp_async(dst + at(i, per), src + at(i, per), std::integral_constant<int, int(sizeof(*dst))>{});
        };
        // Q8_0: plain loads and stores, which wait for the fragments alone (cp.async's
        // wait_group 0 waits for every weight pair issued before them too; v47-v48: Q8_0 step
        // 0.7-1% faster; Q4_0 no different, so it keeps cp.async).
        auto load_copy = [&](auto* dst, const auto* src, auto per) {
          constexpr int kU = 8;  // loads per lane in flight
          for (int i0 = lane; i0 < m * per; i0 += 32 * kU) {
            std::remove_cv_t<std::remove_reference_t<decltype(*src)>> v[kU];
#pragma unroll
            for (int u = 0; u < kU; ++u) {
              const int i = i0 + 32 * u;
              if (i < m * per) v[u] = src[at(i, per)];
            }
#pragma unroll
            for (int u = 0; u < kU; ++u) {
              const int i = i0 + 32 * u;
              if (i < m * per) dst[at(i, per)] = v[u];
            }
          }
        };
        if constexpr (!kQ4) {
          load_copy(frag, a.frag_in + c0 * kE, std::integral_constant<int, kE>{});
          load_copy(inv_scale, a.inv_in + c0 * kEI, std::integral_constant<int, kEI>{});
        } else {
          copy(frag, a.frag_in + c0 * kE, std::integral_constant<int, kE>{});
          copy(inv_scale, a.inv_in + c0 * kEI, std::integral_constant<int, kEI>{});
          cp_async_commit();
          cp_async_wait<0>();  // (the weight pairs in flight too)
        }
        __syncwarp();
      } else if (!built || !single_stage) {
        __syncwarp();  // the previous stage's fragments are read
        // The activation fragments of this warp's chunks of [c0, c1) (c0 is a multiple of
        // kWarps, so they are c0 + warp + kWarps m, and no other warp reads them). An item is
        // one token, one lane column t and one 32-column word (a quant block): it writes the hi
        // and the lo lanes. The 4 items of a word are adjacent lanes; they share the word's
        // power-of-two scale, which puts max |x| of the 32 values in [2^14, 2^15): no f16
        // overflow, lo clear of the subnormals.
        // Items in 32-bit indices (gemv_quant checks cols < 2^30; 64-bit ones took ~200
        // instructions per warp between the PDL wait and the first x load, v47).
        const int items = int((c1 - c0 - warp + kWarps - 1) / kWarps) * kWords * NT * 4;
        constexpr int kG = 4;  // items per lane whose activations are loaded together
        for (int it0 = lane; it0 < items; it0 += 32 * kG) {
          // Item it0 + 32 gi: lane column t (= it & 3), token js[gi], stage-local word words[gi].
          float2 v[kG][4];
          float sumsq[kG];
          int js[kG], words[kG];
          bool used[kG];
#pragma unroll
          for (int gi = 0; gi < kG; ++gi) {
            const int it = it0 + 32 * gi;
            const int j = (it >> 2) % NT, wm = it / (4 * NT);  // the warp's word index
            const int word = (warp + kWarps * (wm / kWords)) * kWords + wm % kWords;
            const int k = (int(c0) * kWords + word) * 32 + 2 * t;
            js[gi] = j;
            words[gi] = word;
            used[gi] = it < items && j < a.n;  // a real item of a real token (whole quads)
            const bool live = used[gi] && k < a.cols;
#pragma unroll
            for (int p = 0; p < 4; ++p)  // pairs at k + 0, + 8, + 16, + 24
              v[gi][p] = live ? *reinterpret_cast<const float2*>(a.x + int64_t(j) * a.cols + k + 8 * p)
                              : make_float2(0.0f, 0.0f);
            sumsq[gi] = 0.0f;
            if (a.norm_w && live) {
#pragma unroll
              for (int p = 0; p < 4; ++p) {
                sumsq[gi] = fmaf(v[gi][p].x, v[gi][p].x, fmaf(v[gi][p].y, v[gi][p].y, sumsq[gi]));
                const float2 nw = *reinterpret_cast<const float2*>(a.norm_w + k + 8 * p);
                v[gi][p].x *= nw.x;
                v[gi][p].y *= nw.y;
              }
            }
          }
#pragma unroll
          for (int gi = 0; gi < kG; ++gi) {
            if (!used[gi]) continue;
            const int j = js[gi];
            const int word = words[gi];
#pragma unroll
            for (int jj = 0; jj < NT; ++jj)  // (ss[j] would put ss in local memory)
              if (jj == j) ss[jj] += sumsq[gi];
            uint4* f = frag + (word * kSets + j / 4) * kLanes + 8 * (j % 4) + t;
            const float inv = fragment_word(v[gi], lane, f[0], f[4]);
            if (t == 0) inv_scale[word * NT + j] = inv;
          }
        }
        __syncwarp();
      }

      const uint4* fw = frag + int64_t(warp) * kWords * kSets * kLanes + lane % kLanes;  // chunk c's fragments
      const float* iw = inv_scale + int64_t(warp) * kWords * NT;
      constexpr int kFragStep = kWarps * kWords * kSets * kLanes, kInvStep = kWarps * kWords * NT;
#pragma unroll 1
      for (int c = int(c0) + warp; c < int(c1); c += 2 * kWarps) {
        if (Sh::kMaxSlots > 2 && slots == Sh::kMaxSlots)  // the pair (c, c + 8) has landed
          cp_async_wait<Sh::kMaxSlots - 1>();
        else
          cp_async_wait<1>();
        // Without a second chunk (an odd count in a unit's last stage) the pair computes the first
        // one's fragments against whatever the slot holds (finite: every code is a finite f16)
        // with scale 0.
        const bool second = c + kWarps < int(c1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4* fh = fw + (h && second ? kFragStep : 0);
          const float* ih = iw + (h && second ? kInvStep : 0);
          uint4 b[kWords][kSets];
          float inv[kWords][kSets];  // 1 / scale of token 4q + t's word
#pragma unroll
          for (int wd = 0; wd < kWords; ++wd)
#pragma unroll
            for (int q = 0; q < kSets; ++q) {
              b[wd][q] = fh[(wd * kSets + q) * kLanes];
              inv[wd][q] = ih[wd * NT + inv_j[q]];
            }
#pragma unroll
          for (int s = 0; s < S; ++s)
#pragma unroll
            for (int r = 0; r < RT; ++r) {
              const int at = (c_slot * kPairLoads + h * kLoads + s * RT + r) * 32;
              const uint4 w = ring_w[at];
              const Scale sc = h && !second ? Scale{} : ring_s[at];
#pragma unroll
              for (int blk = 0; blk < kWords; ++blk) {  // the chunk's 32-value blocks
                uint32_t a0[4], a1[4];
                if constexpr (kQ4) {
                  q4_fragment(blk ? w.z : w.x, a0);
                  q4_fragment(blk ? w.w : w.y, a1);
                } else {
                  q8_fragment(w.x, w.y, a0);
                  q8_fragment(w.z, w.w, a1);
                }
                uint32_t dbits;
                if constexpr (kQ4)
                  dbits = blk ? sc.y : sc.x;
                else
                  dbits = sc;
                const float2 d = bits_half2(dbits);  // rows g, g + 8
#pragma unroll
                for (int q = 0; q < kSets; ++q) {
                  float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                  mma(c4, a0, b[blk][q].x, b[blk][q].y);
                  mma(c4, a1, b[blk][q].z, b[blk][q].w);
                  const float d0 = d.x * inv[blk][q], d1 = d.y * inv[blk][q];
                  acc[s][r][q][0] = fmaf(d0, c4[0], acc[s][r][q][0]);
                  acc[s][r][q][1] = fmaf(d0, c4[1], acc[s][r][q][1]);
                  acc[s][r][q][2] = fmaf(d1, c4[2], acc[s][r][q][2]);
                  acc[s][r][q][3] = fmaf(d1, c4[3], acc[s][r][q][3]);
                }
              }
            }
        }
        issue();  // into the slot just computed (p_slot == c_slot)
        fw += 2 * kFragStep;
        iw += 2 * kInvStep;
        c_slot = Sh::next_slot(c_slot, slots);
      }
    }
    built = true;

    // Lane (g, t) of set q holds token 4q + t: hi and lo columns of rows g and g + 8.
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int q = 0; q < kSets; ++q) {
          const int j = 4 * q + t;
          if (j < NT) {
            red[parity][warp][s][r * 16 + g][j] = acc[s][r][q][0] + acc[s][r][q][1];
            red[parity][warp][s][r * 16 + g + 8][j] = acc[s][r][q][2] + acc[s][r][q][3];
          }
        }
    if (a.norm_w && unit == first_unit) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float v = warp_sum(ss[j]);
        if (lane == 0) sq[warp][j] = v;
      }
    }
    __syncthreads();
    if constexpr (kSplit) {  // the half's sum of squares, once (every block of a half has the same)
      if (a.norm_w && unit == first_unit && blockIdx.x < 2 && threadIdx.x == 0) {
        float q = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) q += sq[w][0];
        a.ss_out[half] = q;
      }
    }
    {
      const int i = threadIdx.x, rl = i / NT, j = i % NT;  // (a thread per output element)
      const int64_t row = tile0 * 16 + rl;
      if (i < RT * 16 * NT && row < sg.rows && j < a.n) {
        // (kSplit: the partial sum alone; the reader adds the halves and applies 1 / rms.)
        float* y = (half ? sg.y2 : sg.y) + int64_t(j) * sg.rows + row;
        const float out = reduce_store<S, kWarps>(&red[parity][0][0][rl][j], S * RT * 16 * NT, RT * 16 * NT,
                                                  a.norm_w && !kSplit ? &sq[0][j] : nullptr, NT, a.cols, a.eps,
                                                  a.act, kSplit ? nullptr : sg.bias, row, kSplit ? false : a.accumulate,
                                                  y, e);
        if constexpr (kOut) word_out[(tile0 & 1) * 16 + rl][j] = out;
      }
    }
    if constexpr (kOut) {
      // The second tile of a word: the word's fragments, by lanes 4 j + t of warp 0 (token j,
      // lane column t), as a GEMV reading y would build them. (Warp 0 alone wrote word_out.)
      static_assert(RT * 16 * NT <= 32, "the word's outputs are warp 0's");
      if ((tile0 & 1) && warp == 0) {
        __syncwarp();
        const int j = lane >> 2, tq = lane & 3;
        if (lane < 4 * NT && j < a.n) {
          float2 v[4];
#pragma unroll
          for (int p = 0; p < 4; ++p) v[p] = make_float2(word_out[2 * tq + 8 * p][j], word_out[2 * tq + 8 * p + 1][j]);
          const int64_t w = tile0 >> 1;
          uint4 hi, lo;
          const float inv = fragment_word(v, lane, hi, lo);
          uint4* f = a.frag_out + (w * kSets + j / 4) * kLanes + 8 * (j % 4) + tq;
          f[0] = hi;
          f[4] = lo;
          if (tq == 0) a.inv_out[w * NT + j] = inv;
        }
      }
    }
    parity ^= 1;  // (red[parity] of two units ago was read before this unit's barrier)
    if (!single_stage) {
#pragma unroll
      for (int j = 0; j < NT; ++j) ss[j] = 0.0f;
    }
  }
  cp_async_wait<0>();  // (only empty groups are left)
}

// Dynamic shared memory the kernel may use on this device (the opt-in limit less its static
// arrays, at most kSmemBytes); raises the kernel's limit to that once per device, so launches of
// different shapes never lower it for each other.
template <bool kQ4, int S, int RT, int NT, bool kFrags, bool kSplit>
cudaError_t stage_budget(const DeviceLimits& d, int64_t& budget) {
  static std::mutex mu;
  static std::map<int, int64_t> known;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(d.device); it != known.end()) {
    budget = it->second;
    return cudaSuccess;
  }
  cudaFuncAttributes attr{};
  if (cudaError_t e = cudaFuncGetAttributes(&attr, gemv_quant_kernel<kQ4, S, RT, NT, kFrags, kSplit>); e != cudaSuccess)
    return e;
  const int64_t b = std::min<int64_t>(kSmemBytes, int64_t(d.smem_optin) - int64_t(attr.sharedSizeBytes));
  if (cudaError_t e = cudaFuncSetAttribute(gemv_quant_kernel<kQ4, S, RT, NT, kFrags, kSplit>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(b));
      e != cudaSuccess)
    return e;
  known.emplace(d.device, b);
  budget = b;
  return cudaSuccess;
}

template <bool kQ4, int S, int RT, int NT, bool kFrags = false, bool kSplit = false>
cudaError_t launch_quant(QArgs a, cudaStream_t stream) {
  using Sh = Shape<kQ4, S, RT, NT>;
  DeviceLimits d;
  int64_t budget = 0;
  SHOAL_TRY_LAUNCH(device_limits(d));
  SHOAL_TRY_LAUNCH((stage_budget<kQ4, S, RT, NT, kFrags, kSplit>(d, budget)));
  a.units = assign_seg_blocks(a.seg, a.n_segs, RT, [](const QSeg& s) { return s.tiles; });
  const int64_t chunks = kSplit ? a.chunks / 2 : a.chunks;  // a block's chunks per row
  if constexpr (kSplit) a.units *= 2;  // (seg.block_end stays in tile units: unit_of takes u >> 1)
  const int64_t per_chunk = Sh::kChunkBytes + 4 * NT * Sh::kWords;  // fragments and their scales
  // Stages of a multiple of 16 chunks: a warp's pairs (c, c + 8) never straddle two. The
  // deepest ring that leaves one stage for the whole row; else 2 slots and the largest stage.
  // A 3-slot ring only where it keeps the blocks per SM of 2 slots (its 60 KiB would cost one on
  // sm_80 from ~4.6k columns, and on sm_90 for Q8_0 gate+up rows of 2.5-3k columns at 3-4
  // tokens or 5.6-6k at 2).
  auto stage_for = [&](int slots) {
    return std::min(div_up(chunks, 2 * kWarps), (budget - Sh::ring_bytes(slots)) / per_chunk / (2 * kWarps)) * 2 *
           kWarps;
  };
  auto smem_at = [&](int slots) { return size_t(Sh::ring_bytes(slots) + stage_for(slots) * per_chunk); };
  auto per_sm_at = [&](int slots, int& blocks) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gemv_quant_kernel<kQ4, S, RT, NT, kFrags, kSplit>, kThreads,
                                                         smem_at(slots));
  };
  a.slots = Sh::kMaxSlots;
  a.stage_chunks = stage_for(a.slots);
  bool shallower = a.stage_chunks < chunks;
  int per_sm = 0;  // resident blocks per SM at a.slots, once known
  if constexpr (Sh::kMaxSlots == 3) {
    if (!shallower) {
      int deep = 0, shallow = 0;
      SHOAL_TRY_LAUNCH(per_sm_at(3, deep));
      SHOAL_TRY_LAUNCH(per_sm_at(2, shallow));
      shallower = deep < shallow;
      per_sm = shallower ? shallow : deep;
    }
  }
  if (shallower) {
    a.slots = 2;
    a.stage_chunks = stage_for(a.slots);
  }
  // (At least 16 chunks: ring and fragments of the largest shape, Q4_0 gate+up at 8 tokens,
  // take ~81 KiB, within the 99 KiB per block of every supported device.)
  if (a.stage_chunks < 2 * kWarps) return cudaErrorInvalidConfiguration;
  const int64_t stages = div_up(chunks, a.stage_chunks);
  const size_t smem = smem_at(a.slots);
  // One stage: each block builds the activation fragments once and loops over units, as many
  // blocks as are resident at once. Several stages: one unit per block (with pairs, one word).
  int64_t grid = a.frag_out ? a.units / 2 : a.units;
  if (stages == 1) {
    if (per_sm == 0) SHOAL_TRY_LAUNCH(per_sm_at(a.slots, per_sm));
    grid = std::min<int64_t>(grid, int64_t(std::max(per_sm, 1)) * d.sms);
  }
  // Even: a block's half is its parity (units >= 2; blocks never wait for each other, so two
  // blocks are fine where one slot is resident).
  if constexpr (kSplit) grid = std::max<int64_t>(grid & ~int64_t(1), 2);
  SHOAL_TRY_LAUNCH(launch(gemv_quant_kernel<kQ4, S, RT, NT, kFrags, kSplit>, unsigned(grid), kThreads, smem, stream, a));
  return cudaGetLastError();
}

template <bool kQ4, int S>
cudaError_t dispatch(const QArgs& a, int64_t tiles, cudaStream_t stream) {
  switch (a.n) {
    case 1: {
      // Two tiles per unit (sharing the fragment loads) once there are units enough to fill the
      // SMs twice over; not for gate+up, whose two weights already double the loads.
      const int ov = gemv_rows_override();
      if (a.frag_in || a.frag_out) return launch_quant<kQ4, S, 1, 1, true>(a, stream);
      if constexpr (S == 1 && !kQ4)
        if (a.split) return launch_quant<kQ4, S, 1, 1, false, true>(a, stream);
      if constexpr (S == 1)
        if (ov == 32 || (ov != 16 && tiles >= 512)) return launch_quant<kQ4, S, 2, 1>(a, stream);
      return launch_quant<kQ4, S, 1, 1>(a, stream);
    }
    case 2:
      return launch_quant<kQ4, S, 1, 2>(a, stream);
    case 3:
    case 4:
      return launch_quant<kQ4, S, 1, 4>(a, stream);
    default:
      return launch_quant<kQ4, S, 1, 8>(a, stream);
  }
}

}  // namespace

// The handoff's layout (gemv_frag_bytes): per 32-value word kFragWords 16-byte fragment words
// (hi and lo of the 4 lanes of one token), then f32 1 / scale per word.
constexpr int64_t kFragWords = 8;
int64_t gemv_frag_bytes(int64_t cols) { return cols / 32 * (kFragWords * 16 + 4); }

cudaError_t gemv_quant(const GemvOut* outs, int count, const float* x, int n, const GemvOpts& o, cudaStream_t stream) {
  const WKind kind = outs[0].w.kind;
  const int64_t cols = outs[0].w.cols;
  if (cols % 32 != 0 || cols >= (int64_t(1) << 30) || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      (o.norm_w && reinterpret_cast<uintptr_t>(o.norm_w) % 16 != 0))
    return cudaErrorInvalidValue;
  const bool q4 = kind == WKind::kQ4_0;
  QArgs a{};
  int64_t tiles = 0;
  for (int i = 0; i < count; ++i) {
    const GemvOut& g = outs[i];
    if (g.w.rows == 0) continue;
    QSeg& sg = a.seg[a.n_segs++];
    sg.w[0] = static_cast<const uint4*>(g.w.data);
    sg.s[0] = g.w.scales;
    sg.w[1] = g.up ? static_cast<const uint4*>(g.up->data) : nullptr;
    sg.s[1] = g.up ? g.up->scales : nullptr;
    sg.rows = g.w.rows;
    sg.tiles = div_up(g.w.rows, 16);
    sg.bias = g.bias;
    sg.y = g.y;
    sg.y2 = g.y2;
    tiles += sg.tiles;
  }
  if (a.n_segs == 0) return cudaSuccess;
  a.cols = cols;
  a.chunks = quant_chunks(q4, cols);
  a.x = x;
  a.n = n;
  a.norm_w = o.norm_w;
  a.eps = o.eps;
  a.accumulate = o.accumulate;
  a.early_epilogue = o.early_epilogue;
  a.act = o.act;
  const bool glu = outs[0].up != nullptr;
  if (o.frags_in) {
    // (Q4_0: a chunk's second word past the row would be copied unwritten: whole chunks only.)
    if (n != 1 || glu || o.norm_w || (q4 && cols % 64 != 0) || reinterpret_cast<uintptr_t>(o.frags_in) % 16 != 0)
      return cudaErrorInvalidValue;
    a.frag_in = static_cast<const uint4*>(o.frags_in);
    a.inv_in = reinterpret_cast<const float*>(a.frag_in + cols / 32 * kFragWords);
  }
  if (o.frags_out) {
    if (n != 1 || !glu || a.n_segs != 1 || a.seg[0].rows % 32 != 0 ||
        reinterpret_cast<uintptr_t>(o.frags_out) % 16 != 0)
      return cudaErrorInvalidValue;
    a.frag_out = static_cast<uint4*>(o.frags_out);
    a.inv_out = reinterpret_cast<float*>(a.frag_out + a.seg[0].rows / 32 * kFragWords);
  }
  if (o.split_k) {
    // (Q8_0 only. A block's chunks start at a multiple of kWarps: warp w owns chunks w + kWarps m of
    // a stage.)
    if (q4 || n != 1 || glu || o.accumulate || o.frags_in || o.frags_out || a.chunks % (2 * kWarps) != 0 ||
        (o.norm_w && !o.split_ss))
      return cudaErrorInvalidValue;
    for (int i = 0; i < a.n_segs; ++i)
      if (!a.seg[i].y2 || a.seg[i].bias) return cudaErrorInvalidValue;
    a.split = true;
    a.ss_out = o.split_ss;
  }
  if (q4) return glu ? dispatch<true, 2>(a, tiles, stream) : dispatch<true, 1>(a, tiles, stream);
  return glu ? dispatch<false, 2>(a, tiles, stream) : dispatch<false, 1>(a, tiles, stream);
}

cudaError_t device_limits(DeviceLimits& out) {
  static std::mutex mu;
  static std::map<int, DeviceLimits> known;
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(dev);
  if (it == known.end()) {
    DeviceLimits d;
    d.device = dev;
    if (cudaError_t e = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess) return e;
    if (cudaError_t e = cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        e != cudaSuccess)
      return e;
    it = known.emplace(dev, d).first;
  }
  out = it->second;
  return cudaSuccess;
}

}  // namespace shoal::cuda
