// Internal to src/backend/cpu/: the per-ISA matmul kernels behind fast_matmul (matmul.h), the
// job they share, and the activation format for integer dot products.
//
// Determinism: every output element y[t, r] is one dot product computed by the same instruction
// sequence whatever the tile it sits in (a tile is just several independent accumulators run
// side by side), so results are bit-identical for any thread count and any batch size n.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace shoal::cpu_detail {

/// Activations quantized for Q8_0 / Q4_0 weights ("QX"), one record per token, 64-byte aligned.
/// A token of `in` values has nb = in / 32 blocks, padded with zero blocks to nbp (even, so AVX-512
/// kernels can take two blocks per register). Record layout (MatmulJob::qx_stride bytes, a
/// multiple of 64 >= 36 * nbp):
///   qs  int8  [nbp * 32]  round(x / d) per block, |q| <= 127
///   d   float [nbp]       the block's scale d = amax / 127
/// (ISA files compute these offsets themselves: they call no inline function of a shared header,
/// so that no out-of-line copy compiled with AVX-512 flags can be picked by the linker for code
/// that runs on a lesser CPU.)

/// Bytes fetched ahead of the weight rows being read (software prefetch): the rows of a GEMV are
/// one sequential stream, and the hardware prefetcher stops at every 4 KiB page.
inline constexpr int64_t kPrefetchBytes = 8192;

/// One matmul: y[n, out] = x[n, in] · w[out, in]ᵀ (+ bias).
struct MatmulJob {
  const uint8_t* w = nullptr;  // GGUF layout: `out` rows of w_row_bytes
  uint64_t w_row_bytes = 0;
  DType wtype = DType::kF32;
  int64_t in = 0, out = 0, n = 0;
  const float* x = nullptr;    // f32 [n, in] (float weights)
  const uint8_t* qx = nullptr; // QX records [n] (Q8_0 / Q4_0 weights)
  int64_t nbp = 0;             // QX padded block count
  int64_t qx_stride = 0;       // bytes per QX record
  float* y = nullptr;          // f32 [n, out]
  const float* bias = nullptr; // f32 [out] or null
};

/// Computes rows [r0, r1) of y for every token (r0 a multiple of 4; r1 = r0 + 4k or out).
/// Tokens are walked in blocks of `token_block` so a block's activations stay in cache while the
/// rows' weights are reused.
using RowsFn = void (*)(const MatmulJob& job, int64_t r0, int64_t r1, int64_t token_block);
/// Quantizes one token's `in` values into a QX record (nbp padded blocks).
using QuantizeXFn = void (*)(const float* x, int64_t in, int64_t nbp, uint8_t* record);

/// The kernels of one instruction-set level.
struct IsaKernels {
  RowsFn f32, f16, bf16, q8_0, q4_0;
  QuantizeXFn quantize_x;
};

const IsaKernels& kernels_scalar();
const IsaKernels& kernels_avx2();    // only call when the CPU has AVX2+FMA+F16C
const IsaKernels& kernels_avx512();  // only call when the CPU has AVX-512 F/BW/DQ/VL/VNNI

/// Row tile and token tile of the kernels (rows per group, tokens per group).
inline constexpr int kTileRows = 4;
inline constexpr int kTileTokens = 4;

/// The loop every ISA's RowsFn runs: token blocks, then row groups of kTileRows, then token
/// groups of kTileTokens, each computed by K::tile<R, T>(job, first_row, first_token). Only ever
/// instantiated with a K from an ISA file's anonymous namespace, so each copy stays in its file.
template <typename K, int R>
void run_tile_rows(const MatmulJob& j, int64_t r, int64_t t, int nt) {
  switch (nt) {
    case 1: K::template tile<R, 1>(j, r, t); break;
    case 2: K::template tile<R, 2>(j, r, t); break;
    case 3: K::template tile<R, 3>(j, r, t); break;
    default: K::template tile<R, 4>(j, r, t); break;
  }
}

template <typename K>
void run_rows(const MatmulJob& j, int64_t r0, int64_t r1, int64_t token_block) {
  static_assert(kTileRows == 4 && kTileTokens == 4, "run_tile_rows dispatches tiles up to 4 x 4");
  for (int64_t tb = 0; tb < j.n; tb += token_block) {
    const int64_t te = (j.n - tb < token_block) ? j.n : tb + token_block;
    for (int64_t r = r0; r < r1; r += kTileRows) {
      const int nr = int((r1 - r < kTileRows) ? r1 - r : kTileRows);
      for (int64_t t = tb; t < te; t += kTileTokens) {
        const int nt = int((te - t < kTileTokens) ? te - t : kTileTokens);
        switch (nr) {
          case 1: run_tile_rows<K, 1>(j, r, t, nt); break;
          case 2: run_tile_rows<K, 2>(j, r, t, nt); break;
          case 3: run_tile_rows<K, 3>(j, r, t, nt); break;
          default: run_tile_rows<K, 4>(j, r, t, nt); break;
        }
      }
    }
  }
}

}  // namespace shoal::cpu_detail
