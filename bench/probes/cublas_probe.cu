// cublas_probe: cuBLAS / cuBLASLt f16 x f16 -> f32 GEMM times at the prefill shapes of
// Llama-3-8B and Qwen3-0.6B (y = W x: W [m, k] row-major, op T; x [N, k]; y [N, m]), N = 1024
// (512 tokens x the exact path's two parts) and 512 (one part). Per product: cublasGemmEx
// (CUBLAS_GEMM_DEFAULT, 64 MiB workspace) and the best of every cublasLtMatmulAlgoGetHeuristic
// candidate; q / k / v as three calls, on three streams, and as one product over stacked rows.
// Times: best of 3 rounds of back-to-back calls, us per call. Not built by CMake (a measurement
// for docs/cuda.md v34, random data, no checks):
//   nvcc -std=c++17 -O2 -arch=sm_90 bench/probes/cublas_probe.cu -o cublas_probe -lcublasLt -lcublas
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "probe_check.h"

// Exits with the failing line: CUDA runtime calls (CK, probe_check.h) and cuBLAS calls (CB).
#define CB(x)                                                             \
  do {                                                                    \
    const cublasStatus_t e_ = (x);                                        \
    die_unless(e_ == CUBLAS_STATUS_SUCCESS, "cuBLAS", int(e_), __LINE__); \
  } while (0)

static cudaStream_t st;
static cublasHandle_t cb;
static cublasLtHandle_t lt;
static void* ws;
static const size_t kWs = 64 << 20;

__global__ void fill(half* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = __float2half((float(h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}

static float time_us(const std::function<void()>& f, int reps = 20) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  float best = 1e30f;
  for (int r = 0; r < 3; ++r) {
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < reps; ++i) f();
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms * 1000.0f / reps);
  }
  CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
  return best;
}

static void gemmex(const half* w, const half* x, float* y, int m, int n, int k, cudaStream_t s = st,
                   float beta = 0) {
  const float one = 1;
  CB(cublasSetStream(cb, s));
  CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_16F, k, x, CUDA_R_16F, k, &beta, y,
                  CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct LtBest { float def_us, best_us; int idx, count, tile, stages, splitk, swizzle, cluster; };

static LtBest lt_search(const half* w, const half* x, float* y, int m, int n, int k) {
  cublasLtMatmulDesc_t desc;
  CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t la, lb, lc;
  CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, k, m, k));
  CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, k, n, k));
  CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m));
  cublasLtMatmulPreference_t pref;
  CB(cublasLtMatmulPreferenceCreate(&pref));
  size_t wsz = kWs;
  CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
  cublasLtMatmulHeuristicResult_t res[32];
  int count = 0;
  CB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 32, res, &count));
  LtBest b{0, 1e30f, -1, count, 0, 0, 0, 0, 0};
  const float one = 1, zero = 0;
  for (int i = 0; i < count; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto run = [&] {
      CB(cublasLtMatmul(lt, desc, &one, w, la, x, lb, &zero, y, lc, y, lc, &res[i].algo, ws, kWs, st));
    };
    const float us = time_us(run, 10);
    if (i == 0) b.def_us = us;
    if (us < b.best_us) {
      b.best_us = us; b.idx = i;
      size_t sz;
      auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, int& v) {
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, attr, &v, sizeof v, &sz);
      };
      get(CUBLASLT_ALGO_CONFIG_TILE_ID, b.tile);
      get(CUBLASLT_ALGO_CONFIG_STAGES_ID, b.stages);
      get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, b.splitk);
      get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, b.swizzle);
      get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, b.cluster);
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  return b;
}

struct Sh { const char* name; int m, k; int count; };  // count: products per layer of this shape

// --glu: gate / up as two products against one over their stacked rows, and the exact path's two
// activation parts as 2N columns of one product against two N-column products, the second
// accumulating into the first (beta = 1).
static void glu_probe(half* w, half* x, float* y) {
  struct G { const char* name; int m, k; };
  for (const G& g : {G{"llama3-8b gate/up", 14336, 4096}, G{"llama3-8b down", 4096, 14336},
                     G{"qwen3-0.6b gate/up", 3072, 1024}}) {
    for (int n : {1024, 512}) {
      const float two = time_us([&] {
        gemmex(w, x, y, g.m, n, g.k);
        gemmex(w + size_t(g.m) * g.k, x, y + size_t(g.m) * n, g.m, n, g.k);
      });
      const float one = time_us([&] { gemmex(w, x, y, 2 * g.m, n, g.k); });
      const LtBest b = lt_search(w, x, y, 2 * g.m, n, g.k);
      const double fl = 2.0 * 2 * g.m * double(n) * g.k;
      std::printf("%s N=%d: two %.1f us (%.0f TFLOP/s), stacked %d rows %.1f (%.0f), Lt best %.1f (%.0f)\n", g.name, n,
                  two, fl / two / 1e6, 2 * g.m, one, fl / one / 1e6, b.best_us, fl / b.best_us / 1e6);
    }
    const float acc = time_us([&] {
      gemmex(w, x, y, g.m, 512, g.k);
      gemmex(w, x + size_t(512) * g.k, y, g.m, 512, g.k, st, 1.0f);
    });
    const float wide = time_us([&] { gemmex(w, x, y, g.m, 1024, g.k); });
    std::printf("%s parts: one 1024-column product %.1f us, two 512-column (beta = 1) %.1f\n", g.name, wide, acc);
  }
}

int main(int argc, char** argv) {
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CB(cublasCreate(&cb));
  CB(cublasLtCreate(&lt));
  CK(cudaMalloc(&ws, kWs));
  CB(cublasSetWorkspace(cb, ws, kWs));
  const size_t wmax = size_t(14336) * 4096 * 2 + 64;  // elements: room for a stacked q/k/v too
  half *w, *x;
  float* y;
  CK(cudaMalloc(&w, wmax * 2));
  CK(cudaMalloc(&x, size_t(2048) * 14336 * 2));
  CK(cudaMalloc(&y, size_t(2048) * 28672 * 4));
  fill<<<1024, 256, 0, st>>>(w, wmax, 1);
  fill<<<1024, 256, 0, st>>>(x, size_t(2048) * 14336, 2);
  CK(cudaStreamSynchronize(st));
  if (argc > 1 && std::string(argv[1]) == "--glu") {
    glu_probe(w, x, y);
    return 0;
  }

  struct Model { const char* name; std::vector<Sh> sh; int layers; };
  std::vector<Model> models = {
      {"llama3-8b", {{"q", 4096, 4096, 1}, {"k/v", 1024, 4096, 2}, {"wo", 4096, 4096, 1}, {"gate/up", 14336, 4096, 2},
                     {"down", 4096, 14336, 1}}, 32},
      {"qwen3-0.6b", {{"q", 2048, 1024, 1}, {"k/v", 1024, 1024, 2}, {"wo", 1024, 2048, 1}, {"gate/up", 3072, 1024, 2},
                      {"down", 1024, 3072, 1}}, 28},
  };
  for (const Model& md : models) {
    for (int n : {1024, 512}) {
      std::printf("\n## %s, N = %d (%s)\n", md.name, n, n == 1024 ? "exact: 512 tokens x 2 parts" : "half: 512 tokens");
      std::printf("| product | m x k | GemmEx us | TFLOP/s | Lt first us | Lt best us | TFLOP/s | of | "
                  "tile/stages/splitk/swz/cluster |\n|---|---|---|---|---|---|---|---|---|\n");
      double sum_def = 0, sum_best = 0;
      for (const Sh& s : md.sh) {
        const double fl = 2.0 * s.m * double(n) * s.k;
        const float d = time_us([&] { gemmex(w, x, y, s.m, n, s.k); });
        const LtBest b = lt_search(w, x, y, s.m, n, s.k);
        std::printf("| %s | %dx%d | %.1f | %.0f | %.1f | %.1f | %.0f | %d/%d | %d/%d/%d/%d/%d |\n", s.name, s.m, s.k, d,
                    fl / d / 1e6, b.def_us, b.best_us, fl / b.best_us / 1e6, b.idx, b.count, b.tile, b.stages,
                    b.splitk, b.swizzle, b.cluster);
        sum_def += d * s.count;
        sum_best += std::min(d, b.best_us) * s.count;
      }
      const Sh& q = md.sh[0];
      const Sh& kv = md.sh[1];
      cudaStream_t s2[2];
      cudaEvent_t ev[3];
      for (auto& s : s2) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      for (auto& e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      const size_t qsz = size_t(q.m) * q.k, ksz = size_t(kv.m) * kv.k;
      const float seq = time_us([&] {
        gemmex(w, x, y, q.m, n, q.k);
        gemmex(w + qsz, x, y + size_t(q.m) * n, kv.m, n, kv.k);
        gemmex(w + qsz + ksz, x, y + size_t(q.m + kv.m) * n, kv.m, n, kv.k);
      });
      const float par = time_us([&] {
        CK(cudaEventRecord(ev[0], st));
        for (auto& s : s2) CK(cudaStreamWaitEvent(s, ev[0]));
        gemmex(w, x, y, q.m, n, q.k, st);
        gemmex(w + qsz, x, y + size_t(q.m) * n, kv.m, n, kv.k, s2[0]);
        gemmex(w + qsz + ksz, x, y + size_t(q.m + kv.m) * n, kv.m, n, kv.k, s2[1]);
        CK(cudaEventRecord(ev[1], s2[0]));
        CK(cudaEventRecord(ev[2], s2[1]));
        CK(cudaStreamWaitEvent(st, ev[1]));
        CK(cudaStreamWaitEvent(st, ev[2]));
      });
      const int mq = q.m + 2 * kv.m;
      const float one_gemm = time_us([&] { gemmex(w, x, y, mq, n, q.k); });
      const LtBest ob = lt_search(w, x, y, mq, n, q.k);
      std::printf("q/k/v: three GemmEx %.1f us, on three streams %.1f, one stacked %dx%d GemmEx %.1f (Lt best %.1f)\n",
                  seq, par, mq, q.k, one_gemm, ob.best_us);
      std::printf("per layer, products only: GemmEx %.1f us, best of GemmEx / Lt %.1f us\n", sum_def, sum_best);
      for (auto& s : s2) CK(cudaStreamDestroy(s));
      for (auto& e : ev) CK(cudaEventDestroy(e));
    }
  }
  // bf16 / f16 8192^3 reference
  const float big = time_us([&] { gemmex(w, x, y, 8192, 2048, 8192); }, 5);
  std::printf("\nf16 8192x2048x8192: %.1f us, %.0f TFLOP/s\n", big, 2.0 * 8192 * 2048 * 8192 / big / 1e6);
  return 0;
}
