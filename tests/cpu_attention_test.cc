// fast_attention against a naive double-precision attention written here (cache rows decoded
// with tensor/quant.h), for F32 / F16 / Q8_0 caches x every ISA level this CPU has x GQA,
// sliding window, softcap and odd head sizes; plus bitwise determinism across thread counts and
// batch sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention_fast.h"
#include "core/half.h"
#include "tensor/quant.h"
#include "cpu_test_util.h"

namespace shoal {
namespace {

struct Cache {
  DType dtype;
  int64_t rows, width;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // exactly what the bytes hold
  Tensor tensor() { return Tensor::make(bytes.data(), dtype, {rows, width}); }
};

Cache make_cache(DType dt, int64_t rows, int64_t width, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows * width));
  for (auto& f : v) f = nd(rng);
  Cache c{dt, rows, width, std::vector<uint8_t>(*dtype_bytes(dt, rows * width)), std::vector<float>(v.size())};
  if (dt == DType::kF32) {
    std::memcpy(c.bytes.data(), v.data(), v.size() * 4);
  } else if (dt == DType::kF16) {
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = f32_to_f16(v[i]);
      std::memcpy(c.bytes.data() + 2 * i, &h, 2);
    }
  } else {
    quantize_q8_0(v.data(), reinterpret_cast<BlockQ8_0*>(c.bytes.data()), rows * width);
  }
  EXPECT_TRUE(dequantize(dt, c.bytes.data(), c.values.data(), rows * width).ok());
  return c;
}

// Plain softmax attention in double, straight from the definition in backend.h.
std::vector<double> reference(const std::vector<float>& q, const Cache& k, const Cache& v,
                              const std::vector<int32_t>& pos, const AttentionSpec& s) {
  const int64_t n = int64_t(pos.size()), hd = s.head_dim, qw = int64_t(s.n_heads) * hd;
  const int group = s.n_heads / s.n_kv_heads;
  std::vector<double> out(size_t(n * qw));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t last = pos[size_t(t)];
    const int64_t first = s.sliding_window > 0 ? std::max<int64_t>(0, last - s.sliding_window + 1) : 0;
    for (int h = 0; h < s.n_heads; ++h) {
      const int64_t off = int64_t(h / group) * hd;
      std::vector<double> sc;
      double mx = -1e300;
      for (int64_t j = first; j <= last; ++j) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += double(q[size_t(t * qw + h * hd + i)]) * k.values[size_t(j * k.width + off + i)];
        d *= s.scale;
        if (s.softcap > 0) d = s.softcap * std::tanh(d / s.softcap);
        sc.push_back(d);
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (double& d : sc) sum += (d = std::exp(d - mx));
      for (int64_t j = first; j <= last; ++j)
        for (int64_t i = 0; i < hd; ++i)
          out[size_t(t * qw + h * hd + i)] += sc[size_t(j - first)] / sum * v.values[size_t(j * v.width + off + i)];
    }
  }
  return out;
}

std::vector<float> run(ThreadPool& pool, CpuIsa isa, std::vector<float>& q, Cache& k, Cache& v,
                       std::vector<int32_t>& pos, const AttentionSpec& s) {
  const int64_t n = int64_t(pos.size()), qw = int64_t(s.n_heads) * s.head_dim;
  std::vector<float> out(static_cast<size_t>(n * qw), std::numeric_limits<float>::quiet_NaN());  // poison
  Tensor qt = Tensor::make(q.data(), DType::kF32, {n, qw});
  Tensor ot = Tensor::make(out.data(), DType::kF32, {n, qw});
  Tensor pt = Tensor::make(pos.data(), DType::kI32, {n});
  Tensor kt = k.tensor(), vt = v.tensor();
  fast_attention_isa(pool, isa, qt, kt, vt, pt, s, ot);
  return out;
}

struct AttnCase {
  int n_heads, n_kv_heads, head_dim;
  int window;
  float softcap;
  int64_t n, first_pos;  // queries at first_pos .. first_pos + n - 1
};

const DType kCacheTypes[] = {DType::kF32, DType::kF16, DType::kQ8_0};

TEST(CpuAttention, MatchesDoubleReference) {
  // head_dim 80: Q8_0 head slices that start inside a block; positions past 64 and 128 cross the
  // kernel's key chunks; window 20 and 100; softcap 30 (Gemma 2's value).
  const AttnCase cases[] = {{4, 2, 64, 0, 0.0f, 1, 0},    {4, 2, 64, 0, 0.0f, 7, 130}, {2, 2, 32, 0, 0.0f, 16, 0},
                        {6, 2, 80, 0, 0.0f, 3, 70},   {8, 1, 64, 20, 0.0f, 16, 90}, {4, 4, 64, 100, 0.0f, 2, 140},
                        {4, 2, 64, 0, 30.0f, 5, 60},  {2, 1, 96, 33, 30.0f, 7, 40}};
  std::mt19937 rng(2024);
  ThreadPool pool(2);
  double worst = 0;
  for (CpuIsa isa : test::supported_isas()) {
    for (DType dt : kCacheTypes) {
      for (const AttnCase& c : cases) {
        AttentionSpec s{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)), c.window, c.softcap};
        const int64_t ctx = c.first_pos + c.n + 3, width = int64_t(c.n_kv_heads) * c.head_dim;
        Cache k = make_cache(dt, ctx, width, rng), v = make_cache(dt, ctx, width, rng);
        std::normal_distribution<float> nd(0.0f, 1.5f);
        std::vector<float> q(static_cast<size_t>(c.n * c.n_heads * c.head_dim));
        for (auto& f : q) f = nd(rng);
        std::vector<int32_t> pos;
        for (int64_t i = 0; i < c.n; ++i) pos.push_back(int32_t(c.first_pos + i));
        const auto out = run(pool, isa, q, k, v, pos, s);
        const auto ref = reference(q, k, v, pos, s);
        // Outputs are convex combinations of V rows (|v| ~ 1): absolute error is the measure.
        double err = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_TRUE(std::isfinite(out[i])) << i;
          err = std::max(err, std::fabs(out[i] - ref[i]));
        }
        worst = std::max(worst, err);
        EXPECT_LE(err, 1e-5) << cpu_isa_name(isa) << " " << dtype_name(dt) << " heads " << c.n_heads << "/"
                             << c.n_kv_heads << " hd " << c.head_dim << " n " << c.n << " pos " << c.first_pos;
      }
    }
  }
  std::printf("largest absolute error: %.3g\n", worst);
}

TEST(CpuAttention, DeterministicOverThreadsAndBatch) {
  std::mt19937 rng(7);
  ThreadPool p1(1), p2(2), p3(3);
  for (CpuIsa isa : test::supported_isas()) {
    for (DType dt : kCacheTypes) {
      AttentionSpec s{6, 2, 64, 0.125f, 0, 0.0f};
      const int64_t n = 9, ctx = 150, qw = 6 * 64;
      Cache k = make_cache(dt, ctx, 128, rng), v = make_cache(dt, ctx, 128, rng);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> q(static_cast<size_t>(n * qw));
      for (auto& f : q) f = nd(rng);
      std::vector<int32_t> pos;
      for (int64_t i = 0; i < n; ++i) pos.push_back(int32_t(60 + 10 * i));
      const auto o1 = run(p1, isa, q, k, v, pos, s);
      const auto o2 = run(p2, isa, q, k, v, pos, s);
      const auto o3 = run(p3, isa, q, k, v, pos, s);
      EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * 4), 0) << cpu_isa_name(isa) << dtype_name(dt);
      EXPECT_EQ(std::memcmp(o1.data(), o3.data(), o1.size() * 4), 0) << cpu_isa_name(isa) << dtype_name(dt);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> qi(q.begin() + t * qw, q.begin() + (t + 1) * qw);
        std::vector<int32_t> pi{pos[size_t(t)]};
        const auto oi = run(p2, isa, qi, k, v, pi, s);
        EXPECT_EQ(std::memcmp(oi.data(), o1.data() + t * qw, size_t(qw) * 4), 0)
            << cpu_isa_name(isa) << " " << dtype_name(dt) << " query " << t;
      }
    }
  }
}

}  // namespace
}  // namespace shoal
