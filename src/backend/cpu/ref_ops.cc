#include "backend/cpu/ref_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/sampling_math.h"
#include "core/half.h"
#include "tensor/quant.h"

namespace shoal::ref {

namespace {

const float* f32(const Tensor& t) {
  SHOAL_CHECK(t.dtype == DType::kF32, "expected F32, got {}", dtype_name(t.dtype));
  return static_cast<const float*>(t.data);
}
float* f32(Tensor& t) {
  SHOAL_CHECK(t.dtype == DType::kF32, "expected F32, got {}", dtype_name(t.dtype));
  return static_cast<float*>(t.data);
}
const int32_t* i32(const Tensor& t) {
  SHOAL_CHECK(t.dtype == DType::kI32, "expected I32, got {}", dtype_name(t.dtype));
  return static_cast<const int32_t*>(t.data);
}

// acc[j] += the dot product of w with token row xr[j] (in values), j < M, each summed in double
// over k in order.
template <int M>
void token_dots(const float* w, const float* const* xr, int64_t in, double* acc) {
  for (int64_t k = 0; k < in; ++k) {
    const double wk = w[k];
    for (int j = 0; j < M; ++j) acc[j] += wk * double(xr[j][k]);
  }
}

}  // namespace

float apply_activation(float x, Activation act) {
  switch (act) {
    case Activation::kSilu:
      return float(double(x) / (1.0 + std::exp(-double(x))));
    case Activation::kGeluTanh: {
      const double v = x;
      return float(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
    }
    case Activation::kGeluErf:
      return float(0.5 * double(x) * (1.0 + std::erf(double(x) * 0.7071067811865476)));
  }
  return x;
}

void dequantize_row(const Tensor& t, int64_t r, float* dst) {
  const uint64_t rb = t.row_bytes();
  const uint8_t* row = static_cast<const uint8_t*>(t.data) + uint64_t(r) * rb;
  Status s = dequantize(t.dtype, row, dst, t.cols());
  SHOAL_CHECK(s.ok(), "{}", s.to_string());
}

void store_row(DType dtype, const float* src, int64_t n, void* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kQ8_0:
      quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
    default:
      SHOAL_CHECK(false, "cache dtype {} not supported", dtype_name(dtype));
  }
}

void embed(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t n = ids.n_elements(), d = table.cols();
  SHOAL_CHECK(out.rows() == n && out.cols() == d, "embed out {} for {} ids x {}", out.shape_string(), n, d);
  const int32_t* id = i32(ids);
  for (int64_t i = 0; i < n; ++i) {
    SHOAL_CHECK(id[i] >= 0 && id[i] < table.rows(), "token id {} out of range", id[i]);
    dequantize_row(table, id[i], f32(out) + i * d);
  }
}

void matmul(const Tensor& w, const Tensor& x, Tensor& y, const Tensor* bias) {
  const int64_t n = x.rows(), in = x.cols(), out = w.rows();
  SHOAL_CHECK(w.cols() == in, "matmul: w {} vs x {}", w.shape_string(), x.shape_string());
  SHOAL_CHECK(y.rows() == n && y.cols() == out, "matmul: y {} for n={} out={}", y.shape_string(), n, out);
  std::vector<float> wrow(static_cast<size_t>(in));
  const float* xs = f32(x);
  float* ys = f32(y);
  const float* b = bias ? f32(*bias) : nullptr;
  // Up to eight tokens at a time (8, 4, 2 or 1: no sums for tokens past the end): independent
  // sums, each over k in order as one token alone would take it, keep the CPU's adders busy; the
  // results are those of one token at a time.
  for (int64_t o = 0; o < out; ++o) {
    dequantize_row(w, o, wrow.data());
    for (int64_t i0 = 0; i0 < n;) {
      const int64_t left = n - i0, m = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      double acc[8] = {};
      const float* xr[8];
      for (int64_t j = 0; j < m; ++j) xr[j] = xs + (i0 + j) * in;
      switch (m) {
        case 8: token_dots<8>(wrow.data(), xr, in, acc); break;
        case 4: token_dots<4>(wrow.data(), xr, in, acc); break;
        case 2: token_dots<2>(wrow.data(), xr, in, acc); break;
        default: token_dots<1>(wrow.data(), xr, in, acc);
      }
      for (int64_t j = 0; j < m; ++j) ys[(i0 + j) * out + o] = float(b ? acc[j] + b[o] : acc[j]);
      i0 += m;
    }
  }
}

void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  const int64_t g = w.n_elements();
  SHOAL_CHECK(x.n_elements() % g == 0 && y.n_elements() == x.n_elements(), "rms_norm shapes");
  const float* xs = f32(x);
  const float* ws = f32(w);
  float* ys = f32(y);
  for (int64_t r = 0; r < x.n_elements() / g; ++r) {
    double ss = 0;
    for (int64_t k = 0; k < g; ++k) ss += double(xs[r * g + k]) * xs[r * g + k];
    const double inv = 1.0 / std::sqrt(ss / double(g) + double(eps));
    for (int64_t k = 0; k < g; ++k) ys[r * g + k] = float(double(xs[r * g + k]) * inv * ws[k]);
  }
}

void layer_norm(const Tensor& x, const Tensor& w, const Tensor* b, float eps, Tensor& y) {
  const int64_t d = x.cols();
  SHOAL_CHECK(w.n_elements() == d && y.n_elements() == x.n_elements(), "layer_norm shapes");
  const float* xs = f32(x);
  const float* ws = f32(w);
  const float* bs = b ? f32(*b) : nullptr;
  float* ys = f32(y);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = xs + r * d;
    double mean = 0;
    for (int64_t k = 0; k < d; ++k) mean += xr[k];
    mean /= double(d);
    double var = 0;
    for (int64_t k = 0; k < d; ++k) var += (xr[k] - mean) * (xr[k] - mean);
    const double inv = 1.0 / std::sqrt(var / double(d) + double(eps));
    for (int64_t k = 0; k < d; ++k)
      ys[r * d + k] = float((xr[k] - mean) * inv * ws[k] + (bs ? bs[k] : 0.0));
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  SHOAL_CHECK(a.n_elements() == b.n_elements() && y.n_elements() == a.n_elements(), "add shapes");
  const float* as = f32(a);
  const float* bs = f32(b);
  float* ys = f32(y);
  for (int64_t i = 0; i < a.n_elements(); ++i) ys[i] = as[i] + bs[i];
}

void scale(Tensor& x, float s) {
  float* xs = f32(x);
  for (int64_t i = 0; i < x.n_elements(); ++i) xs[i] *= s;
}

void rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec) {
  const int64_t n = x.rows();
  const int hd = spec.head_dim, rot = spec.rot_dims, half = rot / 2;
  SHOAL_CHECK(x.cols() == int64_t(spec.n_heads) * hd && rot <= hd && rot % 2 == 0, "rope shapes");
  SHOAL_CHECK(pos.n_elements() == n && inv_freq.n_elements() == half, "rope pos/freq shapes");
  const int32_t* p = i32(pos);
  const float* f = f32(inv_freq);
  float* xs = f32(x);
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < spec.n_heads; ++h) {
      float* v = xs + t * x.cols() + int64_t(h) * hd;
      for (int i = 0; i < half; ++i) {
        const double angle = double(p[t]) * double(f[i]);
        const double c = std::cos(angle) * spec.attn_factor, s = std::sin(angle) * spec.attn_factor;
        const int a = spec.interleaved ? 2 * i : i;
        const int b = spec.interleaved ? 2 * i + 1 : i + half;
        const double x0 = v[a], x1 = v[b];
        v[a] = float(x0 * c - x1 * s);
        v[b] = float(x0 * s + x1 * c);
      }
    }
  }
}

void kv_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& pos) {
  const int64_t n = k.rows(), kv = k.cols();
  SHOAL_CHECK(k_cache.cols() == kv && v_cache.cols() == v.cols() && v.rows() == n, "kv_write shapes");
  const int32_t* p = i32(pos);
  for (int64_t t = 0; t < n; ++t) {
    SHOAL_CHECK(p[t] >= 0 && p[t] < k_cache.rows(), "kv_write position {} outside cache of {}", p[t], k_cache.rows());
    store_row(k_cache.dtype, f32(k) + t * kv, kv,
              static_cast<uint8_t*>(k_cache.data) + uint64_t(p[t]) * k_cache.row_bytes());
    store_row(v_cache.dtype, f32(v) + t * v.cols(), v.cols(),
              static_cast<uint8_t*>(v_cache.data) + uint64_t(p[t]) * v_cache.row_bytes());
  }
}

void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
               const AttentionSpec& spec, Tensor& out) {
  const int64_t n = q.rows();
  const int hd = spec.head_dim, group = spec.n_heads / spec.n_kv_heads;
  SHOAL_CHECK(spec.n_heads % spec.n_kv_heads == 0, "n_heads not a multiple of n_kv_heads");
  SHOAL_CHECK(q.cols() == int64_t(spec.n_heads) * hd && out.n_elements() == q.n_elements(), "attention q/out shapes");
  SHOAL_CHECK(k_cache.cols() == int64_t(spec.n_kv_heads) * hd, "attention cache width");
  SHOAL_CHECK(v_cache.cols() == k_cache.cols() && v_cache.rows() == k_cache.rows(), "attention v cache shape");
  const int32_t* p = i32(pos);
  const int64_t kvw = k_cache.cols();
  const auto heads = size_t(spec.n_heads);
  // Each cache row is dequantized once per token and serves every head; per head the sums run in
  // the order of the keys, as one head at a time would take them.
  std::vector<float> krow(static_cast<size_t>(kvw)), vrow(static_cast<size_t>(kvw));
  std::vector<double> scores, mx(heads), sum(heads), acc(heads * size_t(hd));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t last = p[t];
    const int64_t first = spec.sliding_window > 0 ? std::max<int64_t>(0, last - spec.sliding_window + 1) : 0;
    SHOAL_CHECK(last < k_cache.rows(), "attention position {} outside cache", last);
    const auto keys = size_t(last - first + 1);
    scores.assign(heads * keys, 0.0);  // [head][key]
    std::fill(mx.begin(), mx.end(), -std::numeric_limits<double>::infinity());
    for (int64_t j = first; j <= last; ++j) {
      dequantize_row(k_cache, j, krow.data());
      for (size_t h = 0; h < heads; ++h) {
        const float* qh = f32(q) + t * q.cols() + int64_t(h) * hd;
        const float* kh = krow.data() + int64_t(h) / group * hd;
        double s = 0;
        for (int d = 0; d < hd; ++d) s += double(qh[d]) * kh[d];
        s *= spec.scale;
        if (spec.softcap > 0) s = spec.softcap * std::tanh(s / spec.softcap);
        scores[h * keys + size_t(j - first)] = s;
        mx[h] = std::max(mx[h], s);
      }
    }
    for (size_t h = 0; h < heads; ++h) {
      sum[h] = 0;
      for (size_t i = 0; i < keys; ++i) sum[h] += (scores[h * keys + i] = std::exp(scores[h * keys + i] - mx[h]));
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = first; j <= last; ++j) {
      dequantize_row(v_cache, j, vrow.data());
      for (size_t h = 0; h < heads; ++h) {
        const double pj = scores[h * keys + size_t(j - first)] / sum[h];
        const float* vh = vrow.data() + int64_t(h) / group * hd;
        double* ah = acc.data() + h * size_t(hd);
        for (int d = 0; d < hd; ++d) ah[d] += pj * vh[d];
      }
    }
    for (size_t h = 0; h < heads; ++h) {
      float* oh = f32(out) + t * q.cols() + int64_t(h) * hd;
      for (int d = 0; d < hd; ++d) oh[d] = float(acc[h * size_t(hd) + size_t(d)]);
    }
  }
}

void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) {
  SHOAL_CHECK(gate.n_elements() == up.n_elements() && out.n_elements() == up.n_elements(), "glu shapes");
  const float* g = f32(gate);
  const float* u = f32(up);
  float* o = f32(out);
  for (int64_t i = 0; i < gate.n_elements(); ++i) o[i] = apply_activation(g[i], act) * u[i];
}

void activation(const Tensor& x, Activation act, Tensor& out) {
  SHOAL_CHECK(out.n_elements() == x.n_elements(), "activation shapes");
  const float* xs = f32(x);
  float* o = f32(out);
  for (int64_t i = 0; i < x.n_elements(); ++i) o[i] = apply_activation(xs[i], act);
}

void convert(const Tensor& src, Tensor& dst) {
  const int64_t n = src.n_elements();
  SHOAL_CHECK(dst.n_elements() == n, "convert shapes");
  std::vector<float> tmp(static_cast<size_t>(n));
  for (int64_t r = 0; r < src.rows(); ++r) dequantize_row(src, r, tmp.data() + r * src.cols());
  switch (dst.dtype) {
    case DType::kF32:
      std::memcpy(dst.data, tmp.data(), size_t(n) * 4);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst.data)[i] = f32_to_f16(tmp[size_t(i)]);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst.data)[i] = f32_to_bf16(tmp[size_t(i)]);
      break;
    default:
      SHOAL_CHECK(false, "convert to {} not supported", dtype_name(dst.dtype));
  }
}

void argmax(const Tensor& logits, Tensor& out) {
  const int64_t v = logits.cols();
  SHOAL_CHECK(out.n_elements() == logits.rows() && out.dtype == DType::kI32, "argmax shapes");
  const float* l = f32(logits);
  for (int64_t r = 0; r < logits.rows(); ++r) {
    int64_t best = 0;
    for (int64_t j = 1; j < v; ++j)
      if (l[r * v + j] > l[r * v + best]) best = j;
    static_cast<int32_t*>(out.data)[r] = int32_t(best);
  }
}

void top_k(const Tensor& logits, int k, Tensor& ids, Tensor& vals) {
  const int64_t v = logits.cols();
  SHOAL_CHECK(k > 0 && k <= v && ids.n_elements() >= k && vals.n_elements() >= k, "top_k shapes");
  const float* l = f32(logits);
  std::vector<int32_t> idx(static_cast<size_t>(v));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return l[a] > l[b] || (l[a] == l[b] && a < b);
  });
  for (int i = 0; i < k; ++i) {
    static_cast<int32_t*>(ids.data)[i] = idx[size_t(i)];
    static_cast<float*>(vals.data)[i] = l[idx[size_t(i)]];
  }
}

void sample(const Tensor& ids, const Tensor& vals, Tensor& state, Tensor& out) {
  const int64_t k = ids.n_elements();
  SHOAL_CHECK(k >= 1 && k <= 1024 && vals.n_elements() == k && ids.dtype == DType::kI32 && vals.dtype == DType::kF32 &&
                  state.nbytes() == sizeof(DeviceSampling) && out.n_elements() == 1 && out.dtype == DType::kI32,
              "sample shapes");
  DeviceSampling s;
  std::memcpy(&s, state.data, sizeof s);
  static_cast<int32_t*>(out.data)[0] = draw_token(static_cast<const int32_t*>(ids.data), f32(vals), int(k), s);
  std::memcpy(state.data, &s, sizeof s);
}

void advance_decode(const Tensor& next, Tensor& ids, Tensor& pos) {
  const int64_t n = next.n_elements();
  SHOAL_CHECK(next.dtype == DType::kI32 && ids.dtype == DType::kI32 && pos.dtype == DType::kI32 &&
                  ids.n_elements() == n && pos.n_elements() == n && next.data != ids.data &&
                  next.data != pos.data && ids.data != pos.data && n >= 1 &&
                  n <= Backend::kDecodedMax && static_cast<const int32_t*>(pos.data)[0] >= 0,
              "advance_decode shapes");
  for (int64_t i = 0; i < n; ++i) {
    static_cast<int32_t*>(ids.data)[i] = static_cast<const int32_t*>(next.data)[i];
    static_cast<int32_t*>(pos.data)[i] += int32_t(n);
  }
}

}  // namespace shoal::ref
