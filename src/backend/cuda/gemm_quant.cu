// Prefill GEMM (more than kGemvMaxTokens tokens) for Q8_0 / Q4_0 weights on the Hopper
// warpgroup tensor cores (wgmma, sm_90a): y = W x for the activation parts of
// split_activations (x = hi + lo in f16, side by side as 2n columns), exact like the GEMV.
//
// Why: the cuBLAS path (cuda_gemm.cc) dequantizes W into f16 hi + lo (d * (q - 8) needs 15
// significant bits) and runs three f16 products, w_hi [x_hi x_lo] + w_lo x_hi. Here each value
// q - 8 (Q4_0) or q (Q8_0) is an exact f16 small integer, converted in registers from the tile
// layout (cuda_util.h; per warp it is the A fragment of wgmma's register operand, the layout of
// mma.m16n8k16), so one product per activation part: two instead of three, and no dequantized
// copy. The f16 products are exact and accumulate in f32 over a 32-value block; each block's
// sum is then multiplied by its f32 scale and added to the row's total ("promotion").
//
// Work split: a block computes 128 rows x 128 columns of y. Warpgroup 0 streams the stages
// through a ring of kStages (one thread issues three TMA copies per stage: the columns'
// activations, 128 x 64 f16 in the 128-byte swizzle wgmma reads, and the 8 tiles' quants and
// scales) and gives its registers to warpgroups 1 and 2, which compute 64 rows each (warp 4 + w
// holds tile w). Per stage a warpgroup puts both 32-value blocks on the tensor cores at once
// (two accumulator sets), waits once, releases the stage and promotes both; the stages pass
// between them on shared-memory barriers (full / empty), so the warpgroups drift apart and one's
// promotion overlaps the other's MMAs. PTX ISA: "asynchronous warpgroup level matrix
// multiply-accumulate" (wgmma.mma_async, matrix descriptors, register fragments), "mbarrier",
// "cp.async.bulk.tensor", "setmaxnreg".
// Twin: ref::matmul (src/backend/cpu/ref_ops.cc); tests: tests/cuda/cuda_gemm_quant_test.cc.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>

#include <mutex>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant_mma.cuh"

namespace shoal::cuda {
namespace {

constexpr int kCols = 128, kK = 64;  // a block's columns of y (x 128 rows) and a stage's columns of K
constexpr int kStages = 6;
constexpr int kTiles = 8;                           // 16-row tiles of a block: a computing warp each
constexpr int kThreads = 128 + 32 * kTiles;         // the producer warpgroup, then the computing warps

struct QGemmArgs {
  // Tensor maps (TMA) of the activations x16 [ncols, k] f16 (boxes of 64 x 128 in the 128-byte
  // swizzle) and of each weight's quants [tiles, chunks x 512 bytes] and scales [tiles, chunks x
  // 64 / 32 bytes] (boxes of a stage's chunks x a block's tiles); out-of-range parts load as zeros.
  CUtensorMap tx, tq[kGemvMaxOuts], ts[kGemvMaxOuts];
  float* y[kGemvMaxOuts];  // [ncols, rows]
  int64_t rows[kGemvMaxOuts];
  unsigned block_end[kGemvMaxOuts];  // row blocks of the weights so far (blockIdx.y)
  int count;
  int64_t k, ncols;
};

template <bool kQ4>
struct Stage {
  static constexpr int kChunks = kQ4 ? 1 : 2;                // weight chunks per stage and tile
  static constexpr int kScaleBytes = kQ4 ? 64 : 32;          // a chunk's f16 scales: 8 g x 2 blocks x 2 halves (Q4_0), 8 g x 2 halves
  // A stage's box of one tile row in 4-byte words (the tensor maps' unit): quants and scales.
  static constexpr int kQuantWords = kChunks * 512 / 4, kScaleWords = kChunks * kScaleBytes / 4;
  static constexpr int kB = kCols * kK * 2;                  // activations: 16 KiB
  static constexpr int kA = kTiles * kChunks * 512;          // quants of the tiles
  static constexpr int kS = kTiles * kChunks * kScaleBytes;  // their scales
  static constexpr int kBytes = (kB + kA + kS + 1023) / 1024 * 1024;  // (B stays 1024-byte aligned)
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ unsigned smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }
// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle: rows of 128
// bytes, 8-row groups 1024 bytes apart (the leading byte offset is unused in this mode).
__device__ __forceinline__ uint64_t sw128_desc(const void* p) {
  const uint32_t a = smem_addr(p);
  return uint64_t((a & 0x3ffff) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// d (64 rows x 128 columns over the warpgroup, f32) = A (registers, 64 x 16 f16) * B (shared,
// 16 x 128 f16, K-major) + (scale_d ? d : 0).
__device__ __forceinline__ void wgmma_128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %69, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(scale_d), "l"(desc));
}

// Shared-memory barriers (PTX ISA "mbarrier"): the ring's stages pass from the producer to the
// consumer warps (full) and back (empty) without block barriers.
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives and adds `bytes` to the transaction count the phase waits for (the TMA copies').
__device__ __forceinline__ void mbar_expect(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// A box of a 2-D tensor map at (c0 inner, c1 outer) into shared memory; completes on bar.
__device__ __forceinline__ void tma_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
#endif

template <bool kQ4>
__global__ void __launch_bounds__(kThreads, 1) gemm_quant_kernel(const __grid_constant__ QGemmArgs a) {
  pdl_prologue();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using St = Stage<kQ4>;
  extern __shared__ uint8_t smem_raw[];  // (one spare KiB: the ring starts 1024-byte aligned)
  uint8_t* const smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full[kStages], empty[kStages];  // a stage landed / every consumer warp is done with it
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int wi = 0;  // the weight of this block's rows
  unsigned first = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxOuts; ++i)
    if (i < a.count && blockIdx.y >= a.block_end[i - 1]) wi = i, first = a.block_end[i - 1];
  const int64_t col0 = int64_t(blockIdx.x) * kCols, tile0 = int64_t(blockIdx.y - first) * kTiles;
  const int64_t stages = div_up(a.k, kK);
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kTiles);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (tid < 128) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
#pragma unroll 1
      for (int64_t s = 0; s < stages; ++s) {
        const int slot = int(s % kStages);
        if (s >= kStages) mbar_wait(&empty[slot], unsigned((s / kStages - 1) & 1));
        uint8_t* base = smem + slot * St::kBytes;
        mbar_expect(&full[slot], St::kB + St::kA + St::kS);
        tma_2d(base, &a.tx, int(s * kK), int(col0), &full[slot]);
        tma_2d(base + St::kB, &a.tq[wi], int(s * St::kQuantWords), int(tile0), &full[slot]);
        tma_2d(base + St::kB + St::kA, &a.ts[wi], int(s * St::kScaleWords), int(tile0), &full[slot]);
      }
    }
    return;
  }
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
  float total[64], acc[2][64];
#pragma unroll
  for (int i = 0; i < 64; ++i) total[i] = 0.0f;
  auto promote = [&](const float(&c)[64], uint32_t dbits) {
    const float2 d = bits_half2(dbits);  // rows g (0, 1) and g + 8 (2, 3)
#pragma unroll
    for (int i = 0; i < 64; i += 4) {
      total[i] = fmaf(d.x, c[i], total[i]);
      total[i + 1] = fmaf(d.x, c[i + 1], total[i + 1]);
      total[i + 2] = fmaf(d.y, c[i + 2], total[i + 2]);
      total[i + 3] = fmaf(d.y, c[i + 3], total[i + 3]);
    }
  };
#pragma unroll 1
  for (int64_t s = 0; s < stages; ++s) {
    const int slot = int(s % kStages);
    mbar_wait(&full[slot], unsigned((s / kStages) & 1));
    const uint8_t* base = smem + slot * St::kBytes;
    const uint64_t desc = sw128_desc(base);
    uint32_t frag[2][2][4], dbits[2];
    fetch(base, 0, frag[0], dbits[0]);
    fetch(base, 1, frag[1], dbits[1]);
    wgmma_fence();
#pragma unroll
    for (int b = 0; b < 2; ++b) {  // block b: k-steps 2 b, 2 b + 1 (32 bytes each in the swizzled rows)
      wgmma_128(acc[b], frag[b][0], desc + uint64_t((2 * b) * 32 >> 4), 0);
      wgmma_128(acc[b], frag[b][1], desc + uint64_t((2 * b + 1) * 32 >> 4), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(&empty[slot]);  // this warp is done with the stage
    promote(acc[0], dbits[0]);
    promote(acc[1], dbits[1]);
  }
  // Thread (warp, g, t): rows 16 warp + g (+ 8) of the block, columns 8 i + 2 t (+ 1).
  const int64_t r0 = (tile0 + warp) * 16 + g, rows = a.rows[wi];
  float* const y = a.y[wi];
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = r0 + 8 * (e >> 1), col = col0 + 8 * i + 2 * t + (e & 1);
      if (row < rows && col < a.ncols) y[col * rows + row] = total[4 * i + e];
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

cudaError_t gemm_quant(const WeightRef* w, float* const* y, int count, const uint16_t* x16, int64_t ncols,
                       cudaStream_t stream) {
  if (!gemm_quant_available()) return cudaErrorNotSupported;
  if (count < 1 || count > kGemvMaxOuts) return cudaErrorInvalidValue;
  const bool q4 = w[0].kind == WKind::kQ4_0;
  for (int i = 0; i < count; ++i)
    if (w[i].kind != w[0].kind || w[i].cols != w[0].cols) return cudaErrorInvalidValue;
  if ((!q4 && w[0].kind != WKind::kQ8_0) || w[0].cols % 32 != 0 || reinterpret_cast<uintptr_t>(x16) % 16 != 0)
    return cudaErrorInvalidValue;
  if (ncols == 0) return cudaSuccess;
  QGemmArgs a{};
  a.count = count;
  a.k = w[0].cols;
  const int64_t chunks = quant_chunks(q4, a.k);
  a.ncols = ncols;
  if (!tensor_map_2d(a.tx, CU_TENSOR_MAP_DATA_TYPE_UINT16, x16, uint64_t(a.k), uint64_t(ncols), uint64_t(a.k) * 2, kK,
                     kCols, CU_TENSOR_MAP_SWIZZLE_128B))
    return cudaErrorInvalidValue;
  const uint64_t row_quants = uint64_t(chunks) * 512;
  const uint64_t row_scales = uint64_t(chunks) * (q4 ? Stage<true>::kScaleBytes : Stage<false>::kScaleBytes);
  const uint32_t quant_words = q4 ? Stage<true>::kQuantWords : Stage<false>::kQuantWords;  // (a stage's box)
  const uint32_t scale_words = q4 ? Stage<true>::kScaleWords : Stage<false>::kScaleWords;
  int64_t total_blocks = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t tiles = div_up(w[i].rows, 16);
    a.y[i] = y[i];
    a.rows[i] = w[i].rows;
    total_blocks += div_up(tiles, kTiles);
    if (total_blocks > 65535) return cudaErrorInvalidValue;  // (gridDim.y)
    a.block_end[i] = unsigned(total_blocks);
    if (w[i].rows == 0) continue;  // (no blocks: its maps are never read)
    if (!tensor_map_2d(a.tq[i], CU_TENSOR_MAP_DATA_TYPE_UINT32, w[i].data, row_quants / 4, uint64_t(tiles), row_quants,
                       quant_words, kTiles, CU_TENSOR_MAP_SWIZZLE_NONE) ||
        !tensor_map_2d(a.ts[i], CU_TENSOR_MAP_DATA_TYPE_UINT32, w[i].scales, row_scales / 4, uint64_t(tiles), row_scales,
                       scale_words, kTiles, CU_TENSOR_MAP_SWIZZLE_NONE))
      return cudaErrorInvalidValue;
  }
  if (total_blocks == 0) return cudaSuccess;
  auto run = [&](auto kernel, int stage_bytes) -> cudaError_t {
    const dim3 grid(unsigned(div_up(ncols, kCols)), unsigned(total_blocks));
    const size_t smem = size_t(kStages) * size_t(stage_bytes) + 1024;
    // (Per launch: the limit is per device, and a host call is nothing beside a prefill GEMM.)
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        e != cudaSuccess)
      return e;
    SHOAL_TRY_LAUNCH(launch(kernel, grid, kThreads, smem, stream, a));
    return cudaGetLastError();
  };
  return q4 ? run(gemm_quant_kernel<true>, Stage<true>::kBytes) : run(gemm_quant_kernel<false>, Stage<false>::kBytes);
}

}  // namespace shoal::cuda
