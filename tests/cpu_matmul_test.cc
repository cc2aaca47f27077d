// fast_matmul against a naive double-precision reference written here (dequantize the weights
// with tensor/quant.h, whose output is checked bit for bit against llama.cpp's in
// tensor_quant_test, then dot in double), for every weight dtype x every ISA level this CPU has
// x odd shapes; plus bitwise determinism across thread counts and batch sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/half.h"
#include "tensor/quant.h"
#include "cpu_test_util.h"

namespace shoal {
namespace {

struct Weights {
  DType dtype;
  int64_t out, in;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // the exact values the bytes represent
  Tensor tensor() { return Tensor::make(bytes.data(), dtype, {out, in}); }
};

Weights make_weights(DType dt, int64_t out, int64_t in, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(size_t(out * in));
  for (auto& f : v) f = nd(rng);
  Weights w{dt, out, in, {}, std::vector<float>(v.size())};
  w.bytes.resize(*dtype_bytes(dt, out * in));
  switch (dt) {
    case DType::kF32: std::memcpy(w.bytes.data(), v.data(), v.size() * 4); break;
    case DType::kF16:
    case DType::kBF16:
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = dt == DType::kF16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
        std::memcpy(w.bytes.data() + 2 * i, &h, 2);
      }
      break;
    case DType::kQ8_0: quantize_q8_0(v.data(), reinterpret_cast<BlockQ8_0*>(w.bytes.data()), out * in); break;
    case DType::kQ4_0: quantize_q4_0(v.data(), reinterpret_cast<BlockQ4_0*>(w.bytes.data()), out * in); break;
    default: ADD_FAILURE() << "dtype";
  }
  EXPECT_TRUE(dequantize(dt, w.bytes.data(), w.deq.data(), out * in).ok());
  return w;
}

std::vector<float> random_vec(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& f : v) f = nd(rng);
  return v;
}

// y[t, r] = sum_k deq[r, k] * x[t, k] (+ bias[r]) in double.
std::vector<double> reference(const Weights& w, const std::vector<float>& x, int64_t n, const float* bias) {
  std::vector<double> y(size_t(n * w.out));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < w.out; ++r) {
      double s = bias ? bias[r] : 0.0;
      for (int64_t k = 0; k < w.in; ++k) s += double(w.deq[size_t(r * w.in + k)]) * x[size_t(t * w.in + k)];
      y[size_t(t * w.out + r)] = s;
    }
  return y;
}

std::vector<float> run(ThreadPool& pool, CpuIsa isa, Weights& w, std::vector<float>& x, int64_t n,
                       std::vector<float>* bias) {
  std::vector<float> y(size_t(n * w.out), std::numeric_limits<float>::quiet_NaN());  // poison
  Tensor wt = w.tensor();
  Tensor xt = Tensor::make(x.data(), DType::kF32, {n, w.in});
  Tensor yt = Tensor::make(y.data(), DType::kF32, {n, w.out});
  Tensor bt;
  if (bias) bt = Tensor::make(bias->data(), DType::kF32, {w.out});
  fast_matmul_isa(pool, isa, wt, xt, yt, bias ? &bt : nullptr);
  return y;
}

// Normalised error of each element: |y - ref| / (||w_r|| * ||x_t||), the bound of a dot
// product's magnitude (Cauchy-Schwarz), which stays meaningful when a result is near zero.
// Returns the largest over all elements.
double max_normalised_error(const std::vector<float>& y, const std::vector<double>& ref, const Weights& w,
                            const std::vector<float>& x, int64_t n, const std::string& what) {
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    double xn = 0;
    for (int64_t k = 0; k < w.in; ++k) xn += double(x[size_t(t * w.in + k)]) * x[size_t(t * w.in + k)];
    for (int64_t r = 0; r < w.out; ++r) {
      double wn = 0;
      for (int64_t k = 0; k < w.in; ++k) wn += double(w.deq[size_t(r * w.in + k)]) * w.deq[size_t(r * w.in + k)];
      const size_t i = size_t(t * w.out + r);
      EXPECT_TRUE(std::isfinite(y[i])) << what << " element " << i;
      worst = std::max(worst, std::fabs(double(y[i]) - ref[i]) / (std::sqrt(wn * xn) + 1e-30));
    }
  }
  return worst;
}

bool is_quant(DType d) { return d == DType::kQ8_0 || d == DType::kQ4_0; }

struct Shape {
  int64_t in, out, n;
  bool bias;
};

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0};

TEST(CpuMatmul, MatchesDoubleReference) {
  // in: 32, one 32-block; 288 / 1056: not multiples of 256, an odd number of 32-blocks;
  // 37 / 100: float-only odd lengths. out 1, 3, 17 (odd row groups), n 1, 2, 7, 16, 33.
  const Shape shapes[] = {{256, 1, 1, false}, {288, 3, 2, true},   {1056, 17, 7, false}, {96, 17, 16, true},
                          {288, 33, 33, false}, {32, 1, 33, true}, {512, 64, 5, false},  {100, 17, 7, true},
                          {37, 3, 2, false}};
  std::mt19937 rng(1234);
  ThreadPool pool(2);
  double worst[2] = {0, 0};
  for (CpuIsa isa : test::supported_isas()) {
    for (DType dt : kDtypes) {
      for (const Shape& s : shapes) {
        if (is_quant(dt) && s.in % 32 != 0) continue;
        Weights w = make_weights(dt, s.out, s.in, rng);
        auto x = random_vec(s.n * s.in, rng);
        auto b = random_vec(s.out, rng);
        auto y = run(pool, isa, w, x, s.n, s.bias ? &b : nullptr);
        auto ref = reference(w, x, s.n, s.bias ? b.data() : nullptr);
        const std::string what = std::string(cpu_isa_name(isa)) + " " + std::string(dtype_name(dt)) + " in=" +
                                 std::to_string(s.in) + " out=" + std::to_string(s.out) + " n=" + std::to_string(s.n);
        // Float weights: f32 FMA. Quantized weights meet 8-bit activations (matmul.h): rounding
        // x moves it by at most sqrt(32)/254 = 0.022 of ||x|| (Cauchy-Schwarz bound); random data
        // stays near 1e-3.
        const double err = max_normalised_error(y, ref, w, x, s.n, what);
        EXPECT_LE(err, is_quant(dt) ? 5e-3 : 1e-6) << what;
        worst[is_quant(dt)] = std::max(worst[is_quant(dt)], err);
      }
    }
  }
  std::printf("largest normalised error: float weights %.3g, quantized weights %.3g\n", worst[0], worst[1]);
}

TEST(CpuMatmul, ThreadCountDoesNotChangeBits) {
  std::mt19937 rng(77);
  ThreadPool p1(1), p2(2), p3(3);
  for (CpuIsa isa : test::supported_isas()) {
    for (DType dt : kDtypes) {
      Weights w = make_weights(dt, 67, 288, rng);
      for (int64_t n : {1, 7}) {
        auto x = random_vec(n * 288, rng);
        auto b = random_vec(67, rng);
        const auto y1 = run(p1, isa, w, x, n, &b);
        const auto y2 = run(p2, isa, w, x, n, &b);
        const auto y3 = run(p3, isa, w, x, n, &b);
        EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << cpu_isa_name(isa) << dtype_name(dt) << n;
        EXPECT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * 4), 0) << cpu_isa_name(isa) << dtype_name(dt) << n;
      }
    }
  }
}

TEST(CpuMatmul, BatchRowEqualsGemvOfThatRow) {
  std::mt19937 rng(99);
  ThreadPool pool(2);
  for (CpuIsa isa : test::supported_isas()) {
    for (DType dt : kDtypes) {
      const int64_t in = 1056, out = 19;
      Weights w = make_weights(dt, out, in, rng);
      for (int64_t n : {7, 33}) {
        auto x = random_vec(n * in, rng);
        const auto yb = run(pool, isa, w, x, n, nullptr);
        for (int64_t t = 0; t < n; ++t) {
          std::vector<float> xi(x.begin() + t * in, x.begin() + (t + 1) * in);
          const auto y1 = run(pool, isa, w, xi, 1, nullptr);
          EXPECT_EQ(std::memcmp(y1.data(), yb.data() + t * out, size_t(out) * 4), 0)
              << cpu_isa_name(isa) << " " << dtype_name(dt) << " n=" << n << " row " << t;
        }
      }
    }
  }
}

TEST(CpuMatmul, ZeroAndLargeActivations) {
  // A zero token (scale 0 in the 8-bit path) and a token with one huge value next to tiny ones.
  std::mt19937 rng(5);
  ThreadPool pool(2);
  for (CpuIsa isa : test::supported_isas()) {
    for (DType dt : kDtypes) {
      Weights w = make_weights(dt, 5, 64, rng);
      std::vector<float> x(128, 0.0f);
      for (int k = 64; k < 128; ++k) x[size_t(k)] = 1e-3f * float(k - 96);
      x[70] = 3e4f;
      const auto y = run(pool, isa, w, x, 2, nullptr);
      const auto ref = reference(w, x, 2, nullptr);
      for (int r = 0; r < 5; ++r) EXPECT_EQ(y[size_t(r)], 0.0f);
      for (int r = 0; r < 5; ++r) EXPECT_NEAR(y[size_t(5 + r)], ref[size_t(5 + r)], 1e-2 * std::fabs(ref[size_t(5 + r)]) + 1.0)
          << cpu_isa_name(isa) << " " << dtype_name(dt);
    }
  }
}

TEST(CpuFeatures, NamesRoundTrip) {
  for (CpuIsa i : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512})
    EXPECT_EQ(cpu_isa_from_name(cpu_isa_name(i)), i);
  EXPECT_FALSE(cpu_isa_from_name("sse9").has_value());
  EXPECT_LE(int(cpu_isa()), int(cpu_isa_supported()));
}

}  // namespace
}  // namespace shoal
