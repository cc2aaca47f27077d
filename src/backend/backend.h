// The backend interface: memory and a small op set. Model code (src/model/, src/runtime/) calls
// these ops; each backend implements them (cpu/ reference + fast, cuda/). The CPU reference
// backend is the oracle every other backend is tested against (tests/cuda/, tests/cpu_*).
//
// Conventions
// - Activations are f32, row-major: x [n_tokens, width]. Weights are [out, in] in file layout
//   (F32, F16, BF16, Q8_0, Q4_0; other quant types are converted to Q8_0 before upload).
// - Ops are enqueued in call order and may run asynchronously (CUDA); to_host() and
//   synchronize() wait. Ops never read host-side values that change between decode steps:
//   positions come from a tensor, so a backend may record a step once and replay it (run_graph).
// - Errors in ops are bugs (shapes are checked with SHOAL_CHECK); allocation and copies return
//   Status because they meet the outside world (out of memory, device lost).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/tensor.h"
#include "core/status.h"

namespace shoal {

/// Elementwise activations (HF `hidden_act` names in comments).
enum class Activation {
  kSilu,       // "silu": x * sigmoid(x)
  kGeluTanh,   // "gelu_pytorch_tanh", "gelu_new": tanh approximation
  kGeluErf,    // "gelu": exact, erf-based
};

/// Rotary position embedding (RoFormer, arXiv:2104.09864) for one q or k tensor.
struct RopeSpec {
  int n_heads = 0;     // heads in the tensor
  int head_dim = 0;
  int rot_dims = 0;    // leading dims of each head that rotate (partial RoPE: < head_dim)
  bool interleaved = false;  // true: pairs (2i, 2i+1) (GGUF `llama` files, GPT-J);
                             // false: pairs (i, i + rot_dims/2) (HF rotate_half, NeoX)
  float attn_factor = 1.0f;  // scales cos and sin (YaRN magnitude); 1 otherwise
};

/// Causal attention of a batch of queries against a layer's KV cache (GQA when
/// n_kv_heads < n_heads; head h reads kv head h / (n_heads / n_kv_heads)).
struct AttentionSpec {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.0f;      // usually 1/sqrt(head_dim)
  int sliding_window = 0;  // 0: full; else a query at p sees keys in (p - window, p]
  float softcap = 0.0f;    // 0: none; else logits = softcap * tanh(logits / softcap) (Gemma 2)
};

/// One product of Backend::matmuls(): y = in · wᵀ (+ bias); with `up`, y = act(in · wᵀ) *
/// (in · upᵀ) (SwiGLU / GeGLU, no bias); with `accumulate`, the result is added to y (the
/// residual add of a block). w, up: weights [out, in]; y: f32 [n, out]; bias: f32 [out];
/// tmp: f32 scratch [n, out] that composing backends need for `up` and `accumulate`. next (a
/// hint, with `accumulate`, on the last product of a matmuls() call): the norm through which the
/// op after this one reads y (the next block's input); a backend may prepare that input while
/// it writes y (CUDA prefill).
struct InputNorm;
struct MatmulOut {
  const Tensor* w = nullptr;
  Tensor* y = nullptr;
  const Tensor* bias = nullptr;
  const Tensor* up = nullptr;
  Activation act = Activation::kSilu;
  bool accumulate = false;
  Tensor* tmp = nullptr;
  const InputNorm* next = nullptr;
};

/// The RMSNorm Backend::matmuls() applies to its input first (w null: none). h: f32 like x; it
/// receives rms_norm(x) where a backend composes the ops; backends that fuse the norm into the
/// products leave it unwritten.
struct InputNorm {
  const Tensor* w = nullptr;
  float eps = 0.0f;
  Tensor* h = nullptr;
};

enum class DeviceKind { kCpu, kCuda };

struct BackendOptions {
  int threads = 0;         // CPU threads (0: all hardware threads)
  bool reference = false;  // CPU: the plain single-threaded oracle path
  /// CUDA: prefill products (more than 8 tokens) take the activations rounded to one 16-bit part
  /// (f16 under a power-of-two scale per token; bf16 for BF16 weights): half (BF16: a third) of
  /// the exact path's tensor-core work, which multiplies by x = hi + lo (BF16: hi + mid + lo).
  /// For F16 / BF16 weights, and Q8_0 / Q4_0 where gemm_quant runs them (Hopper); a matmuls call
  /// splits x once, so it takes one part only where all of its products can. llama.cpp's
  /// numerics for F16 weights: about 2^-11 (f16) / 2^-8 (bf16) relative error per activation,
  /// ~3e-4 / ~2e-3 normalised error per product, instead of ~1e-7. Prefill attention on the
  /// tensor cores (f16 caches) takes q (times the softmax scale) and the softmax weights p
  /// rounded to f16 once, without a lo part, as llama.cpp's flash attention does (within 3e-3 of
  /// the f32 result in the tests). Off (exact) by default.
  /// Decode (one to 8 tokens) is exact either way, and so is the attention of 9-16 tokens where
  /// the CUDA decode kernel's cluster takes it (sm_90, steps of at most 1792 keys); CPU backends
  /// compute in f32 and ignore it.
  /// `--prefill-precision half` on the command line.
  bool half_prefill = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  /// "cpu (avx512, 2 threads)", "cuda:0 NVIDIA H200".
  virtual std::string name() const = 0;
  /// Bytes of memory this backend can still allocate (device memory; host RAM for the CPU); 0 when
  /// it cannot tell (a failed query, logged).
  virtual uint64_t free_memory() const = 0;
  /// True when ops are queued and run later (CUDA); false when each op is done on return (CPU).
  virtual bool asynchronous() const { return false; }

  // ---- memory -------------------------------------------------------------------------------
  /// A tensor for activations, caches or state, contents undefined. Errors: kOutOfMemory saying
  /// how much was asked for and how much is free.
  virtual Result<Tensor> alloc(DType dtype, std::initializer_list<int64_t> shape) = 0;
  /// A weight tensor in this backend's layout (may differ from the file layout: repacking).
  virtual Result<Tensor> alloc_weight(DType dtype, std::initializer_list<int64_t> shape) = 0;
  /// Weights [rows, cols] of one dtype, as alloc_weight each, placed back to back in one block
  /// where the backend gains from it (CUDA: F16 / BF16 prefill products over weights that lie
  /// next to each other share one GEMM, e.g. a layer's q / k / v or gate / up). Each is freed
  /// with free() as usual; a block's memory returns when its last weight is freed. Default: one
  /// alloc_weight each. Errors: as alloc_weight (nothing stays allocated).
  virtual Result<std::vector<Tensor>> alloc_weights(DType dtype, std::span<const std::array<int64_t, 2>> shapes);
  /// Fills a weight from file-layout bytes (exactly t's nbytes(), host memory).
  virtual Status upload_weight(Tensor& t, const void* bytes, uint64_t nbytes) = 0;
  /// After the upload of a group of weights that run together (a layer's matrices, or one global
  /// matrix): may rewrite, in place, all of its weights of one type in another type of the same
  /// size that holds their values to far below the matmul tests' tolerance, or none of them, so
  /// that fused paths see one kind. Sets the dtype of each rewritten tensor (copies taken before
  /// are stale; uploads into it must then be in the new type). Returns how many it rewrote.
  /// Default: none. CUDA: BF16 as F16 where each row keeps its values to 2^-20 normalised
  /// (cuda::bf16_rows_not_f16), so exact prefill products take two f16 activation parts instead
  /// of three bf16 ones. Errors: the backend's.
  virtual Result<int> settle_weights(std::span<Tensor* const> ws) {
    (void)ws;
    return 0;
  }
  virtual void free(Tensor& t) = 0;
  /// Copies host bytes into t at byte offset `offset` (plain layouts only).
  virtual Status to_device(Tensor& t, const void* src, uint64_t nbytes, uint64_t offset = 0) = 0;
  /// Copies bytes of t to host memory; waits for queued ops first.
  virtual Status to_host(void* dst, const Tensor& t, uint64_t nbytes, uint64_t offset = 0) = 0;
  /// Waits for every queued op. Errors: kInternal (device fault), kOutOfMemory (an op since the
  /// last call ran out of device memory and was skipped with the ops after it; returned once, the
  /// backend serves later ops).
  virtual Status synchronize() = 0;
  /// Chained decoding's read-back: the host reads step N's ids while step N + 1 runs, with
  /// nothing queued between the steps. advance_decode publishes its next[0..n) to the host,
  /// tagged with the position it advanced from (pos[0] before the advance); wait_decoded(pos)
  /// waits for the publication tagged pos and copies its n ids to dst. A publication lives in
  /// slot pos modulo kDecodedSlots until a later step of the same slot replaces it, so the
  /// steps queued past the oldest one not yet waited for must fall in other slots (one id per
  /// step: up to kDecodedSlots - 1 of them). clear_decoded waits for every queued op and forgets
  /// every publication (call it before a chain: positions repeat after a rewind).
  /// Errors: kInvalidArgument (n not in 1..kDecodedMax or not the published count, pos outside
  /// 0..INT32_MAX), kFailedPrecondition (no step at pos published and none queued that could,
  /// the publication replaced while being read, a wait inside run_graph), kInternal (device
  /// fault).
  static constexpr int kDecodedSlots = 4;
  static constexpr int kDecodedMax = 14;
  virtual Status wait_decoded(int64_t pos, int32_t* dst, int n);
  virtual Status clear_decoded();

  // ---- ops ------------------------------------------------------------------------------------
  /// out[i, :] = table[ids[i], :] as f32. table: [vocab, d] any weight dtype; ids: i32 [n];
  /// out: f32 [n, d].
  virtual void embed(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  /// y = x · wᵀ (+ bias). w: [out, in] weight; x: f32 [n, in]; bias: f32 [out] or null;
  /// y: f32 [n, out]. n == 1 is a GEMV.
  virtual void matmul(const Tensor& w, const Tensor& x, Tensor& y, const Tensor* bias = nullptr) = 0;
  /// RMSNorm (Zhang & Sennrich 2019) over groups of w.cols() values: y = x / rms(x) * w.
  /// x, y: f32 [n, k * w.cols()] (k > 1 normalises each head); w: f32 [group]. y may alias x.
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) = 0;
  /// LayerNorm (Ba et al. 2016) per row: y = (x - mean) / sqrt(var + eps) * w + b. b may be null.
  virtual void layer_norm(const Tensor& x, const Tensor& w, const Tensor* b, float eps, Tensor& y) = 0;
  /// y = a + b, f32, same shape; y may alias a or b.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& y) = 0;
  /// x *= s, f32.
  virtual void scale(Tensor& x, float s) = 0;
  /// Rotates x in place. x: f32 [n, spec.n_heads * spec.head_dim]; pos: i32 [n];
  /// inv_freq: f32 [rot_dims / 2], the per-pair frequencies (scaling already applied).
  virtual void rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec) = 0;
  /// Stores k and v rows at cache rows pos[i]. k, v: f32 [n, n_kv_heads * head_dim];
  /// k_cache, v_cache: [n_ctx, n_kv_heads * head_dim] of F32, F16 or Q8_0; pos: i32 [n].
  virtual void kv_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                        const Tensor& pos) = 0;
  /// out[i] = softmax(q[i] · Kᵀ · scale, causal up to pos[i]) · V per head.
  /// q: f32 [n, n_heads * head_dim]; caches as in kv_write; pos: i32 [n] (increasing);
  /// out: f32 [n, n_heads * head_dim].
  virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const Tensor& pos, const AttentionSpec& spec, Tensor& out) = 0;
  /// out = act(gate) * up (SwiGLU, GeGLU; Shazeer 2020). All f32 [n, d_ff]; out may alias.
  virtual void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) = 0;
  /// out = act(x), f32; out may alias x.
  virtual void activation(const Tensor& x, Activation act, Tensor& out) = 0;
  /// Converts between f32, f16 and bf16 (hidden-state hops). Same shape.
  virtual void convert(const Tensor& src, Tensor& dst) = 0;
  /// out[i] = argmax_j logits[i, j] (lowest index on ties). logits: f32 [n, V]; out: i32 [n].
  virtual void argmax(const Tensor& logits, Tensor& out) = 0;
  /// The k largest logits of row 0, sorted descending (ties: lower index first).
  /// logits: f32 [1, V]; ids: i32 [k]; vals: f32 [k].
  virtual void top_k(const Tensor& logits, int k, Tensor& ids, Tensor& vals) = 0;
  /// Draws a token from the k candidates of top_k (ids i32 [k], vals f32 [k], sorted descending,
  /// k <= 1024) as the host Sampler does: pick_candidate (sampling_math.h) with the settings of
  /// `state` (a DeviceSampling: i32 [8]) and uniform_draw(seed, draw); writes out i32 [1] and
  /// adds 1 to state's draw.
  virtual void sample(const Tensor& ids, const Tensor& vals, Tensor& state, Tensor& out) = 0;
  /// top_k then sample from its candidates, as one op (a sampled step of a chained decode): ids
  /// i32 [k] / vals f32 [k] get top_k's candidates, out i32 [1] the drawn id, state's draw moves
  /// on by one. The default runs the two ops; a device may fuse them (CUDA: the draw in top-k's
  /// last kernel).
  virtual void top_k_sample(const Tensor& logits, int k, Tensor& ids, Tensor& vals, Tensor& state, Tensor& out);
  /// The inputs of the next decode step, made on the device (chained decoding: a step feeds its
  /// own argmax or drawn token to the next without the host): ids[i] = next[i], pos[i] += n,
  /// and next published to the host under the tag pos[0] (wait_decoded; pos[0] >= 0). next,
  /// ids, pos: i32 [n], 1 <= n <= kDecodedMax; no two of them alias.
  virtual void advance_decode(const Tensor& next, Tensor& ids, Tensor& pos) = 0;

  // ---- fused ops (defaults compose the ops above; fast backends override) ---------------------
  /// x += delta; y = rms_norm(x, w). x, delta, y: f32 [n, d].
  virtual void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y);
  /// out = act(x · w_gateᵀ) * (x · w_upᵀ). gate_buf, up_buf: scratch f32 [n, d_ff].
  virtual void matmul_glu(const Tensor& w_gate, const Tensor& w_up, const Tensor& x, Activation act,
                          Tensor& gate_buf, Tensor& up_buf, Tensor& out);

  /// Products of one input (q, k and v; gate and up; the LM head): in = rms_norm(x) when
  /// norm.w (f32 [in]) is set, else x (f32 [n, in]); then every out as MatmulOut says. Fast
  /// backends run them as one launch with the norm and the residual add fused in. No y may
  /// alias x or another y, and h must not alias x. Errors are bugs (SHOAL_CHECK): missing h or
  /// tmp, shapes that do not match, aliasing.
  virtual void matmuls(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs);
  /// The attention prologue of a layer: per-head RMSNorm of q and of k with q_norm / k_norm
  /// (f32 [head_dim], either may be null; Qwen3, Gemma 3), RoPE of q (spec) and of k (spec with
  /// n_kv_heads heads), then kv_write(k_cache, v_cache, k, v, pos). q: f32 [n, spec.n_heads *
  /// head_dim], k, v: f32 [n, n_kv_heads * head_dim], pos: i32 [n], inv_freq as in rope(); q and
  /// k are normed and rotated in place. Errors are bugs (SHOAL_CHECK on shapes), as in the ops.
  virtual void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                             float eps, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec,
                             int n_kv_heads, Tensor& k_cache, Tensor& v_cache);
  /// rope_kv_write(...) then attention(q, k_cache, v_cache, pos, attn, out): a layer's attention
  /// from the raw q, k, v. Backends that fuse the two may leave q and k unrotated.
  virtual void rope_kv_attention(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                                 float eps, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec,
                                 Tensor& k_cache, Tensor& v_cache, const AttentionSpec& attn, Tensor& out);
  /// A layer's attention from its input: matmuls(x, norm, qkv), where qkv holds exactly the q, k
  /// and v products in that order, then rope_kv_attention(*qkv[0].y, *qkv[1].y, *qkv[2].y,
  /// q_norm, ...). Backends may fuse RoPE and the cache write into the products instead (CUDA);
  /// q and k are then left rotated, or (as rope_kv_attention) raw, or (CUDA's split-K products of
  /// one Q8_0 token) q, k and v hold partial products: only the caches and out are results.
  /// Errors are bugs (SHOAL_CHECK), as in those two ops.
  virtual void qkv_attention(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv,
                             const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& pos,
                             const Tensor& inv_freq, const RopeSpec& spec, Tensor& k_cache, Tensor& v_cache,
                             const AttentionSpec& attn, Tensor& out);

  /// A gated FFN block: matmuls(in, norm, {glu}) then matmuls(*glu.y, {}, {down}). glu: the gate
  /// / up product (up and tmp set, no bias, no accumulate); its y (f32 [n, d_ff]) receives
  /// act(gate) * up, or is left unwritten by backends that hand it to the down product in
  /// another form (CUDA prefill). down: the down product into the residual stream (accumulate,
  /// tmp: f32 [n, d_model]). Errors are bugs (SHOAL_CHECK), as in matmuls().
  virtual void gated_ffn(const Tensor& in, const InputNorm& norm, const MatmulOut& glu, const MatmulOut& down);

  // ---- whole-step recording -------------------------------------------------------------------
  /// Runs `record` (a sequence of ops). A backend with graphs (CUDA) records it the first time a
  /// (`owner`, `key`) pair is seen and replays the recording afterwards; the ops must then depend
  /// on changing inputs only through tensor contents (ids, positions), never through host values.
  /// `owner` names whose buffers the recording uses (a Slice: Slice::graph_owner), so that two
  /// owners' steps never share a recording and drop_graphs(owner) can end them.
  virtual Status run_graph(uint64_t key, const std::function<void()>& record, uint64_t owner = 0) {
    (void)key;
    (void)owner;
    record();
    return Status::Ok();
  }
  /// Drops every recording (after buffers were reallocated).
  virtual void reset_graphs() {}
  /// Drops the recordings made under `owner`; call it before the buffers they use are freed
  /// (a recording replayed after that would read freed memory).
  virtual void drop_graphs(uint64_t owner) { (void)owner; }
  /// Says that the ops recorded next are a step of n_tokens tokens whose attention calls read at
  /// most `keys` cache rows (n tokens at position p: p + n), so a backend may plan attention for
  /// that length rather than for the whole cache (CUDA: one thread-block cluster per KV head for
  /// short contexts, more splits and a combine kernel for long ones); keys <= 0 withdraws the
  /// announcement (plans for the whole cache). Returns the class of plan chosen (0 by default,
  /// small integers): a recorded step holds its plans, so run_graph keys must include the class.
  /// Plans change speed only, never which keys are attended; a step that attends more keys than
  /// announced is still exact (under BackendOptions::half_prefill a CUDA step of 9-16 tokens may
  /// change between exact and one-part attention with its plan).
  virtual int plan_attention_keys(int64_t keys, int n_tokens) {
    (void)keys;
    (void)n_tokens;
    return 0;
  }

 protected:
  /// The publication of an eager backend's advance_decode (read by the default wait_decoded):
  /// ids[0..n) under the tag pos.
  void publish_decoded(int32_t pos, const int32_t* ids, int n);
  /// wait_decoded's argument errors (kInvalidArgument), for every backend's wait_decoded.
  static Status check_decoded_wait(int64_t pos, int n);

 private:
  struct Decoded {
    int64_t pos = -1;  // -1: nothing published
    int n = 0;
    std::array<int32_t, kDecodedMax> ids{};
  };
  std::array<Decoded, kDecodedSlots> decoded_{};
};

/// The index N of a CUDA device string "cuda" (0) or "cuda:N" (also "cuda:", 0, and leading
/// zeros); nullopt for other devices (cpu, cpu-ref) and for a malformed "cuda:..." (bad_cuda set).
std::optional<int> cuda_device_index(std::string_view device, bool* bad_cuda = nullptr);

/// Ok when `device` names a backend create_backend knows ("cpu", "cpu-ref", "cuda", "cuda:N"),
/// whether or not this machine has it; else kInvalidArgument naming the forms.
Status check_device_name(std::string_view device);

/// Creates a backend from a device string: "cpu", "cpu-ref" (the reference path), "cuda",
/// "cuda:N". Errors: kInvalidArgument (unknown device), kUnavailable (no CUDA in this build or no
/// such GPU).
Result<std::unique_ptr<Backend>> create_backend(std::string_view device, const BackendOptions& opts = {});

}  // namespace shoal
