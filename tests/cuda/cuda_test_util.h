// Helpers of the GPU tests: a fixture holding the CUDA backend under test and the CPU reference
// backend (the oracle), tensors made on both from the same fresh random host bytes, GPU outputs
// poisoned with NaN before each op, and the normalised error ||gpu - ref|| / ||ref||.
// Tests skip (GTEST_SKIP) when no CUDA device is present, so CI without a GPU passes.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "tensor/quant.h"

namespace shoal::test {

/// The same tensor on the reference (c) and the CUDA (g) backend.
struct Dual {
  Tensor c, g;
  /// The CUDA tensor if `gpu`, else the reference one.
  Tensor* on(bool gpu) { return gpu ? &g : &c; }
};

class CudaVsRef : public ::testing::Test {
 protected:
  void SetUp() override {
    auto g = create_backend("cuda:0");
    if (!g.ok()) GTEST_SKIP() << "no CUDA device: " << g.status().to_string();
    gpu_ = std::move(*g);
    auto c = create_backend("cpu-ref");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    cpu_ = std::move(*c);
    // Fresh inputs each run; SHOAL_TEST_SEED replays a printed seed.
    const char* fixed = std::getenv("SHOAL_TEST_SEED");
    const uint32_t seed = fixed ? uint32_t(std::strtoul(fixed, nullptr, 10)) : std::random_device{}();
    rng_.seed(seed);
    RecordProperty("seed", int(seed));
    std::printf("[ seed     ] %u\n", seed);
  }
  /// Replaces gpu_ with a CUDA backend with BackendOptions::half_prefill (`--prefill-precision
  /// half`); from a SetUp, before any allocation.
  void use_half_prefill() {
    BackendOptions o;
    o.half_prefill = true;
    auto g = create_backend("cuda:0", o);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    gpu_ = std::move(*g);
  }
  void TearDown() override {
    if (!gpu_) return;
    EXPECT_TRUE(gpu_->synchronize().ok()) << gpu_->synchronize().to_string();
    for (auto& d : owned_) {
      cpu_->free(d.c);
      gpu_->free(d.g);
    }
  }

  std::vector<float> randn(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& f : v) f = nd(rng_);
    return v;
  }

  /// File-layout bytes of dtype t holding (a rounding of) the values v.
  static std::vector<uint8_t> encode(DType t, const std::vector<float>& v) {
    std::vector<uint8_t> b(*dtype_bytes(t, int64_t(v.size())));
    switch (t) {
      case DType::kF32:
        std::memcpy(b.data(), v.data(), v.size() * 4);
        break;
      case DType::kF16:
      case DType::kBF16:
        for (size_t i = 0; i < v.size(); ++i) {
          const uint16_t h = t == DType::kF16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
          std::memcpy(b.data() + 2 * i, &h, 2);
        }
        break;
      case DType::kQ8_0:
        quantize_q8_0(v.data(), reinterpret_cast<BlockQ8_0*>(b.data()), int64_t(v.size()));
        break;
      case DType::kQ4_0:
        quantize_q4_0(v.data(), reinterpret_cast<BlockQ4_0*>(b.data()), int64_t(v.size()));
        break;
      default:
        ADD_FAILURE() << "encode " << dtype_name(t);
    }
    return b;
  }

  /// A tensor with the given bytes on both backends (a weight: alloc_weight + upload_weight).
  Dual make(DType t, std::initializer_list<int64_t> shape, const void* bytes, bool weight = false) {
    Dual d;
    auto c = weight ? cpu_->alloc_weight(t, shape) : cpu_->alloc(t, shape);
    auto g = weight ? gpu_->alloc_weight(t, shape) : gpu_->alloc(t, shape);
    EXPECT_TRUE(c.ok() && g.ok()) << c.status().to_string() << " " << g.status().to_string();
    if (!c.ok() || !g.ok()) return d;
    d.c = *c;
    d.g = *g;
    owned_.push_back(d);
    if (weight) {
      EXPECT_TRUE(cpu_->upload_weight(d.c, bytes, d.c.nbytes()).ok());
      const Status s = gpu_->upload_weight(d.g, bytes, d.g.nbytes());
      EXPECT_TRUE(s.ok()) << s.to_string();
    } else {
      EXPECT_TRUE(cpu_->to_device(d.c, bytes, d.c.nbytes(), 0).ok());
      EXPECT_TRUE(gpu_->to_device(d.g, bytes, d.g.nbytes(), 0).ok());
    }
    return d;
  }
  Dual make_f32(std::initializer_list<int64_t> shape, const std::vector<float>& v) {
    return make(DType::kF32, shape, v.data());
  }
  Dual make_i32(const std::vector<int32_t>& v) { return make(DType::kI32, {int64_t(v.size())}, v.data()); }
  /// A weight of random N(0, 1) values in dtype t.
  Dual make_weight(DType t, std::initializer_list<int64_t> shape, float scale = 1.0f) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    const auto bytes = encode(t, randn(n, scale));
    return make(t, shape, bytes.data(), true);
  }
  /// An output tensor on both backends; the GPU copy is filled with NaN (0xff bytes).
  Dual output(DType t, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<uint8_t> poison(*dtype_bytes(t, n), 0xff);
    return make(t, shape, poison.data());
  }
  void poison(Dual& d) {
    std::vector<uint8_t> p(d.g.nbytes(), 0xff);
    ASSERT_TRUE(gpu_->to_device(d.g, p.data(), p.size(), 0).ok());
  }

  std::vector<uint8_t> bytes_of(Backend& b, const Tensor& t) {
    std::vector<uint8_t> v(t.nbytes());
    const Status s = b.to_host(v.data(), t, v.size(), 0);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return v;
  }
  std::vector<float> floats(Backend& b, const Tensor& t) {
    auto bytes = bytes_of(b, t);
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
    return v;
  }

  /// ||gpu - ref|| / ||ref|| over an f32 tensor; +inf if the GPU left a NaN (unwritten element).
  double nerr(const Dual& d) {
    const auto g = floats(*gpu_, d.g), c = floats(*cpu_, d.c);
    double num = 0, den = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      if (!std::isfinite(g[i]) && std::isfinite(c[i])) return INFINITY;
      num += (double(g[i]) - c[i]) * (double(g[i]) - c[i]);
      den += double(c[i]) * c[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  }

  std::unique_ptr<Backend> cpu_, gpu_;
  std::mt19937 rng_;
  std::vector<Dual> owned_;
};

}  // namespace shoal::test
