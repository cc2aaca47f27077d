#include "backend/cpu/attention_fast.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/attention_kernels.h"
#include "core/check.h"

namespace shoal {

using namespace cpu_detail;

namespace {

// Keys per online-softmax step: scores of a chunk are computed, then the running max, sum and
// output are rescaled once.
constexpr int64_t kChunk = 64;

const AttnKernels& attn_kernels_for(CpuIsa isa) {
  SHOAL_CHECK(int(isa) <= int(cpu_isa_supported()), "attention kernels {} requested on a CPU that supports only {}",
              cpu_isa_name(isa), cpu_isa_name(cpu_isa_supported()));
  switch (isa) {
    case CpuIsa::kAvx512: return attn_kernels_avx512();
    case CpuIsa::kAvx2: return attn_kernels_avx2();
    case CpuIsa::kScalar: break;
  }
  return attn_kernels_scalar();
}

// One KV head's slice [first, first + n) of cache rows as f32.
class HeadReader {
 public:
  HeadReader(const AttnKernels& k, const Tensor& cache, int64_t first, int64_t n)
      : k_(k), cache_(cache), first_(first), n_(n), row_bytes_(cache.row_bytes()) {
    if (cache.dtype == DType::kQ8_0) {
      b0_ = first / 32;
      nb_ = (first + n + 31) / 32 - b0_;
      if (first % 32 != 0 || n % 32 != 0) tmp_.resize(size_t(nb_ * 32));
    }
  }
  /// The slice of row r: a pointer into the cache (F32) or `dst` (n floats, F16 and Q8_0).
  const float* read(int64_t r, float* dst) {
    const uint8_t* row = static_cast<const uint8_t*>(cache_.data) + uint64_t(r) * row_bytes_;
    switch (cache_.dtype) {
      case DType::kF32: return reinterpret_cast<const float*>(row) + first_;
      case DType::kF16: k_.f16_to_f32(reinterpret_cast<const uint16_t*>(row) + first_, dst, n_); return dst;
      default:  // Q8_0: the whole blocks covering the slice
        if (tmp_.empty()) {
          k_.q8_0_to_f32(row + b0_ * 34, dst, nb_);
        } else {
          k_.q8_0_to_f32(row + b0_ * 34, tmp_.data(), nb_);
          std::copy_n(tmp_.data() + (first_ - b0_ * 32), n_, dst);
        }
        return dst;
    }
  }

 private:
  const AttnKernels& k_;
  const Tensor& cache_;
  int64_t first_, n_;
  uint64_t row_bytes_;
  int64_t b0_ = 0, nb_ = 0;
  std::vector<float> tmp_;  // Q8_0 slices that do not start and end on block boundaries
};

bool cache_dtype_ok(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kQ8_0; }

}  // namespace

void fast_attention_isa(ThreadPool& pool, CpuIsa isa, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, const Tensor& pos, const AttentionSpec& spec, Tensor& out) {
  const AttnKernels& k = attn_kernels_for(isa);
  const int64_t n = q.rows(), hd = spec.head_dim, n_kv = spec.n_kv_heads;
  SHOAL_CHECK(spec.n_heads > 0 && n_kv > 0 && hd > 0 && spec.n_heads % n_kv == 0, "attention heads {} / {}",
              spec.n_heads, n_kv);
  const int64_t group = spec.n_heads / n_kv, qw = q.cols();
  SHOAL_CHECK(q.dtype == DType::kF32 && out.dtype == DType::kF32, "attention q/out must be f32");
  SHOAL_CHECK(qw == spec.n_heads * hd && out.n_elements() == q.n_elements(), "attention q {} / out {}",
              q.shape_string(), out.shape_string());
  SHOAL_CHECK(out.data != q.data, "attention out must not alias q");
  SHOAL_CHECK(cache_dtype_ok(k_cache.dtype) && cache_dtype_ok(v_cache.dtype), "attention cache dtypes {} / {}",
              dtype_name(k_cache.dtype), dtype_name(v_cache.dtype));
  SHOAL_CHECK(k_cache.cols() == n_kv * hd && v_cache.cols() == n_kv * hd && v_cache.rows() == k_cache.rows(),
              "attention caches {} / {} for {} kv heads of {}", k_cache.shape_string(), v_cache.shape_string(), n_kv, hd);
  SHOAL_CHECK(pos.dtype == DType::kI32 && pos.n_elements() == n, "attention pos");
  const auto* p = static_cast<const int32_t*>(pos.data);
  for (int64_t t = 0; t < n; ++t)
    SHOAL_CHECK(p[t] >= 0 && p[t] < k_cache.rows(), "attention position {} outside a cache of {}", p[t], k_cache.rows());

  const float* qs = static_cast<const float*>(q.data);
  float* os = static_cast<float*>(out.data);
  const int64_t tasks = n * n_kv;  // (query, kv head): the group of q heads sharing the K/V rows
  pool.parallel_for(tasks, pool.grain_for(tasks), [&](int64_t b, int64_t e) {
    std::vector<float> kbuf(static_cast<size_t>(kChunk * hd)), vbuf(static_cast<size_t>(hd)),
        scores(static_cast<size_t>(group * kChunk));
    std::vector<float> m(static_cast<size_t>(group)), l(static_cast<size_t>(group));
    std::vector<const float*> krows(static_cast<size_t>(kChunk));
    for (int64_t task = b; task < e; ++task) {
      const int64_t t = task / n_kv, kvh = task % n_kv;
      const int64_t last = p[t];
      const int64_t first = spec.sliding_window > 0 ? std::max<int64_t>(0, last - spec.sliding_window + 1) : 0;
      HeadReader kr(k, k_cache, kvh * hd, hd), vr(k, v_cache, kvh * hd, hd);
      const float* qg = qs + t * qw + kvh * group * hd;  // the group's q heads, hd apart
      float* acc = os + t * qw + kvh * group * hd;       // accumulate in place in out
      std::fill(acc, acc + group * hd, 0.0f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.0f);
      for (int64_t c0 = first; c0 <= last; c0 += kChunk) {
        const int64_t nc = std::min(last + 1 - c0, kChunk);
        for (int64_t j = 0; j < nc; ++j) krows[size_t(j)] = kr.read(c0 + j, kbuf.data() + j * hd);
        for (int64_t g = 0; g < group; ++g) {
          float* s = scores.data() + g * kChunk;
          float cmax = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < nc; ++j) {
            float v = k.dot(qg + g * hd, krows[size_t(j)], hd) * spec.scale;
            if (spec.softcap > 0) v = spec.softcap * std::tanh(v / spec.softcap);
            s[j] = v;
            cmax = std::max(cmax, v);
          }
          const float m_new = std::max(m[size_t(g)], cmax);
          const float corr = std::exp(m[size_t(g)] - m_new);  // 0 on the first chunk
          k.scale(acc + g * hd, corr, hd);
          float sum = 0.0f;
          for (int64_t j = 0; j < nc; ++j) sum += (s[j] = std::exp(s[j] - m_new));
          l[size_t(g)] = l[size_t(g)] * corr + sum;
          m[size_t(g)] = m_new;
        }
        for (int64_t j = 0; j < nc; ++j) {
          const float* v = vr.read(c0 + j, vbuf.data());
          for (int64_t g = 0; g < group; ++g) k.axpy(acc + g * hd, scores[size_t(g * kChunk + j)], v, hd);
        }
      }
      for (int64_t g = 0; g < group; ++g) k.scale(acc + g * hd, 1.0f / l[size_t(g)], hd);
    }
  });
}

void fast_attention(ThreadPool& pool, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                    const Tensor& pos, const AttentionSpec& spec, Tensor& out) {
  fast_attention_isa(pool, cpu_isa(), q, k_cache, v_cache, pos, spec, out);
}

}  // namespace shoal
