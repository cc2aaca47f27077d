// The reference ops: plain, single-threaded loops over host memory, written to be read and
// trusted. Dot products and softmax accumulate in double. Every other backend and fast kernel is
// tested against these. Semantics and shapes: see the matching Backend methods in
// src/backend/backend.h.
#pragma once

#include "backend/backend.h"

namespace shoal::ref {

void embed(const Tensor& table, const Tensor& ids, Tensor& out);
void matmul(const Tensor& w, const Tensor& x, Tensor& y, const Tensor* bias);
void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y);
void layer_norm(const Tensor& x, const Tensor& w, const Tensor* b, float eps, Tensor& y);
void add(const Tensor& a, const Tensor& b, Tensor& y);
void scale(Tensor& x, float s);
void rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec);
void kv_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& pos);
void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
               const AttentionSpec& spec, Tensor& out);
void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out);
void activation(const Tensor& x, Activation act, Tensor& out);
void convert(const Tensor& src, Tensor& dst);
void argmax(const Tensor& logits, Tensor& out);
void top_k(const Tensor& logits, int k, Tensor& ids, Tensor& vals);
void advance_decode(const Tensor& next, Tensor& ids, Tensor& pos);
void sample(const Tensor& ids, const Tensor& vals, Tensor& state, Tensor& out);

/// act(x) for one value (shared by the fast path).
float apply_activation(float x, Activation act);
/// Row r of a plain or quantized tensor as f32 (dst holds t.cols() values).
void dequantize_row(const Tensor& t, int64_t r, float* dst);
/// Stores f32 values as one row of a cache of dtype F32, F16 or Q8_0.
void store_row(DType dtype, const float* src, int64_t n, void* dst);

}  // namespace shoal::ref
