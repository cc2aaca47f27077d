// Fast CPU kernel figures (not pass/fail): the machine's memory read bandwidth, GEMV GB/s of
// weights streamed per dtype for Qwen3-0.6B-like shapes, GEMM GFLOP/s at n = 128, and the decode
// and prefill rates those imply for a Qwen3-0.6B-shaped model (matmuls only).
// Build in a Release build dir without sanitizers:
//   cmake -S . -B build-rel -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHOAL_TESTS=OFF -DSHOAL_CUDA=OFF
//   cmake --build build-rel --target cpu_kernels && build-rel/bench/cpu_kernels
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <sys/mman.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "tensor/quant.h"

namespace {

using namespace shoal;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool g_huge_pages = false;  // --huge-pages

// 2 MiB-aligned memory, advised to use transparent huge pages when --huge-pages is given.
struct Aligned {
  static constexpr size_t kAlign = size_t(2) << 20;
  std::unique_ptr<uint8_t, decltype(&std::free)> p{nullptr, &std::free};
  explicit Aligned(size_t bytes) {
    const size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
    p.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, size)));
    if (!p) {
      fmt::print(stderr, "out of memory ({} bytes)\n", size);
      std::exit(1);
    }
    if (g_huge_pages) madvise(p.get(), size, MADV_HUGEPAGE);
    std::memset(p.get(), 1, bytes);  // touch every page
  }
  uint8_t* get() const { return p.get(); }
};

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t n) {
  __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    acc0 = _mm256_xor_si256(acc0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    acc1 = _mm256_xor_si256(acc1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    acc2 = _mm256_xor_si256(acc2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    acc3 = _mm256_xor_si256(acc3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i a = _mm256_xor_si256(_mm256_xor_si256(acc0, acc1), _mm256_xor_si256(acc2, acc3));
  return uint64_t(_mm256_extract_epi64(a, 0) ^ _mm256_extract_epi64(a, 3));
}
#endif

uint64_t read_plain(const uint8_t* p, size_t n) {
  uint64_t acc = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    acc ^= v;
  }
  return acc;
}

// Streams `bytes` of memory with every thread of the pool, `reps` times; returns the best GB/s.
double read_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  Aligned buf(bytes);
  const int64_t chunks = 256;
  const size_t chunk = bytes / size_t(chunks) / 128 * 128;
  const bool avx2 = cpu_isa_supported() >= CpuIsa::kAvx2;
  std::vector<uint64_t> sink(static_cast<size_t>(chunks));
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    pool.parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const uint8_t* p = buf.get() + size_t(c) * chunk;
#if defined(__x86_64__)
        sink[size_t(c)] = avx2 ? read_avx2(p, chunk) : read_plain(p, chunk);
#else
        sink[size_t(c)] = read_plain(p, chunk);
#endif
      }
    });
    best = std::max(best, double(chunk) * chunks / seconds_since(t0) / 1e9);
  }
  uint64_t x = 0;
  for (uint64_t v : sink) x ^= v;
  if (x == 42) fmt::print(stderr, " ");  // keeps the reads alive
  return best;
}

// Weight tensors of one dtype and shape, enough copies that cycling through them streams
// >= `min_bytes` so they come from memory, not the last-level cache.
struct WeightSet {
  std::vector<Aligned> copies;
  std::vector<Tensor> tensors;
  uint64_t bytes_each = 0;
};

WeightSet make_weights(DType dt, int64_t out, int64_t in, uint64_t min_bytes, std::mt19937& rng) {
  WeightSet s;
  s.bytes_each = *dtype_bytes(dt, out * in);
  const size_t n_copies = size_t(std::max<uint64_t>(1, (min_bytes + s.bytes_each - 1) / s.bytes_each));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(in));
  for (size_t c = 0; c < n_copies; ++c) {
    s.copies.emplace_back(s.bytes_each);
    uint8_t* dst = s.copies.back().get();
    const uint64_t row_bytes = s.bytes_each / uint64_t(out);
    // Random rows are costly to quantize for 151936 x 1024; 64 distinct rows repeat.
    for (int64_t r = 0; r < std::min<int64_t>(out, 64); ++r) {
      for (auto& v : row) v = nd(rng);
      uint8_t* d = dst + uint64_t(r) * row_bytes;
      switch (dt) {
        case DType::kF32: std::memcpy(d, row.data(), row_bytes); break;
        case DType::kF16:
          for (int64_t k = 0; k < in; ++k) {
            const uint16_t h = f32_to_f16(row[size_t(k)]);
            std::memcpy(d + 2 * k, &h, 2);
          }
          break;
        case DType::kBF16:
          for (int64_t k = 0; k < in; ++k) {
            const uint16_t h = f32_to_bf16(row[size_t(k)]);
            std::memcpy(d + 2 * k, &h, 2);
          }
          break;
        case DType::kQ8_0: quantize_q8_0(row.data(), reinterpret_cast<BlockQ8_0*>(d), in); break;
        default: quantize_q4_0(row.data(), reinterpret_cast<BlockQ4_0*>(d), in); break;
      }
    }
    for (int64_t r = 64; r < out; ++r) std::memcpy(dst + uint64_t(r) * row_bytes, dst + uint64_t(r % 64) * row_bytes, row_bytes);
    s.tensors.push_back(Tensor::make(dst, dt, {out, in}));
  }
  return s;
}

// Median seconds of one matmul over at least `min_time` seconds (cycling the weight copies).
double time_matmul(ThreadPool& pool, WeightSet& ws, int64_t n, int64_t in, int64_t out, double min_time) {
  std::vector<float> x(size_t(n * in)), y(size_t(n * out));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  Tensor xt = Tensor::make(x.data(), DType::kF32, {n, in});
  Tensor yt = Tensor::make(y.data(), DType::kF32, {n, out});
  for (auto& w : ws.tensors) fast_matmul(pool, w, xt, yt, nullptr);  // warm up
  std::vector<double> times;
  const auto start = Clock::now();
  size_t i = 0;
  while (seconds_since(start) < min_time || times.size() < 5) {
    const auto t0 = Clock::now();
    fast_matmul(pool, ws.tensors[i++ % ws.tensors.size()], xt, yt, nullptr);
    times.push_back(seconds_since(t0));
  }
  std::nth_element(times.begin(), times.begin() + long(times.size() / 2), times.end());
  return times[times.size() / 2];
}

struct Shape {
  const char* name;
  int64_t out, in;
  int per_layer;  // how many of this matmul one Qwen3-0.6B layer runs (0: once per token)
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fast CPU kernel benchmark: memory bandwidth, GEMV GB/s, GEMM GFLOP/s"};
  std::vector<int> threads{1, 2};
  std::vector<std::string> dtypes{"Q8_0", "Q4_0", "F16", "BF16", "F32"};
  double min_time = 0.3;
  int64_t gemm_n = 128;
  app.add_option("--threads", threads, "thread counts to measure");
  app.add_option("--dtypes", dtypes, "weight dtypes");
  app.add_option("--min-time", min_time, "seconds per measurement");
  app.add_option("--gemm-n", gemm_n, "tokens per GEMM");
  app.add_flag("--huge-pages", g_huge_pages, "madvise(MADV_HUGEPAGE) the buffers (transparent huge pages)");
  CLI11_PARSE(app, argc, argv);

  const int n_layers = 28;
  const Shape shapes[] = {{"k/v 1024x1024", 1024, 1024, 2}, {"q 2048x1024", 2048, 1024, 1},
                          {"o 1024x2048", 1024, 2048, 1},   {"gate/up 3072x1024", 3072, 1024, 2},
                          {"down 1024x3072", 1024, 3072, 1}, {"lm_head 151936x1024", 151936, 1024, 0}};
  fmt::print("cpu kernels: {} (supported {}), {} hardware threads, huge pages {}\n", cpu_isa_name(cpu_isa()),
             cpu_isa_name(cpu_isa_supported()), std::thread::hardware_concurrency(), g_huge_pages ? "advised" : "off");
  std::mt19937 rng(42);
  for (int nt : threads) {
    ThreadPool pool(nt);
    fmt::print("\n== {} thread(s)\nmemory read bandwidth (1 GiB streamed): {:.1f} GB/s\n", nt,
               read_bandwidth(pool, size_t(1) << 30, 5));
    for (const auto& dname : dtypes) {
      const auto dt = dtype_from_name(dname);
      if (!dt || !dtype_is_native(*dt)) {
        fmt::print("skipping dtype {}\n", dname);
        continue;
      }
      double decode_s = 0, prefill_s = 0;
      for (const Shape& s : shapes) {
        WeightSet ws = make_weights(*dt, s.out, s.in, uint64_t(256) << 20, rng);
        const double tv = time_matmul(pool, ws, 1, s.in, s.out, min_time);
        fmt::print("{:5} GEMV {:22} {:8.1f} us  {:6.1f} GB/s\n", dname, s.name, tv * 1e6, double(ws.bytes_each) / tv / 1e9);
        decode_s += s.per_layer ? tv * s.per_layer * n_layers : tv;
        if (s.per_layer) {
          WeightSet wg = make_weights(*dt, s.out, s.in, 0, rng);
          const double tg = time_matmul(pool, wg, gemm_n, s.in, s.out, min_time);
          fmt::print("{:5} GEMM {:22} n={:<4} {:8.1f} us  {:6.1f} GFLOP/s\n", dname, s.name, gemm_n, tg * 1e6,
                     2.0 * double(s.out * s.in * gemm_n) / tg / 1e9);
          prefill_s += tg * s.per_layer * n_layers;
        }
      }
      fmt::print("{:5} Qwen3-0.6B shapes, matmuls only: decode {:.1f} tok/s, prefill (n={}) {:.1f} tok/s\n", dname,
                 1.0 / decode_s, gemm_n, double(gemm_n) / prefill_s);
    }
  }
  return 0;
}
