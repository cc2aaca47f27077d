// The CUDA backend: device memory, weight upload through a bounded pinned staging buffer (with
// Q8_0 / Q4_0 repacking), the op set of backend.h as kernels (kernels.h) and cuBLAS, and CUDA
// graphs for run_graph. Only src/backend/cuda/ includes this header; everyone else reaches it
// through create_backend("cuda:N") (backend.h).
//
// Errors: allocation and copies return Status (kOutOfMemory says needed and free bytes). An op
// cannot return one, so a failed launch or cuBLAS call is logged and kept as a sticky error:
// later ops are skipped and synchronize() / to_host() / to_device() / run_graph() return it. Out
// of device memory (an op's scratch, or cudaErrorMemoryAllocation from a launch or a graph's
// instantiation: nothing was launched without its memory, and CUDA keeps no error) is kOutOfMemory,
// returned once by the first of them and then cleared, so the backend serves the next step
// (take_error). Shape mistakes are bugs (SHOAL_CHECK). All work goes to one stream, in call order.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

namespace shoal {

class CudaBackend final : public Backend {
 public:
  /// Opens GPU `device`. Errors: kUnavailable (no such device, no driver), kInternal.
  static Result<std::unique_ptr<CudaBackend>> create(int device, const BackendOptions& opts);
  ~CudaBackend() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }
  uint64_t free_memory() const override;

  Result<Tensor> alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  Result<Tensor> alloc_weight(DType dtype, std::initializer_list<int64_t> shape) override;
  Result<std::vector<Tensor>> alloc_weights(DType dtype, std::span<const std::array<int64_t, 2>> shapes) override;
  Status upload_weight(Tensor& t, const void* bytes, uint64_t nbytes) override;
  /// The group's BF16 weights rewritten as F16 when every row of every one of them keeps its
  /// values to 2^-20 normalised (cuda::bf16_rows_not_f16), else none; one device sync (load time).
  Result<int> settle_weights(std::span<Tensor* const> ws) override;
  void free(Tensor& t) override;
  Status to_device(Tensor& t, const void* src, uint64_t nbytes, uint64_t offset) override;
  Status to_host(void* dst, const Tensor& t, uint64_t nbytes, uint64_t offset) override;
  bool asynchronous() const override { return true; }
  Status synchronize() override;
  /// advance_decode's kernel writes the slot in mapped pinned memory as a sequence lock; this
  /// polls the tag (sleeping 20 us between polls after 2 ms) and asks the stream every 50 us
  /// whether it still has work (no hang when the step never comes: a fault or nothing queued
  /// ends the wait with an error).
  Status wait_decoded(int64_t pos, int32_t* dst, int n) override;
  Status clear_decoded() override;

  void embed(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void matmul(const Tensor& w, const Tensor& x, Tensor& y, const Tensor* bias) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override;
  void layer_norm(const Tensor& x, const Tensor& w, const Tensor* b, float eps, Tensor& y) override;
  void add(const Tensor& a, const Tensor& b, Tensor& y) override;
  void scale(Tensor& x, float s) override;
  void rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec) override;
  void kv_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& pos) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                 const AttentionSpec& spec, Tensor& out) override;
  void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) override;
  void activation(const Tensor& x, Activation act, Tensor& out) override;
  void convert(const Tensor& src, Tensor& dst) override;
  void argmax(const Tensor& logits, Tensor& out) override;
  void top_k(const Tensor& logits, int k, Tensor& ids, Tensor& vals) override;
  void advance_decode(const Tensor& next, Tensor& ids, Tensor& pos) override;
  void sample(const Tensor& ids, const Tensor& vals, Tensor& state, Tensor& out) override;
  void top_k_sample(const Tensor& logits, int k, Tensor& ids, Tensor& vals, Tensor& state, Tensor& out) override;

  /// One kernel for the residual add and the norm.
  void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y) override;
  /// For n <= gemv_max_tokens one kernel reads gate and up rows together and applies act
  /// (gate_buf and up_buf unused); larger batches use the default composition.
  void matmul_glu(const Tensor& w_gate, const Tensor& w_up, const Tensor& x, Activation act, Tensor& gate_buf,
                  Tensor& up_buf, Tensor& out) override;
  /// For n <= gemv_max_tokens, products of the same weight kind go out as one GEMV launch with
  /// the norm and the accumulate fused in (h left unwritten); larger batches take gemm_matmuls.
  void matmuls(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs) override;
  /// One kernel for the norms, both RoPEs and the cache write (head_dim <= 256; Q8_0 caches
  /// need head_dim % 32 == 0); the default composition otherwise.
  void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm, float eps,
                     const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec, int n_kv_heads,
                     Tensor& k_cache, Tensor& v_cache) override;
  /// Where cuda::rope_kv_attention_supported takes the call (f16 or Q8_0 cache, head_dim 64 / 128,
  /// up to 8 tokens, no softcap): one kernel (the rope prologue inside decode attention); q and k
  /// are left raw. Otherwise rope_kv_write then attention.
  void rope_kv_attention(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm, float eps,
                         const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec, Tensor& k_cache,
                         Tensor& v_cache, const AttentionSpec& attn, Tensor& out) override;
  /// One token, plain weights, interleaved RoPE, no q / k norms, f16 caches: RoPE and the cache
  /// write in the q / k / v GEMV's epilogue (cuda::GemvRope), then attention() (q and k are
  /// left rotated). Otherwise matmuls then rope_kv_attention.
  void qkv_attention(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv, const Tensor* q_norm,
                     const Tensor* k_norm, float eps, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec,
                     Tensor& k_cache, Tensor& v_cache, const AttentionSpec& attn, Tensor& out) override;
  /// Prefill (more than kGemvMaxTokens tokens) of F16 or BF16 gate, up and down: the GLU writes the down
  /// product's input parts itself (cuda::glu_parts), so act(gate) * up is never written in f32
  /// (glu.y is left unwritten) nor read again by a split. Otherwise the composed default.
  void gated_ffn(const Tensor& in, const InputNorm& norm, const MatmulOut& glu, const MatmulOut& down) override;

  /// Captures `record` into a CUDA graph the first time (`owner`, `key`) is seen, replays it
  /// afterwards.
  Status run_graph(uint64_t key, const std::function<void()>& record, uint64_t owner = 0) override;
  void reset_graphs() override;
  /// Waits for the stream, then destroys the graphs recorded under `owner` (and the retired
  /// scratch buffers once no graph is left).
  void drop_graphs(uint64_t owner) override;
  /// Decode attention's plan for steps of at most `keys` keys (cuda::attention_keys_bound):
  /// class 1 plans for that bound, class 0 for the whole cache (also where no plan depends on
  /// it: steps of more than kDecodeAttnMaxTokens tokens, or a device without clusters).
  int plan_attention_keys(int64_t keys, int n_tokens) override;

  /// The stream every op is enqueued on (benchmarks time it with events).
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  /// GEMV launches so far whose bias / old y were read before their PDL wait (for tests).
  uint64_t early_epilogue_launches() const { return early_epilogues_; }
  /// qkv_attention calls so far that fused RoPE and the cache write into the GEMV (for tests).
  uint64_t rope_epilogue_launches() const { return rope_epilogues_; }
  /// GEMV launches so far that took their input as fragments from the GEMV before (for tests).
  uint64_t fragment_handoffs() const { return frag_handoffs_; }
  /// Decode qkv_attention calls so far whose Q8_0 q / k / v GEMV split K in two halves, summed
  /// by rope_kv_attention (qkv_split_attention; for tests).
  uint64_t qkv_split_launches() const { return qkv_splits_; }
  /// Whether qkv_split_attention may run (on unless SHOAL_CUDA_QKV_SPLIT=0 at creation; for tests
  /// and comparisons).
  void set_qkv_split(bool on) { qkv_split_ = on; }
  /// Prefill qkv_attention calls so far whose RoPE + KV-write kernel summed q / k / v from their
  /// stacked GEMM's partial products (qkv_parts_attention; for tests).
  uint64_t qkv_part_ropes() const { return qkv_part_ropes_; }
  /// Prefill inputs so far taken as parts from the residual add just before (MatmulOut::next;
  /// for tests).
  uint64_t split_handoffs() const { return split_handoffs_; }
  /// Prefill gated_ffn calls so far whose GLU wrote the down product's input parts (for tests).
  uint64_t glu_part_ffns() const { return glu_part_ffns_; }
  /// Attention calls so far over Q8_0 caches that ran on the tensor-core kernels (for tests).
  uint64_t q8_tensor_core_attention() const { return q8_mma_attention_; }
  /// Attention calls so far of more than kGemvMaxTokens tokens that ran on the decode kernel (one
  /// cluster; cuda::kDecodeAttnMaxTokens; for tests).
  uint64_t decode_kernel_batches() const { return decode_kernel_batches_; }
  /// Graphs recorded by run_graph and held now (for tests).
  size_t recorded_graphs() const { return graphs_.size(); }
  /// Scratch buffers allocated so far (a slot's first use, or a call that outgrew it; for tests).
  uint64_t scratch_allocations() const { return scratch_allocs_; }
  /// Whether a quantized GLU GEMV also writes its output as the next GEMV's activation
  /// fragments (GemvOpts::frags_out), taken by a quantized GEMV launched right after on that
  /// output. On unless SHOAL_CUDA_FRAGS=0 at creation; for tests and comparisons.
  void set_fragment_handoff(bool on) { frags_ = on; }
  /// gemm_quant launches so far (a q / k / v launch counts once; for tests).
  uint64_t quant_gemm_launches() const { return qgemm_launches_; }
  /// Those of them that split K (cuda::QuantGemmSplit; for tests).
  uint64_t quant_gemm_split_launches() const { return qgemm_split_launches_; }
  /// Those of them with two blocks per SM (Q4_0 at 32 columns; for tests).
  uint64_t quant_gemm_two_block_launches() const { return qgemm_two_block_launches_; }
  /// Those of them with items of 128 tokens in two parts (256 MMA columns; for tests).
  uint64_t quant_gemm_wide_launches() const { return qgemm_wide_launches_; }
  /// Whether this device runs gemm_quant (cuda::gemm_quant_available, probed at creation).
  bool quant_gemm_available() const { return qgemm_available_; }
  /// The most tokens a matmul of weights `ws` (null entries skipped) runs on the GEMV:
  /// kGemvMaxTokens, or kQuantGemmMinTokens - 1 where all of them are Q8_0 / Q4_0 and gemm_quant
  /// is on.
  int64_t gemv_max_tokens(std::initializer_list<const Tensor*> ws) const;
  /// The same over every w and up of `outs`; kGemvMaxTokens for an empty list or mixed kinds.
  int64_t gemv_max_tokens(std::span<const MatmulOut> outs) const;
  /// gemm_quant for quantized prefill products where the device runs it (on; the default unless
  /// SHOAL_CUDA_QGEMM=0 at creation), or cuBLAS on dequantized parts (off).
  void set_quant_gemm(bool on) { qgemm_ = on && qgemm_available_; }
  /// gemm_quant's work items of calls with two parts: `tokens` tokens each (16, 32, 64 or 128),
  /// or 0 (the default) for gemm_quant's choice; for tests and benchmarks of each width.
  void set_quant_gemm_item_tokens(int tokens) { qgemm_item_tokens_ = tokens; }
  /// BF16 weights rewritten as F16 by settle_weights so far (for tests).
  uint64_t bf16_as_f16_weights() const { return bf16_as_f16_weights_; }
  /// Whether settle_weights rewrites BF16 weights as F16 where that keeps each row to 2^-20
  /// (on unless SHOAL_CUDA_BF16_AS_F16=0 at creation); for tests and comparisons.
  void set_bf16_as_f16(bool on) { bf16_as_f16_ = on; }
  /// Prefill inputs split into one 16-bit part instead of exact parts (BackendOptions::half_prefill,
  /// where one_part; for tests); counted per split.
  uint64_t half_prefill_inputs() const { return half_inputs_; }
  /// Prefill products so far that shared one GEMM with others whose weights lie next to theirs
  /// (gemm_matmuls; for tests and benchmarks).
  uint64_t stacked_products() const { return stacked_products_; }
  /// After a kernel launched on stream() outside the ops (cuda_probe): the next op must not read
  /// anything early behind it (see last_op_may_write).
  void forget_writes() {
    written_.op = 0;
    frags_written_.op = 0;
  }

 private:
  CudaBackend() = default;
  /// SHOAL_CHECKs top_k's shapes (k <= cuda::kTopKMax).
  static void check_top_k(const Tensor& logits, int k, const Tensor& ids, const Tensor& vals);
  enum Scratch {
    kAttnScratch,
    kSampleScratch,
    kGemmWeight,
    kGemmInput,
    kGemmInput2,  // the next input, written while kGemmInput's is still read (and in turn)
    kGemmOut,
    kGemmUp,
    kFrags,     // GEMV activation fragments (GemvOpts::frags_out / frags_in)
    kQkvParts,  // the second halves' partials of a split-K q / k / v GEMV (qkv_split_attention)
    kScratchCount
  };

  /// The activations of a prefill product as 16-bit parts (gemm_prep.cu split_activations):
  /// x16 [parts][n][k] then inv_scale [n] in scratch `slot` (kGemmInput, or kGemmInput2 for
  /// parts a producer wrote while it still read an input in kGemmInput: glu_parts, and
  /// combine_split, which alternate).
  struct GemmInput {
    const uint16_t* x16 = nullptr;
    const float* inv_scale = nullptr;
    int64_t n = 0, k = 0;
    bool bf16 = false;
    int parts = 2;
    Scratch slot = kGemmInput;
    /// Parts of an input: one (half), else hi + lo (f16) or hi + mid + lo (bf16).
    static int parts_of(bool half, bool bf16) { return half ? 1 : bf16 ? 3 : 2; }
    /// An input of n rows of k values in parts_of(half, bf16) parts, not yet placed.
    static GemmInput of(int64_t n, int64_t k, bool bf16, bool half) {
      GemmInput in;
      in.n = n;
      in.k = k;
      in.bf16 = bf16;
      in.parts = parts_of(half, bf16);
      return in;
    }
  };
  /// Points in.x16 and in.inv_scale into scratch `slot` for in's n, k and parts. False on error
  /// (sticky).
  bool gemm_input_buffer(GemmInput& in, Scratch slot);
  /// The input slot other than s (GemmInput::slot).
  static Scratch other_input(Scratch s) { return s == kGemmInput ? kGemmInput2 : kGemmInput; }

  Status init(int device);
  /// Keeps the first error of an op (sticky; cudaErrorMemoryAllocation as a kOutOfMemory that
  /// take_error clears, which any other CUDA or cuBLAS error replaces) and logs it; returns false
  /// on error.
  bool note(cudaError_t e, const char* what);
  bool note_cublas(cublasStatus_t s, const char* what);
  bool failed() const { return !error_.ok(); }
  /// The error for a caller: error_, cleared when it is only out of memory (the ops after it were
  /// skipped, the device and stream are sound).
  Status take_error();
  /// Makes device_ current on the calling thread (cudaSetDevice only where another one is).
  cudaError_t make_current() const;
  /// make_current(), a failure noted as the sticky error; counts the op (ops_).
  bool use_device();
  /// Device buffer of at least `bytes` for `slot`; a grown slot keeps its old buffer alive until
  /// reset_graphs() (a captured graph may still use it). nullptr and error_ (kOutOfMemory, cleared
  /// by take_error) when it cannot be allocated.
  void* scratch(Scratch slot, uint64_t bytes);
  Result<void*> device_malloc(uint64_t bytes, const char* what);
  /// Copies n host bytes to device memory through the pinned staging halves (double-buffered).
  /// With `q4` / `q8` set, the bytes are GGUF blocks repacked into quants/scales instead.
  Status stage_upload(const uint8_t* src, uint64_t n, uint8_t* dst, const Tensor* repack);
  /// The two repacking buffers (raw_), allocated with the first Q8_0 / Q4_0 weight, before the
  /// weights fill the device (an upload after them could not get its 64 MiB).
  Status ensure_repack_buffers();
  cuda::WeightRef weight_ref(const Tensor& w) const;
  /// matmul for n > gemv_max_tokens tokens (cuda_gemm.cc: cuBLAS, or gemm_quant); x as one 16-bit
  /// part when `half` (one_part).
  void gemm(const cuda::WeightRef& w, const float* x, int64_t n, float* y, const float* bias, bool half);
  /// Whether a prefill product of n tokens of weights of dtype t takes x as one 16-bit part: with
  /// half_prefill_, F16 / BF16 (cuBLAS) and Q8_0 / Q4_0 where gemm_quant runs them, of more than
  /// kGemvMaxTokens tokens (calls of up to 8 tokens, decode and drafts, stay exact wherever they run).
  bool one_part(DType t, int64_t n) const {
    return half_prefill_ && n > cuda::kGemvMaxTokens &&
           (t == DType::kF16 || t == DType::kBF16 || (qgemm_ && (t == DType::kQ8_0 || t == DType::kQ4_0)));
  }
  /// Splits x [n, k] (RMSNorm'ed with norm_w when not null) into 16-bit parts (bf16: 3, else 2
  /// f16 parts; one part when `half`, i.e. one_part for every product). False on
  /// error (sticky).
  bool gemm_input(const float* x, int64_t n, int64_t k, bool bf16, bool half, const float* norm_w, float eps,
                  GemmInput& in);
  /// Partial products of w [m, k] (F16, BF16, Q8_0 or Q4_0) with the parts into yp [blocks][n][m]
  /// (a scratch of gemm_out_bytes), before the tokens' 1 / scale; returns blocks (on gemm_quant 1:
  /// the parts already summed), 0 on error (sticky).
  int gemm_products(const cuda::WeightRef& w, const GemmInput& in, float* yp);
  /// gemm_products over `rows` rows of weights starting at `first` (weights back to back taken as
  /// one: q / k / v, gate / up) into yp, a scratch (kGemmOut) it allocates; returns blocks, 0 on
  /// error (sticky).
  int rows_products(const Tensor& first, int64_t rows, const GemmInput& in, float*& yp);
  /// rope_kv_write's kernel arguments (cuda::QkvArgs) for these tensors; false where that kernel
  /// does not take them (the op composes rope and kv_write instead). Shape errors are bugs
  /// (SHOAL_CHECK).
  bool qkv_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                float eps, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec, int n_kv_heads,
                const Tensor& k_cache, const Tensor& v_cache, cuda::QkvArgs& a) const;
  /// qkv_attention for a prefill whose q / k / v weights (F16 / BF16) lie back to back: one GEMM,
  /// then rope_kv_write summing q, k and v from its partial products (cuda::QkvParts), then
  /// attention. False where that does not apply (nothing run); true otherwise, also on error
  /// (sticky).
  bool qkv_parts_attention(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv,
                           const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& pos,
                           const Tensor& inv_freq, const RopeSpec& spec, Tensor& k_cache, Tensor& v_cache,
                           const AttentionSpec& attn, Tensor& out);
  /// qkv_attention for one token of Q8_0 q / k / v weights where rope_kv_attention fuses (Q4_0's
  /// step measured slower with it: docs/cuda.md, v58):
  /// the GEMV splits K in two column halves (cuda::GemvOpts::split_k: Llama-3-8B's 384 tiles of
  /// units take 2.9 rounds of half units instead of 1.45 of whole ones), and rope_kv_attention
  /// sums each half's partials and applies the input norm's 1 / rms as it reads q, k and v (no
  /// bias). False where that does not apply (nothing run); true otherwise, also on error (sticky).
  bool qkv_split_attention(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv,
                           const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& pos,
                           const Tensor& inv_freq, const RopeSpec& spec, Tensor& k_cache, Tensor& v_cache,
                           const AttentionSpec& attn, Tensor& out);
  /// Whether rope_kv_attention runs the fused kernel for these arguments (else it composes the
  /// plain ops); after_cache_write: the op just before wrote these caches.
  bool rope_attention_fusable(const cuda::AttnArgs& a, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                              const RopeSpec& spec, const AttentionSpec& attn, bool after_cache_write) const;
  /// rope_kv_attention; with `parts` q, k and v are first partials, and parts' q2 / k2 / v2 /
  /// in_ss / in_cols / in_eps (cuda::AttnRope) the rest (then the fused kernel must apply:
  /// SHOAL_CHECK).
  void rope_kv_attention_parts(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                               float eps, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec,
                               Tensor& k_cache, Tensor& v_cache, const AttentionSpec& attn, Tensor& out,
                               const cuda::AttnRope* parts);
  /// The gate / up products of a prefill GLU (o.up set) for combine_glu / glu_parts: one GEMM
  /// over both where stack_glu says so (up = gate + rows, ld = 2 rows), else two (ld 0). False on
  /// error (sticky).
  struct GluProducts {
    const float* gate = nullptr;
    const float* up = nullptr;
    int gate_blocks = 0, up_blocks = 0;
    int64_t ld = 0;
  };
  bool glu_products(const MatmulOut& o, const GemmInput& in, GluProducts& p);
  /// gated_ffn through cuda::glu_parts where it applies (F16 / BF16 weights, prefill); false where it
  /// does not (nothing run), true otherwise, also on error (sticky).
  bool glu_parts_ffn(const Tensor& in, const InputNorm& norm, const MatmulOut& glu, const MatmulOut& down);
  /// The sum of product o's parts yp (rows ld apart, lo as combine_parts, in.inv_scale) into
  /// o.y; for a residual add with MatmulOut::next that is the `last` product of its call,
  /// cuda::combine_split into the slot other than in's, its parts handed to the next op's
  /// gemm_input (split_handoff_). False on error (sticky).
  bool finish_product(const MatmulOut& o, const float* yp, int blocks, int64_t ld, const GemmInput& in,
                      float lo = 1.0f, bool last = true);
  /// One gemm_quant launch (kernels.h) of `count` weights on in.x16 with inv_scale (null: the
  /// parts' sums before 1 / scale), counted in quant_gemm_launches(). False on error (sticky).
  bool run_gemm_quant(const cuda::WeightRef* ws, const cuda::QuantGemmOut* outs, int count, const GemmInput& in,
                      const float* inv_scale, bool glu, cuda::Act act);
  static uint64_t gemm_out_bytes(const GemmInput& in, int64_t m) { return uint64_t(in.parts) * uint64_t(in.n * m) * 4; }
  /// The products of the split input on one gemm_quant launch with their epilogues in the kernel:
  /// one to kGemvMaxOuts products of one quantized kind (distinct outputs), or one gate / up pair
  /// of one kind and shape without bias or residual add. False (nothing done) when they do not
  /// qualify (no gemm_quant, mixed kinds, a GLU pair with another product).
  bool quant_gemm_together(const GemmInput& in, std::span<const MatmulOut> outs);
  /// matmuls for n > kGemvMaxTokens: x split once (with the norm fused) for every product; on
  /// gemm_quant the epilogues run in its kernel (quant_gemm_together), otherwise each product's
  /// parts are summed by one kernel with its epilogue (bias, residual add, or act(gate) * up).
  /// False when the products do not qualify (an F32 weight, BF16 mixed with other kinds, a GLU of
  /// rows % 4 != 0): the caller composes the plain ops then.
  bool gemm_matmuls(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs);
  /// The shape checks of both matmuls paths (a mismatch is a bug: SHOAL_CHECK).
  static void check_matmul_shapes(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs);
  /// matmuls' other preconditions: weights and outputs present, a norm with its h, no y or h
  /// aliasing x, no two outputs sharing y (SHOAL_CHECK).
  static void check_matmul_args(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs);

  int device_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  // Staging: a pinned host buffer in two halves, each with the event of its last copy, and
  // (for repacking) two device buffers of the same size.
  uint8_t* pinned_ = nullptr;
  uint8_t* raw_[2] = {nullptr, nullptr};
  cudaEvent_t staged_[2] = {nullptr, nullptr};
  int next_half_ = 0;
  // advance_decode's publications: kDecodedSlots slots of 16 words in mapped pinned memory,
  // [0] the tag (a position; -1 none or being written), [1] the count, [2..] the ids
  // (cuda::kDecodedWords).
  int32_t* decoded_ = nullptr;
  int32_t* decoded_device_ = nullptr;  // the same memory as the device addresses it
  std::array<std::pair<void*, uint64_t>, kScratchCount> scratch_{};
  std::vector<void*> retired_;
  // alloc_weights' blocks: weight -> its block, block -> weights not yet freed.
  std::unordered_map<void*, void*> weight_block_;
  std::unordered_map<void*, size_t> weight_blocks_;
  std::map<std::pair<uint64_t, uint64_t>, cudaGraphExec_t> graphs_;  // (owner, key) -> graph
  bool capturing_ = false;
  int64_t attn_keys_ = 0;  // AttnArgs::max_keys of the ops recorded next (plan_attention_keys)
  /// Records the device bytes of `ts` as written by the op just launched (ops_); an empty tensor
  /// among them leaves the op unrecorded. The ops a residual-adding GEMV follows in a decode step
  /// record theirs (matmuls, attention, rope_kv_attention, activation, glu); an op that records
  /// nothing counts as writing anything.
  void wrote(std::span<const Tensor* const> ts);
  void wrote(std::initializer_list<const Tensor*> ts) { wrote(std::span<const Tensor* const>(ts.begin(), ts.size())); }
  /// Whether the op launched last (before the next use_device()) may have written any of the
  /// `n` bytes at p: true unless it recorded its writes and none overlaps them.
  bool last_op_may_write(const void* p, uint64_t n) const;

  // Ops seen by use_device() (every op and copy passes it), and the last KV write: its op, its
  // caches and positions (an attention right after it may load the older keys early).
  uint64_t ops_ = 0;
  uint64_t early_epilogues_ = 0, rope_epilogues_ = 0, frag_handoffs_ = 0, qgemm_launches_ = 0, half_inputs_ = 0,
           stacked_products_ = 0, qkv_part_ropes_ = 0, glu_part_ffns_ = 0, split_handoffs_ = 0, q8_mma_attention_ = 0,
           scratch_allocs_ = 0, qgemm_split_launches_ = 0, qgemm_two_block_launches_ = 0,
           qgemm_wide_launches_ = 0, decode_kernel_batches_ = 0, qkv_splits_ = 0;
  bool frags_ = true;
  bool qkv_split_ = true;
  bool half_prefill_ = false;     // BackendOptions::half_prefill
  bool qgemm_available_ = false;  // cuda::gemm_quant_available() on this device
  cuda::QuantGemmSplit qsplit_;   // gemm_quant's split-K scratch (with qgemm_available_)
  bool qgemm_ = false;            // gemm_quant for quantized prefill products
  int qgemm_item_tokens_ = 0;     // set_quant_gemm_item_tokens
  bool bf16_as_f16_ = true;       // settle_weights rewrites BF16 as F16
  uint64_t bf16_as_f16_weights_ = 0;
  // The fragments the last GEMV with frags_out wrote (one token): its op, y, rows and buffer.
  // One buffer is enough: a launch that writes them runs after its PDL wait, i.e. after every
  // earlier kernel, including the last one that read them.
  struct {
    uint64_t op = 0;
    const void* y = nullptr;
    int64_t cols = 0;
    void* data = nullptr;
  } frags_written_;
  struct {
    uint64_t op = 0;  // 0: none recorded (ops_ counts from 1)
    int n = 0;
    std::array<std::pair<uintptr_t, uintptr_t>, 3> ranges{};  // [begin, end) of each write (<= 3 per op)
  } written_;
  // The positions advance_decode last wrote ([begin, end)) and its op. Decode attention reads
  // pos before its PDL wait, so it must not directly follow that kernel (a SHOAL_CHECK: in a
  // chained step advance_decode is the graph's last op).
  struct {
    uint64_t op = 0;
    uintptr_t begin = 0, end = 0;
  } pos_advanced_;
  /// SHOAL_CHECKs that op `prev` (the op before decode attention) was not an advance_decode
  /// writing `pos`.
  void check_pos_not_just_advanced(const Tensor& pos, uint64_t prev) const;
  /// matmuls(), with the RoPE / KV cache epilogue when `rope` is given (qkv_attention), or split K
  /// with the second halves' partials at y2[i] of outs[i] and the halves' sums of squares at
  /// split_ss when `y2` is given (qkv_split_attention: one GEMV launch, which the caller checked;
  /// cuda::GemvOpts::split_k).
  void launch_matmuls(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs,
                      const cuda::GemvRope* rope, float* const* y2 = nullptr, float* split_ss = nullptr);
  /// Whether qkv_attention can fuse RoPE and the cache write into the GEMV (its conditions).
  bool rope_in_products(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv, const Tensor* q_norm,
                        const Tensor* k_norm, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec,
                        const Tensor& k_cache, const Tensor& v_cache, const AttentionSpec& attn) const;
  struct {
    uint64_t op = 0;
    const void *k = nullptr, *v = nullptr, *pos = nullptr;
    int64_t n = 0;
  } kv_written_;
  // The next op's input parts written by the residual add of op `op` (finish_product): taken by
  // gemm_input in op op + 1 for the same x, norm and split.
  struct {
    uint64_t op = 0;
    GemmInput in;
    const void* x = nullptr;
    const void* norm_w = nullptr;
    float eps = 0.0f;
  } split_handoff_;
  Status error_;
  bool oom_only_ = false;  // error_ is out of device memory only (take_error clears it)
};

}  // namespace shoal
