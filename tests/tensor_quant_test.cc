// Quantization: every quantized tensor of ../shared/fixtures/quant/q-<TYPE>.gguf dequantizes bit
// for bit to llama.cpp's values (q-<TYPE>.dequant.safetensors, first 16 rows); hand-computed
// blocks (expected values worked out from the format definitions in ggml-common.h / gguf-py
// quants.py, not printed by the code); f16/bf16 edge cases; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "core/half.h"
#include "format/model_file.h"
#include "format/safetensors.h"
#include "tensor/quant.h"
#include "test_util.h"

namespace shoal {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class QuantFixture : public ::testing::TestWithParam<std::pair<const char*, DType>> {};

// The first 16 rows of each of the 16 quantized matrices equal llama.cpp's dequantization exactly,
// and every whole tensor converts to Q8_0 (the 16 rows as quantize_q8_0 of those exact values).
TEST_P(QuantFixture, DequantizesBitExactAndConverts) {
  const auto [name, dtype] = GetParam();
  const std::string base = test::fixture(std::string("quant/q-") + name);
  auto model = open_model_file(base + ".gguf");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const auto st_bytes = read_file(base + ".dequant.safetensors");
  ASSERT_FALSE(st_bytes.empty()) << base << ".dequant.safetensors";
  auto ref = parse_safetensors(st_bytes.data(), st_bytes.size(), base);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();

  int checked = 0;
  for (const TensorInfo& info : model->index.tensors()) {
    if (info.dtype == DType::kF32) continue;
    ASSERT_EQ(info.dtype, dtype) << info.name;
    const TensorInfo* expect = nullptr;
    for (const auto& e : ref->tensors)
      if (e.name == info.name) expect = &e;
    ASSERT_NE(expect, nullptr) << info.name << " missing from the dequant file";
    const int64_t cols = info.cols(), rows = 16;
    ASSERT_EQ(expect->n_elements(), rows * cols) << info.name;

    std::vector<uint8_t> bytes(info.nbytes);
    ASSERT_TRUE(model->sources[info.source]->read(info.offset, bytes.data(), info.nbytes).ok());
    std::vector<float> got(size_t(rows * cols));
    ASSERT_TRUE(dequantize(dtype, bytes.data(), got.data(), rows * cols).ok()) << info.name;
    const uint8_t* want = st_bytes.data() + expect->offset;
    for (int64_t i = 0; i < rows * cols; ++i) {
      uint32_t g, w;
      std::memcpy(&g, &got[size_t(i)], 4);
      std::memcpy(&w, want + 4 * i, 4);
      ASSERT_EQ(g, w) << name << " " << info.name << " value " << i;
    }

    std::vector<BlockQ8_0> q8(size_t(info.n_elements() / 32));
    ASSERT_TRUE(convert_to_q8_0(dtype, bytes.data(), q8.data(), info.n_elements()).ok()) << info.name;
    std::vector<float> ref_f(size_t(rows * cols));
    std::memcpy(ref_f.data(), want, ref_f.size() * 4);
    std::vector<BlockQ8_0> q8_ref(ref_f.size() / 32);
    quantize_q8_0(ref_f.data(), q8_ref.data(), rows * cols);
    ASSERT_EQ(std::memcmp(q8.data(), q8_ref.data(), q8_ref.size() * sizeof(BlockQ8_0)), 0) << info.name;
    ++checked;
  }
  EXPECT_EQ(checked, 16);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, QuantFixture,
    ::testing::Values(std::pair{"Q4_0", DType::kQ4_0}, std::pair{"Q4_1", DType::kQ4_1}, std::pair{"Q5_0", DType::kQ5_0},
                      std::pair{"Q5_1", DType::kQ5_1}, std::pair{"Q8_0", DType::kQ8_0}, std::pair{"Q2_K", DType::kQ2_K},
                      std::pair{"Q3_K_M", DType::kQ3_K}, std::pair{"Q4_K_M", DType::kQ4_K},
                      std::pair{"Q5_K_M", DType::kQ5_K}, std::pair{"Q6_K", DType::kQ6_K}),
    [](const auto& info) { return std::string(info.param.first); });

TEST(Quant, Q8_0HandBlock) {
  BlockQ8_0 b;
  b.d = 0x3800;  // f16 0.5
  for (int j = 0; j < 32; ++j) b.qs[j] = int8_t(j * 8 - 128);  // -128, -120, ..., 120
  float y[32];
  ASSERT_TRUE(dequantize(DType::kQ8_0, &b, y, 32).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], float(j * 8 - 128) * 0.5f) << j;
  EXPECT_EQ(y[0], -64.0f);
  EXPECT_EQ(y[31], 60.0f);
}

TEST(Quant, Q4_0HandBlock) {
  BlockQ4_0 b;
  b.d = 0x4000;  // f16 2.0
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  float y[32];
  ASSERT_TRUE(dequantize(DType::kQ4_0, &b, y, 32).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], float((j - 8) * 2)) << j;             // low nibble -> value j
    EXPECT_EQ(y[j + 16], float((15 - j - 8) * 2)) << j;   // high nibble -> value j + 16
  }
}

TEST(Quant, Q5_0HighBits) {
  // d = 1, all nibbles 0, qh bit i set for odd i: value = (16 if bit set) - 16.
  uint8_t blk[22] = {};
  blk[0] = 0x00, blk[1] = 0x3c;  // f16 1.0
  const uint32_t qh = 0xAAAAAAAAu;
  std::memcpy(blk + 2, &qh, 4);
  float y[32];
  ASSERT_TRUE(dequantize(DType::kQ5_0, blk, y, 32).ok());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], (i % 2) ? 0.0f : -16.0f) << i;
}

TEST(Quant, Q4_1AddsMin) {
  uint8_t blk[20] = {};
  blk[0] = 0x00, blk[1] = 0x40;  // d = 2
  blk[2] = 0x00, blk[3] = 0xbc;  // m = -1
  for (int j = 0; j < 16; ++j) blk[4 + j] = uint8_t(3 | (5 << 4));
  float y[32];
  ASSERT_TRUE(dequantize(DType::kQ4_1, blk, y, 32).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 5.0f);
    EXPECT_EQ(y[j + 16], 9.0f);
  }
}

TEST(Quant, Q4_KUnitScales) {
  // d = 1, dmin = 0.5, every 6-bit scale 1 and min 2 (groups 0-3 in bytes 0-7 low bits; groups
  // 4-7 in bytes 8-11: scale low nibble, min high nibble; their high bits 0): y = q - 1.
  uint8_t blk[144] = {};
  blk[0] = 0x00, blk[1] = 0x3c;  // d = 1
  blk[2] = 0x00, blk[3] = 0x38;  // dmin = 0.5
  for (int j = 0; j < 4; ++j) blk[4 + j] = 1, blk[4 + 4 + j] = 2, blk[4 + 8 + j] = 0x21;
  for (int l = 0; l < 128; ++l) blk[16 + l] = uint8_t((l % 16) | (((l + 1) % 16) << 4));
  std::vector<float> y(256);
  ASSERT_TRUE(dequantize(DType::kQ4_K, blk, y.data(), 256).ok());
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      const int byte = 32 * g + l;
      EXPECT_EQ(y[size_t(64 * g + l)], float(byte % 16) - 1.0f) << g << " " << l;
      EXPECT_EQ(y[size_t(64 * g + 32 + l)], float((byte + 1) % 16) - 1.0f) << g << " " << l;
    }
  }
}

TEST(Quant, Q6_KConstant) {
  // d = 0.25, scales[k] = k + 1, ql = 0xFF, qh = 0xFF -> every q = 63 - 32 = 31.
  // Value 16 * k + i uses scale k: y = 0.25 * (k + 1) * 31.
  uint8_t blk[210];
  std::memset(blk, 0xFF, 192);
  for (int k = 0; k < 16; ++k) blk[192 + k] = uint8_t(k + 1);
  blk[208] = 0x00, blk[209] = 0x34;  // 0.25
  std::vector<float> y(256);
  ASSERT_TRUE(dequantize(DType::kQ6_K, blk, y.data(), 256).ok());
  for (int v = 0; v < 256; ++v) {
    // Within each 128-half, value 32 * s + l (s = 0..3) has scale index 8 * half + 2 * s + l / 16.
    const int half = v / 128, s = (v % 128) / 32, l = v % 32;
    const int k = 8 * half + 2 * s + l / 16;
    EXPECT_EQ(y[size_t(v)], 0.25f * float(k + 1) * 31.0f) << v;
  }
}

TEST(Quant, F16EdgeCases) {
  const uint16_t in[] = {0x0001, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0x7c00, 0xfc00, 0x8000, 0x3555, 0xc000};
  const float expect[] = {std::ldexp(1.0f, -24),
                          1023.0f * std::ldexp(1.0f, -24),
                          std::ldexp(1.0f, -14),
                          1.0f,
                          65504.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          -0.0f,
                          0.333251953125f,
                          -2.0f};
  float y[10];
  ASSERT_TRUE(dequantize(DType::kF16, in, y, 10).ok());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(bits_of(y[i]), bits_of(expect[i])) << i;
  const uint16_t nan = 0x7e00;
  ASSERT_TRUE(dequantize(DType::kF16, &nan, y, 1).ok());
  EXPECT_TRUE(std::isnan(y[0]));
}

TEST(Quant, Bf16EdgeCases) {
  const uint16_t in[] = {0x3f80, 0x0001, 0x7f80, 0xff80, 0xc040, 0x8000};
  const float expect[] = {1.0f, std::ldexp(1.0f, -133), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), -3.0f, -0.0f};
  float y[6];
  ASSERT_TRUE(dequantize(DType::kBF16, in, y, 6).ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(bits_of(y[i]), bits_of(expect[i])) << i;
  const uint16_t nan = 0x7fc0;
  ASSERT_TRUE(dequantize(DType::kBF16, &nan, y, 1).ok());
  EXPECT_TRUE(std::isnan(y[0]));
}

TEST(Quant, QuantizeQ8_0RoundsHalfAwayFromZero) {
  // amax = 127 -> d = 1 exactly, id = 1: q = round(x), ties away from zero (roundf).
  float x[32] = {};
  x[0] = 127.0f, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.49f, x[4] = -126.6f, x[5] = 3.5f;
  BlockQ8_0 b;
  quantize_q8_0(x, &b, 32);
  EXPECT_EQ(b.d, 0x3c00);
  const int expect[6] = {127, 3, -3, 0, -127, 4};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(b.qs[i], expect[i]) << i;
  for (int i = 6; i < 32; ++i) EXPECT_EQ(b.qs[i], 0);
}

TEST(Quant, QuantizeQ8_0ScaleRoundsToF16) {
  // amax = 127 * (1 + 2^-11) -> d = 1 + 2^-11, a tie between f16 1.0 and 1.0009765625: to even.
  float x[32] = {};
  x[7] = -127.0f * (1.0f + std::ldexp(1.0f, -11));
  BlockQ8_0 b;
  quantize_q8_0(x, &b, 32);
  EXPECT_EQ(b.d, 0x3c00);
  EXPECT_EQ(b.qs[7], -127);
}

TEST(Quant, QuantizeQ8_0AllZero) {
  float x[64] = {};
  BlockQ8_0 b[2];
  quantize_q8_0(x, b, 64);
  for (const auto& blk : b) {
    EXPECT_EQ(blk.d, 0);
    for (int8_t q : blk.qs) EXPECT_EQ(q, 0);
  }
}

TEST(Quant, QuantizeQ4_0) {
  // Largest magnitude is 16 (positive) -> d = 16 / -8 = -2, id = -0.5; q = trunc(x * id + 8.5)
  // clamped to 15: 16 -> 0, -14 -> 15, -16 -> 16 -> 15, 1 -> 8, 3 -> 7.
  float x[32] = {};
  x[0] = 1.0f, x[5] = 16.0f, x[6] = -14.0f, x[20] = -16.0f, x[21] = 3.0f;
  BlockQ4_0 b;
  quantize_q4_0(x, &b, 32);
  EXPECT_EQ(b.d, 0xc000);  // -2
  auto q = [&](int i) { return i < 16 ? (b.qs[i] & 0xF) : (b.qs[i - 16] >> 4); };
  EXPECT_EQ(q(0), 8);
  EXPECT_EQ(q(5), 0);
  EXPECT_EQ(q(6), 15);
  EXPECT_EQ(q(20), 15);
  EXPECT_EQ(q(21), 7);
  EXPECT_EQ(q(1), 8);  // zeros -> 8
  // The first of equal magnitudes decides the sign: -16 at 0 before +16 at 1 -> d = +2.
  float y[32] = {};
  y[0] = -16.0f, y[1] = 16.0f;
  quantize_q4_0(y, &b, 32);
  EXPECT_EQ(b.d, 0x4000);
}

TEST(Quant, NonFiniteInputDoesNotCrash) {
  float x[32] = {};
  x[3] = std::numeric_limits<float>::infinity();
  x[4] = std::numeric_limits<float>::quiet_NaN();
  BlockQ8_0 b;
  quantize_q8_0(x, &b, 32);
  BlockQ4_0 c;
  quantize_q4_0(x, &c, 32);
}

TEST(Quant, ConvertQ8_0IsACopy) {
  std::vector<BlockQ8_0> src(3);
  for (int i = 0; i < 3; ++i) {
    src[size_t(i)].d = uint16_t(0x3000 + i);
    for (int j = 0; j < 32; ++j) src[size_t(i)].qs[j] = int8_t(i * 7 - j);
  }
  std::vector<BlockQ8_0> dst(3);
  ASSERT_TRUE(convert_to_q8_0(DType::kQ8_0, src.data(), dst.data(), 96).ok());
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), 3 * sizeof(BlockQ8_0)), 0);
}

TEST(Quant, ConvertQ4_0ToQ8_0) {
  // Q4_0 values (q - 8) * 2 span -16..14: amax 16, d = 16/127; the Q8_0 round trip of an exact
  // multiple of d' gives back the same values within half a step.
  BlockQ4_0 b;
  b.d = 0x4000;
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | ((15 - j) << 4));
  BlockQ8_0 q;
  ASSERT_TRUE(convert_to_q8_0(DType::kQ4_0, &b, &q, 32).ok());
  EXPECT_EQ(q.d, f32_to_f16(16.0f / 127.0f));
  EXPECT_EQ(q.qs[0], -127);  // value -16
  float back[32];
  ASSERT_TRUE(dequantize(DType::kQ8_0, &q, back, 32).ok());
  for (int j = 0; j < 16; ++j) EXPECT_NEAR(back[j], float((j - 8) * 2), 0.08f) << j;
}

TEST(Quant, Errors) {
  float y[256];
  uint8_t blk[256] = {};
  EXPECT_EQ(dequantize(DType::kQ4_K, blk, y, 100).code(), Code::kInvalidArgument);
  EXPECT_EQ(dequantize(DType::kQ8_0, blk, y, 33).code(), Code::kInvalidArgument);
  EXPECT_EQ(dequantize(DType::kIQ2_XXS, blk, y, 256).code(), Code::kUnsupported);
  EXPECT_EQ(dequantize(DType(99), blk, y, 32).code(), Code::kUnsupported);
  BlockQ8_0 q[8];
  EXPECT_EQ(convert_to_q8_0(DType::kQ6_K, blk, q, 128).code(), Code::kInvalidArgument);
  EXPECT_EQ(convert_to_q8_0(DType::kIQ4_NL, blk, q, 32).code(), Code::kUnsupported);
}

}  // namespace
}  // namespace shoal
