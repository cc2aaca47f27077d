// Random-weight GGUFs of real model shapes (format/synthetic_gguf.h), through GgufWriter.
#include "format/synthetic_gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "tensor/quant.h"

namespace shoal {

const SyntheticShape kQwen3_0_6B{"qwen3", 28, 1024, 3072, 16, 8, 128, 151936, 40960, 1e6f, 1e-6f, true, true};
const SyntheticShape kLlama3_8B{"llama", 32, 4096, 14336, 32, 8, 128, 128256, 8192, 500000.0f, 1e-5f, false, false};

namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: a fast hash for reproducible values
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// f32 -> f16 / bf16 bits by truncation, without branches (f32_to_f16 rounds exactly, but its
// branches mispredict on random values: ~20 ns per value). f16: |v| under 2^-14 becomes 0.
uint16_t f16_bits(float v) {
  uint32_t x;
  std::memcpy(&x, &v, 4);
  const uint32_t ax = x & 0x7fffffffu, sign = (x >> 16) & 0x8000u;
  return uint16_t(sign | (ax < 0x38800000u ? 0u : (ax >> 13) - (112u << 10)));
}
uint16_t bf16_bits(float v) {
  uint32_t x;
  std::memcpy(&x, &v, 4);
  return uint16_t(x >> 16);
}

// One generation unit: 4 values of a plain type (one hash), or one block of a quantized type.
uint64_t unit_bytes(DType dt) {
  const auto& info = dtype_info(dt);
  return uint64_t(info.type_size) * (info.block_size == 1 ? 4 : 1);
}

/// Fills unit u of `dt` (of a tensor with seed s) with values uniform in [-a, a] (plus
/// `center`): plain types at 16-bit resolution, 4 values per hash.
void make_unit(DType dt, uint64_t s, uint64_t u, float a, float center, uint8_t* out) {
  uint64_t r = mix(s ^ (u * 0x100000001b3ull));
  auto next = [&] { return r = mix(r); };
  auto uni = [&](int k) { return (float((r >> (16 * k)) & 0xffffu) / 32768.0f - 1.0f) * a + center; };
  switch (dt) {
    case DType::kF32:
      for (int k = 0; k < 4; ++k) {
        const float v = uni(k);
        std::memcpy(out + 4 * k, &v, 4);
      }
      break;
    case DType::kF16:
      for (int k = 0; k < 4; ++k) {
        const uint16_t v = f16_bits(uni(k));  // |a| < 65504 here
        std::memcpy(out + 2 * k, &v, 2);
      }
      break;
    case DType::kBF16:
      for (int k = 0; k < 4; ++k) {
        const uint16_t v = bf16_bits(uni(k));
        std::memcpy(out + 2 * k, &v, 2);
      }
      break;
    case DType::kQ8_0: {
      BlockQ8_0 blk;
      blk.d = f32_to_f16(a / 127.0f);
      for (int i = 0; i < 32; i += 8) {
        const uint64_t x = next();
        for (int k = 0; k < 8; ++k) blk.qs[i + k] = int8_t(int(uint8_t(x >> (8 * k))) % 255 - 127);
      }
      std::memcpy(out, &blk, sizeof blk);
      break;
    }
    case DType::kQ4_0: {
      BlockQ4_0 blk;
      blk.d = f32_to_f16(a / 8.0f);
      const uint64_t x = next(), y = next();
      std::memcpy(blk.qs, &x, 8);
      std::memcpy(blk.qs + 8, &y, 8);
      std::memcpy(out, &blk, sizeof blk);
      break;
    }
    default:
      SHOAL_CHECK(false, "synthetic type {} not supported", dtype_name(dt));
  }
}

ThreadPool& pool() {
  static ThreadPool p(0);  // one thread per core: an 8B F16 file is 8e9 values
  return p;
}

GgufWriter::Filler filler(DType dt, uint64_t seed, float a, float center) {
  const uint64_t ub = unit_bytes(dt);
  return [=](uint64_t offset, uint8_t* dst, uint64_t n) -> Status {
    const uint64_t end = offset + n;
    auto part = [&](uint64_t u) {  // the bytes of unit u inside [offset, end)
      uint8_t buf[64];
      make_unit(dt, seed, u, a, center, buf);
      const uint64_t b = std::max(u * ub, offset), e = std::min((u + 1) * ub, end);
      if (e > b) std::memcpy(dst + (b - offset), buf + (b - u * ub), e - b);
    };
    const uint64_t u0 = (offset + ub - 1) / ub, u1 = end / ub;  // the whole units inside
    if (offset % ub != 0) part(offset / ub);
    if (u0 > u1) return Status::Ok();  // inside one unit
    if (end % ub != 0) part(u1);
    pool().parallel_for(int64_t(u1 - u0), 4096, [&](int64_t b, int64_t e) {
      for (uint64_t u = u0 + uint64_t(b); u < u0 + uint64_t(e); ++u)
        make_unit(dt, seed, u, a, center, dst + u * ub - offset);
    });
    return Status::Ok();
  };
}

}  // namespace

Status write_synthetic_gguf(const SyntheticShape& s, DType dt, const std::string& path) {
  GgufWriter w;
  const std::string a = s.arch;
  w.set("general.architecture", MetaValue::str(a));
  w.set("general.name", MetaValue::str("synthetic " + a + " " + std::string(dtype_name(dt))));
  w.set(a + ".context_length", MetaValue::u32(uint32_t(s.n_ctx)));
  w.set(a + ".embedding_length", MetaValue::u32(uint32_t(s.d_model)));
  w.set(a + ".block_count", MetaValue::u32(uint32_t(s.n_layers)));
  w.set(a + ".feed_forward_length", MetaValue::u32(uint32_t(s.d_ff)));
  w.set(a + ".attention.head_count", MetaValue::u32(uint32_t(s.n_heads)));
  w.set(a + ".attention.head_count_kv", MetaValue::u32(uint32_t(s.n_kv_heads)));
  w.set(a + ".attention.key_length", MetaValue::u32(uint32_t(s.head_dim)));
  w.set(a + ".attention.value_length", MetaValue::u32(uint32_t(s.head_dim)));
  w.set(a + ".rope.freq_base", MetaValue::f32(s.rope_theta));
  w.set(a + ".rope.dimension_count", MetaValue::u32(uint32_t(s.head_dim)));
  w.set(a + ".attention.layer_norm_rms_epsilon", MetaValue::f32(s.eps));
  w.set(a + ".vocab_size", MetaValue::u32(uint32_t(s.vocab)));
  uint64_t seed = 1;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    return w.add_tensor(name, dt, {rows, cols}, filler(dt, seed++, std::sqrt(3.0f / float(cols)), 0.0f));
  };
  auto vec = [&](const std::string& name, int64_t n) {
    return w.add_tensor(name, DType::kF32, {n}, filler(DType::kF32, seed++, 0.05f, 1.0f));
  };
  const int64_t d = s.d_model, q = int64_t(s.n_heads) * s.head_dim, kv = int64_t(s.n_kv_heads) * s.head_dim;
  SHOAL_RETURN_IF_ERROR(matrix("token_embd.weight", s.vocab, d));
  for (int l = 0; l < s.n_layers; ++l) {
    auto n = [&](const char* x) { return fmt::format("blk.{}.{}", l, x); };
    SHOAL_RETURN_IF_ERROR(vec(n("attn_norm.weight"), d));
    SHOAL_RETURN_IF_ERROR(matrix(n("attn_q.weight"), q, d));
    SHOAL_RETURN_IF_ERROR(matrix(n("attn_k.weight"), kv, d));
    SHOAL_RETURN_IF_ERROR(matrix(n("attn_v.weight"), kv, d));
    SHOAL_RETURN_IF_ERROR(matrix(n("attn_output.weight"), d, q));
    if (s.qk_norm) {
      SHOAL_RETURN_IF_ERROR(vec(n("attn_q_norm.weight"), s.head_dim));
      SHOAL_RETURN_IF_ERROR(vec(n("attn_k_norm.weight"), s.head_dim));
    }
    SHOAL_RETURN_IF_ERROR(vec(n("ffn_norm.weight"), d));
    SHOAL_RETURN_IF_ERROR(matrix(n("ffn_gate.weight"), s.d_ff, d));
    SHOAL_RETURN_IF_ERROR(matrix(n("ffn_up.weight"), s.d_ff, d));
    SHOAL_RETURN_IF_ERROR(matrix(n("ffn_down.weight"), d, s.d_ff));
  }
  SHOAL_RETURN_IF_ERROR(vec("output_norm.weight", d));
  if (!s.tied) SHOAL_RETURN_IF_ERROR(matrix("output.weight", s.vocab, d));
  return w.write(path);
}

}  // namespace shoal
