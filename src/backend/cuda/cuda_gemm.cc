// Prefill products (more than kGemvMaxTokens tokens; Q8_0 / Q4_0 from kQuantGemmMinTokens where
// gemm_quant runs) on the tensor cores: 16-bit operands with
// f32 accumulation, kept within ~1e-6 of the f32 result by splitting (gemm_prep.cu). On cuBLAS:
// F16 weights (exact in f16) times x = hi + lo in f16; BF16 weights times x = hi + mid + lo in
// bf16; Q8_0 / Q4_0 weights dequantized to hi + lo in f16, times x = hi + lo: w_hi * [x_hi x_lo]
// + w_lo * x_hi, the last accumulated into the first (beta = 1). The activation parts go side by
// side as extra columns of one product; one kernel sums the partial products with the op's
// epilogue. On Hopper, Q8_0 / Q4_0 weights run on gemm_quant instead (gemm_quant.cu: the small
// integers q exact in f16, block scales in f32, times [x_hi x_lo], the parts summed and the
// epilogue applied in the kernel; q / k / v in one launch, gate / up with act(gate) * up in one).
// matmuls() splits its input once for all its products, with the RMSNorm fused into the split.
// With BackendOptions::half_prefill x is one 16-bit part where every product of the call takes
// it (F16 / BF16 on cuBLAS, Q8_0 / Q4_0 on gemm_quant; not the dequantized cuBLAS path, which
// stays exact): n columns instead of 2n / 3n, llama.cpp's numerics for F16 weights.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/tensor_args.h"

namespace shoal {

using cuda::WKind;

namespace {

// Whether b starts where a ends in device memory.
bool back_to_back(const Tensor& a, const Tensor& b) {
  return b.data == static_cast<const uint8_t*>(a.data) + a.nbytes();
}

// The end of the run of products from outs[i] whose weights (F16 / BF16, no up) lie back to back
// in device memory, and the rows of that run (m): one GEMM takes them all.
size_t stacked_run(std::span<const MatmulOut> outs, size_t i, int64_t& m) {
  const Tensor* w0 = outs[i].w;
  size_t end = i + 1;
  m = w0->rows();
  if (outs[i].up || (w0->dtype != DType::kF16 && w0->dtype != DType::kBF16)) return end;
  for (; end < outs.size(); ++end) {
    const Tensor* w = outs[end].w;
    if (outs[end].up || w->dtype != w0->dtype || !back_to_back(*outs[end - 1].w, *w)) break;
    m += w->rows();
  }
  return end;
}

// Whether gate and up (F16 / BF16, back to back in device memory) take one GEMM over both: where
// the two products are small. H200 with cuBLAS 13, 2 x 14336 x 4096 weights: one GEMM 168 against
// 195 us for two at 512 columns, 344 against 328 at 1024; 2 x 3072 x 1024: 25 / 14 us against 29 /
// 24 at 1024 / 512 columns (docs/cuda.md v35). So up to 16M output values.
constexpr int64_t kMaxStackedOutputs = int64_t(16) << 20;
bool glu_stackable(const Tensor& gate, const Tensor& up) {
  return (gate.dtype == DType::kF16 || gate.dtype == DType::kBF16) && up.dtype == gate.dtype &&
         back_to_back(gate, up) && up.rows() == gate.rows();
}
bool stack_glu(const Tensor& gate, const Tensor& up, int64_t columns) {
  return glu_stackable(gate, up) && 2 * gate.rows() * columns <= kMaxStackedOutputs;
}

}  // namespace

bool CudaBackend::gemm_input(const float* x, int64_t n, int64_t k, bool bf16, bool half, const float* norm_w,
                             float eps, GemmInput& in) {
  in = GemmInput::of(n, k, bf16, half);
  if (half) ++half_inputs_;
  const auto& h = split_handoff_;  // (written by the op just before: ops_ counts this one)
  if (h.op != 0 && h.op + 1 == ops_ && h.x == x && h.norm_w == norm_w && h.eps == eps && h.in.n == n && h.in.k == k &&
      h.in.bf16 == bf16 && h.in.parts == in.parts) {
    in = h.in;
    ++split_handoffs_;
    return true;
  }
  if (!gemm_input_buffer(in, kGemmInput)) return false;
  return note(cuda::split_activations(x, n, k, bf16, in.parts, norm_w, eps, const_cast<uint16_t*>(in.x16),
                                      const_cast<float*>(in.inv_scale), stream_),
              "split_activations");
}

bool CudaBackend::gemm_input_buffer(GemmInput& in, Scratch slot) {
  const uint64_t xs_bytes = cuda::align_up(uint64_t(in.parts) * uint64_t(in.n) * uint64_t(in.k) * 2, 256);
  auto* xs = static_cast<uint8_t*>(scratch(slot, xs_bytes + uint64_t(in.n) * 4));
  if (!xs) return false;
  in.x16 = reinterpret_cast<uint16_t*>(xs);
  in.inv_scale = reinterpret_cast<float*>(xs + xs_bytes);
  in.slot = slot;
  return true;
}

bool CudaBackend::run_gemm_quant(const cuda::WeightRef* ws, const cuda::QuantGemmOut* outs, int count,
                                 const GemmInput& in, const float* inv_scale, bool glu, cuda::Act act) {
  int splits = 1, per_sm = 1, tokens = 0;
  cuda::QuantGemmSplit split = qsplit_;
  split.used = &splits;
  split.blocks_per_sm = &per_sm;
  split.item_tokens = in.parts == 2 ? qgemm_item_tokens_ : 0;
  split.item_tokens_used = &tokens;
  if (!note(cuda::gemm_quant(ws, outs, count, in.x16, in.parts, inv_scale, in.n, glu, act, stream_, split),
            "gemm_quant"))
    return false;
  ++qgemm_launches_;
  if (splits > 1) ++qgemm_split_launches_;
  if (per_sm > 1) ++qgemm_two_block_launches_;
  if (in.parts == 2 && tokens == 128) ++qgemm_wide_launches_;
  return true;
}

int CudaBackend::gemm_products(const cuda::WeightRef& w, const GemmInput& in, float* yp) {
  const float one = 1.0f, zero = 0.0f;
  const int m = int(w.rows), k = int(in.k), nn = int(in.n);
  const cudaDataType_t type = in.bf16 ? CUDA_R_16BF : CUDA_R_16F;
  if (w.kind != WKind::kQ8_0 && w.kind != WKind::kQ4_0) {
    return note_cublas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, in.parts * nn, k, &one, w.data, type, k,
                                    in.x16, type, k, &zero, yp, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx (16-bit parts)")
               ? in.parts
               : 0;
  }
  if (qgemm_) {  // the parts summed in the kernel, no dequantized copy (quantized: never bf16 parts)
    const cuda::QuantGemmOut out{yp};
    return run_gemm_quant(&w, &out, 1, in, nullptr, false, cuda::Act::kSilu) ? 1 : 0;
  }
  if (in.parts != 2) {  // (one_part keeps one-part inputs off this path)
    note(cudaErrorInvalidValue, "dequantized products of one activation part");
    return 0;
  }
  // Row tiles of about 64 MiB per weight part (multiples of 128 rows).
  constexpr uint64_t kTileBytes = 64ull << 20;
  const int64_t tile = std::max<int64_t>(128, int64_t(kTileBytes / (uint64_t(k) * 2)) / 128 * 128);
  const uint64_t part_bytes = uint64_t(std::min<int64_t>(tile, m)) * uint64_t(k) * 2;
  auto* w16 = static_cast<uint16_t*>(scratch(kGemmWeight, 2 * part_bytes));
  if (!w16) return 0;
  uint16_t* w_hi = w16;
  uint16_t* w_lo = w16 + part_bytes / 2;
  for (int64_t r0 = 0; r0 < m; r0 += tile) {
    const int nr = int(std::min<int64_t>(tile, m - r0));
    if (!note(cuda::dequant_split(w, r0, nr, w_hi, w_lo, stream_), "dequant_split")) return 0;
    if (!note_cublas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, nr, 2 * nn, k, &one, w_hi, type, k, in.x16, type,
                                  k, &zero, yp + r0, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx (w_hi x [x_hi x_lo])") ||
        !note_cublas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, nr, nn, k, &one, w_lo, type, k, in.x16, type, k,
                                  &one, yp + r0, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx (w_lo x x_hi)"))
      return 0;
  }
  return 2;
}

void CudaBackend::gemm(const cuda::WeightRef& w, const float* x, int64_t n, float* y, const float* bias, bool half) {
  const int m = int(w.rows), k = int(w.cols), nn = int(n);
  if (w.kind == WKind::kF32) {  // plain f32 SGEMM (no TF32)
    const float one = 1.0f, zero = 0.0f;
    if (note_cublas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, w.data, CUDA_R_32F, k, x,
                                 CUDA_R_32F, k, &zero, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmEx (f32)") &&
        bias)
      note(cuda::combine_parts(y, 1, n, m, nullptr, bias, false, y, stream_), "add bias");
    return;
  }
  GemmInput in;
  if (!gemm_input(x, n, k, w.kind == WKind::kBF16, half, nullptr, 0.0f, in)) return;
  if (qgemm_ && (w.kind == WKind::kQ8_0 || w.kind == WKind::kQ4_0)) {  // the epilogue in the kernel
    const cuda::QuantGemmOut out{y, bias};
    run_gemm_quant(&w, &out, 1, in, in.inv_scale, false, cuda::Act::kSilu);
    return;
  }
  auto* yp = static_cast<float*>(scratch(kGemmOut, gemm_out_bytes(in, m)));
  if (!yp) return;
  const int blocks = gemm_products(w, in, yp);
  if (blocks > 0) note(cuda::combine_parts(yp, blocks, n, m, in.inv_scale, bias, false, y, stream_), "combine_parts");
}

bool CudaBackend::finish_product(const MatmulOut& o, const float* yp, int blocks, int64_t ld, const GemmInput& src,
                                 float lo, bool last) {
  const int64_t n = o.y->rows(), rows = o.w->rows();
  float* y = cuda::f32(*o.y);
  const float* bias = o.bias ? cuda::f32(*o.bias) : nullptr;
  const float* inv_scale = src.inv_scale;
  const InputNorm* next = last ? o.next : nullptr;  // (later products of the call still read src)
  const DType t = o.w->dtype;
  if (o.accumulate && next && next->w && next->w->dtype == DType::kF32 && next->w->n_elements() == rows &&
      (t == DType::kF16 || t == DType::kBF16)) {
    // The next block's input (its products' weights taken to be of o's kind) in the same pass,
    // in the slot src is not in (its inv_scale is read by every block of the pass).
    GemmInput in = GemmInput::of(n, rows, t == DType::kBF16, one_part(t, n));
    if (!gemm_input_buffer(in, other_input(src.slot))) return false;
    const cudaError_t e =
        cuda::combine_split(yp, blocks, ld, lo, inv_scale, bias, y, n, rows, in.bf16, in.parts, cuda::f32(*next->w),
                            next->eps, const_cast<uint16_t*>(in.x16), const_cast<float*>(in.inv_scale), stream_);
    if (e != cudaErrorNotSupported) {
      if (!note(e, "combine_split")) return false;
      split_handoff_ = {ops_, in, y, next->w->data, next->eps};
      return true;
    }
  }
  return note(cuda::combine_parts(yp, blocks, n, rows, inv_scale, bias, o.accumulate, y, stream_, ld, lo),
              "combine_parts");
}

int CudaBackend::rows_products(const Tensor& first, int64_t rows, const GemmInput& in, float*& yp) {
  yp = static_cast<float*>(scratch(kGemmOut, gemm_out_bytes(in, rows)));
  if (!yp) return 0;
  cuda::WeightRef ref = weight_ref(first);
  ref.rows = rows;
  return gemm_products(ref, in, yp);
}

bool CudaBackend::quant_gemm_together(const GemmInput& in, std::span<const MatmulOut> outs) {
  // On gemm_quant, each product's epilogue in the kernel: several products of one quantized kind
  // (q / k / v) in one launch (the small ones, k and v of a GQA model, would each leave most of
  // the GPU idle), or gate and up of one kind and shape with act(gate) * up; false where that
  // does not apply (mixed kinds, or one product with some other: the loop of gemm_matmuls).
  const DType t = outs[0].w->dtype;
  if (!qgemm_ || outs.size() > size_t(cuda::kGemvMaxOuts) || (t != DType::kQ8_0 && t != DType::kQ4_0)) return false;
  for (size_t i = 0; i < outs.size(); ++i) {
    const MatmulOut& o = outs[i];
    if (o.w->dtype != t || (o.up && (outs.size() > 1 || o.up->dtype != t || o.up->rows() != o.w->rows() ||
                                     o.bias || o.accumulate)))
      return false;
    for (size_t j = 0; j < i; ++j)  // (one launch writes all outputs at once: a shared y would race)
      if (outs[j].y->data == o.y->data) return false;
  }
  cuda::WeightRef ws[cuda::kGemvMaxOuts];
  cuda::QuantGemmOut out[cuda::kGemvMaxOuts];
  const bool glu = outs[0].up != nullptr;
  for (size_t i = 0; i < outs.size(); ++i) {
    const MatmulOut& o = outs[i];
    ws[i] = weight_ref(*o.w);
    out[i] = cuda::QuantGemmOut{cuda::f32(*o.y), o.bias ? cuda::f32(*o.bias) : nullptr, o.accumulate};
  }
  if (glu) ws[1] = weight_ref(*outs[0].up);
  const int count = glu ? 2 : int(outs.size());
  run_gemm_quant(ws, out, count, in, in.inv_scale, glu, cuda::act_of(outs[0].act));
  return true;
}

bool CudaBackend::gemm_matmuls(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs) {
  const int64_t n = x.rows(), k = x.cols();
  if (outs.empty()) return true;
  const bool bf16 = outs[0].w->dtype == DType::kBF16;
  bool half = true;  // one part where every product takes it
  for (const MatmulOut& o : outs)
    for (const Tensor* w : {o.w, o.up}) {
      if (!w) continue;
      const bool ok = w->dtype == DType::kF16 || w->dtype == DType::kBF16 || w->dtype == DType::kQ8_0 ||
                      w->dtype == DType::kQ4_0;
      if (!ok || (w->dtype == DType::kBF16) != bf16 || (o.up && w->rows() % 4 != 0)) return false;
      half = half && one_part(w->dtype, n);
    }
  check_matmul_shapes(x, norm, outs);
  if (failed() || !use_device()) return true;
  GemmInput in;
  if (!gemm_input(cuda::f32(x), n, k, bf16, half, norm.w ? cuda::f32(*norm.w) : nullptr, norm.eps, in)) return true;
  if (quant_gemm_together(in, outs)) return true;
  for (size_t i = 0; i < outs.size();) {
    const MatmulOut& o = outs[i];
    // Products whose weights lie back to back in device memory (F16 / BF16, no up: q / k / v as
    // their allocations usually fall) take one GEMM over all their rows, then a sum of the parts
    // per product: k and v of a GQA model alone would each leave most of the GPU idle (H200,
    // Llama-3-8B q / k / v at 512 tokens: 81 against 95 us; docs/cuda.md v34).
    if (o.up) {
      ++i;
      GluProducts p;
      if (!glu_products(o, in, p) ||
          !note(cuda::combine_glu(p.gate, p.gate_blocks, p.up, p.up_blocks, n, o.w->rows(), in.inv_scale,
                                  cuda::act_of(o.act), cuda::f32(*o.y), stream_, p.ld),
                "combine_glu"))
        return true;
      continue;
    }
    int64_t m = 0;
    const size_t end = stacked_run(outs, i, m);
    float* yp = nullptr;
    const int blocks = rows_products(*o.w, m, in, yp);
    if (blocks == 0) return true;
    if (end > i + 1) stacked_products_ += end - i;
    for (int64_t r0 = 0; i < end; r0 += outs[i].w->rows(), ++i)  // each product's rows of yp
      if (!finish_product(outs[i], yp + r0, blocks, m, in, 1.0f, i + 1 == outs.size())) return true;
  }
  return true;
}

bool CudaBackend::glu_products(const MatmulOut& o, const GemmInput& in, GluProducts& p) {
  // Gate and up back to back (the loader allocates them so) in one GEMM where stack_glu says it is
  // faster than two; the GLU then reads both from its rows.
  const int64_t m = o.w->rows();
  const bool stacked = stack_glu(*o.w, *o.up, int64_t(in.parts) * in.n);
  // A smaller step stacks them and writes both products into kGemmOut: the slot takes that size
  // for the largest such step first (a step's scratch covers every smaller one: Slice::warm_up).
  if (!stacked && glu_stackable(*o.w, *o.up) &&
      !scratch(kGemmOut, uint64_t(kMaxStackedOutputs / (2 * m) * 2 * m) * 4))
    return false;
  float* yp = nullptr;
  p.gate_blocks = rows_products(*o.w, stacked ? 2 * m : m, in, yp);
  p.gate = yp;
  if (p.gate_blocks == 0) return false;
  if (stacked) {
    stacked_products_ += 2;
    p.up = yp + m;
    p.up_blocks = p.gate_blocks;
    p.ld = 2 * m;
    return true;
  }
  auto* up = static_cast<float*>(scratch(kGemmUp, gemm_out_bytes(in, m)));
  p.up = up;
  p.up_blocks = up ? gemm_products(weight_ref(*o.up), in, up) : 0;
  p.ld = 0;
  return p.up_blocks > 0;
}

void CudaBackend::gated_ffn(const Tensor& in, const InputNorm& norm, const MatmulOut& glu, const MatmulOut& down) {
  if (!glu_parts_ffn(in, norm, glu, down)) Backend::gated_ffn(in, norm, glu, down);
}

bool CudaBackend::glu_parts_ffn(const Tensor& in, const InputNorm& norm, const MatmulOut& glu, const MatmulOut& down) {
  // F16 / BF16 gate / up / down on cuBLAS: gate and up as gemm_matmuls runs them, then
  // glu_parts writes act(gate) * up as down's input parts (no f32 h, no second split:
  // Llama-3-8B at 512 tokens reads and writes 58 MB less per layer), down's products summed into
  // x (finish_product).
  const int64_t n = in.rows();
  if (n <= cuda::kGemvMaxTokens || !glu.w || !glu.up || !glu.y || glu.bias || glu.accumulate || !down.w || !down.y)
    return false;
  const DType t = glu.w->dtype;
  if (t != DType::kF16 && t != DType::kBF16) return false;
  for (const Tensor* w : {glu.up, down.w})
    if (w->dtype != t) return false;
  const int64_t m = glu.w->rows();
  if (m % 4 != 0 || down.w->cols() != m || glu.up->rows() != m) return false;
  check_matmul_args(in, norm, {&glu, 1});
  check_matmul_shapes(in, norm, {&glu, 1});
  check_matmul_args(*glu.y, InputNorm{}, {&down, 1});
  check_matmul_shapes(*glu.y, InputNorm{}, {&down, 1});
  if (failed() || !use_device()) return true;
  GemmInput gin;
  const bool bf16 = t == DType::kBF16;
  const float* norm_w = norm.w ? cuda::f32(*norm.w) : nullptr;
  if (!gemm_input(cuda::f32(in), n, in.cols(), bf16, one_part(t, n), norm_w, norm.eps, gin)) return true;
  GluProducts p;
  if (!glu_products(glu, gin, p)) return true;
  // Down's input parts in the slot gin is not in: glu_parts reads gin.inv_scale in every block.
  GemmInput din = GemmInput::of(n, m, bf16, one_part(t, n));
  if (!gemm_input_buffer(din, other_input(gin.slot))) return true;
  if (!note(cuda::glu_parts(p.gate, p.gate_blocks, p.up, p.up_blocks, n, m, gin.inv_scale, cuda::act_of(glu.act), bf16,
                            din.parts, const_cast<uint16_t*>(din.x16), const_cast<float*>(din.inv_scale), stream_,
                            p.ld),
            "glu_parts"))
    return true;
  ++glu_part_ffns_;
  auto* dp = static_cast<float*>(scratch(kGemmOut, gemm_out_bytes(din, down.w->rows())));
  const int down_blocks = dp ? gemm_products(weight_ref(*down.w), din, dp) : 0;
  const float lo = bf16 ? 1.0f : 1.0f / cuda::kGluLoShift;  // (glu_parts' f16 low part is shifted)
  if (down_blocks > 0) finish_product(down, dp, down_blocks, down.w->rows(), din, lo);
  return true;
}

bool CudaBackend::qkv_parts_attention(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv,
                                      const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& pos,
                                      const Tensor& inv_freq, const RopeSpec& spec, Tensor& k_cache, Tensor& v_cache,
                                      const AttentionSpec& attn, Tensor& out) {
  // Prefill q / k / v of one stacked GEMM (F16 / BF16 weights back to back): the RoPE + KV-write
  // kernel sums their partial products itself, so they need no combine pass of their own.
  if (x.rows() <= cuda::kGemvMaxTokens || qkv.size() != 3 || spec.head_dim % 4 != 0) return false;
  check_matmul_args(x, norm, qkv);  // (matmuls' checks first, as the composed ops would run them)
  for (const MatmulOut& o : qkv)
    if (o.accumulate) return false;
  int64_t m = 0;
  if (stacked_run(qkv, 0, m) != 3) return false;
  check_matmul_shapes(x, norm, qkv);
  const int32_t* positions = cuda::i32(pos);  // (checked before any kernel writes the caches)
  cuda::QkvArgs a;
  if (!qkv_args(*qkv[0].y, *qkv[1].y, *qkv[2].y, q_norm, k_norm, eps, pos, inv_freq, spec, attn.n_kv_heads, k_cache,
                v_cache, a))
    return false;
  if (failed() || !use_device()) return true;
  const DType t = qkv[0].w->dtype;
  GemmInput in;
  if (!gemm_input(cuda::f32(x), x.rows(), x.cols(), t == DType::kBF16, one_part(t, x.rows()),
                  norm.w ? cuda::f32(*norm.w) : nullptr, norm.eps, in))
    return true;
  float* yp = nullptr;
  const int blocks = rows_products(*qkv[0].w, m, in, yp);
  if (blocks == 0) return true;
  stacked_products_ += 3;
  cuda::QkvParts parts;
  parts.yp = yp;
  parts.blocks = blocks;
  parts.ld = m;
  parts.inv_scale = in.inv_scale;
  for (int i = 0; i < 3; ++i) parts.bias[i] = qkv[size_t(i)].bias ? cuda::f32(*qkv[size_t(i)].bias) : nullptr;
  parts.v = cuda::f32(*qkv[2].y);
  Tensor& q = *qkv[0].y;
  if (!note(cuda::rope_kv_write(cuda::f32(q), cuda::f32(*qkv[1].y), nullptr, positions, cuda::f32(inv_freq), a,
                                k_cache.data, v_cache.data, stream_, &parts),
            "rope_kv_write (q / k / v parts)"))
    return true;
  kv_written_ = {ops_, k_cache.data, v_cache.data, pos.data, x.rows()};
  ++qkv_part_ropes_;
  attention(q, k_cache, v_cache, pos, attn, out);
  return true;
}

}  // namespace shoal
