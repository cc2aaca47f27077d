// Portable matmul kernels (no SIMD intrinsics): the fallback when the CPU lacks AVX2, and the
// level SHOAL_CPU_ISA=scalar forces. Float weights: 8 interleaved partial sums per dot product
// (value k goes to sum k % 8), added pairwise at the end. Q8_0 / Q4_0 weights: exact int32 dot
// per 32-value block against the QX activations, then sum += (d_w * d_x) * dot in f32.
#include <cmath>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "core/half.h"

namespace shoal::cpu_detail {
namespace {

constexpr int kLanes = 8;

struct LoadF32 {
  static float at(const uint8_t* row, int64_t k) {
    float v;
    std::memcpy(&v, row + 4 * k, 4);
    return v;
  }
};
struct LoadF16 {
  static float at(const uint8_t* row, int64_t k) {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return f16_to_f32(h);
  }
};
struct LoadBF16 {
  static float at(const uint8_t* row, int64_t k) {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return bf16_to_f32(h);
  }
};

float reduce_lanes(const float (&s)[kLanes]) {
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

template <typename L>
struct FloatTiles {
  template <int R, int T>
  static void tile(const MatmulJob& j, int64_t r0, int64_t t0) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* w = j.w + (r0 + r) * j.w_row_bytes;
      for (int t = 0; t < T; ++t) {
        const float* x = j.x + (t0 + t) * j.in;
        float s[kLanes] = {};
        for (int64_t k = 0; k < j.in; ++k) s[k % kLanes] += L::at(w, k) * x[k];
        float y = reduce_lanes(s);
        if (j.bias) y += j.bias[r0 + r];
        j.y[(t0 + t) * j.out + r0 + r] = y;
      }
    }
  }
};

// Exact integer dot of one 32-value weight block with one QX block, and the weight block's scale.
struct Q8_0Weights {
  static constexpr int64_t kBlockBytes = 34;
  static int32_t dot(const uint8_t* blk, const int8_t* xq) {
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += int32_t(int8_t(blk[2 + i])) * xq[i];
    return s;
  }
};
struct Q4_0Weights {
  static constexpr int64_t kBlockBytes = 18;
  static int32_t dot(const uint8_t* blk, const int8_t* xq) {
    int32_t s = 0;
    for (int i = 0; i < 16; ++i) {
      s += ((blk[2 + i] & 0xF) - 8) * xq[i];
      s += ((blk[2 + i] >> 4) - 8) * xq[i + 16];
    }
    return s;
  }
};

template <typename W>
struct QuantTiles {
  template <int R, int T>
  static void tile(const MatmulJob& j, int64_t r0, int64_t t0) {
    const int64_t nb = j.in / 32;
    for (int r = 0; r < R; ++r) {
      const uint8_t* w = j.w + (r0 + r) * j.w_row_bytes;
      for (int t = 0; t < T; ++t) {
        const uint8_t* base = j.qx + (t0 + t) * j.qx_stride;
        const auto* xq = reinterpret_cast<const int8_t*>(base);
        const auto* xd = reinterpret_cast<const float*>(base + 32 * j.nbp);
        float y = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = w + b * W::kBlockBytes;
          uint16_t dh;
          std::memcpy(&dh, blk, 2);
          y += float(W::dot(blk, xq + 32 * b)) * (f16_to_f32(dh) * xd[b]);
        }
        if (j.bias) y += j.bias[r0 + r];
        j.y[(t0 + t) * j.out + r0 + r] = y;
      }
    }
  }
};

template <typename K>
void rows(const MatmulJob& j, int64_t r0, int64_t r1, int64_t token_block) {
  run_rows<K>(j, r0, r1, token_block);
}

// QX record of one token; rounds x / d to nearest, ties to even (as the SIMD levels do).
void quantize_x(const float* x, int64_t in, int64_t nbp, uint8_t* rec) {
  auto* qs = reinterpret_cast<int8_t*>(rec);
  auto* d = reinterpret_cast<float*>(rec + 32 * nbp);
  const int64_t nb = in / 32;
  for (int64_t b = 0; b < nbp; ++b) {
    float amax = 0.0f;
    if (b < nb)
      for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[32 * b + i]));
    const float db = amax / 127.0f;
    const float id = db != 0.0f ? 1.0f / db : 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float v = b < nb ? std::nearbyint(x[32 * b + i] * id) : 0.0f;
      qs[32 * b + i] = int8_t((v >= -127.0f && v <= 127.0f) ? int(v) : 0);
    }
    d[b] = db;
  }
}

}  // namespace

const IsaKernels& kernels_scalar() {
  static const IsaKernels k{rows<FloatTiles<LoadF32>>, rows<FloatTiles<LoadF16>>, rows<FloatTiles<LoadBF16>>,
                            rows<QuantTiles<Q8_0Weights>>, rows<QuantTiles<Q4_0Weights>>, quantize_x};
  return k;
}

}  // namespace shoal::cpu_detail
